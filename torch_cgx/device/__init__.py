"""The GPU data plane: compressors and allreduce algorithms written in tensor operations.

Everything here runs on the device the tensors live on (CUDA tensors stay on the GPU) and, by the
same code, on CPU tensors, which is how this project's CPU-only test suite executes it
(docs/gpu.md). ``codecs``: every registered compressor; importing this package loads nothing else.
"""
