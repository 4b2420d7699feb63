// Sparsifying compressors (top-k, random-k, threshold, DGC, GradDrop, SparseLoCo-style top-k
// with quantized values): one line each, ids 20-29.
CGX_COMPRESSOR(topk, 20)
CGX_COMPRESSOR(randomk, 21)
CGX_COMPRESSOR(threshold, 22)
CGX_COMPRESSOR(dgc, 23)
CGX_COMPRESSOR(graddrop, 24)
CGX_COMPRESSOR(sparseloco, 25)
