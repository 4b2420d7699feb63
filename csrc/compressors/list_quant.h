// Dense quantizers beyond max-min and sign (onebit, EF-signSGD, TernGrad, QSGD, TBQ): ids 10-19.
CGX_COMPRESSOR(onebit, 10)
CGX_COMPRESSOR(efsignsgd, 11)
CGX_COMPRESSOR(terngrad, 12)
CGX_COMPRESSOR(qsgd, 13)
CGX_COMPRESSOR(tbq, 14)
