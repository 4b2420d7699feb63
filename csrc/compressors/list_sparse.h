// Sparsifying compressors (top-k, random-k, threshold, DGC, GradDrop): one line each, ids 20-29.
