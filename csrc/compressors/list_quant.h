// Dense quantizers beyond max-min and sign (onebit, EF-signSGD, TernGrad, QSGD, TBQ): ids 10-19.
