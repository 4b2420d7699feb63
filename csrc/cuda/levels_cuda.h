// The level quantizers qsgd, terngrad and tbq and the sign compressors onebit, efsignsgd, signsgd
// and signum (csrc/compressors/{qsgd,terngrad,tbq,onebit,efsignsgd,signsgd}.cc) on CUDA devices:
// the native compressors' payloads byte for byte (docs/FORMAT.md, "Compressor payloads"), from
// fused kernels (levels_cuda.cu: one pass for the bucket scalars and the envelope, or a one-thread
// envelope kernel for the kinds without scalars; one pass for the packed codes; one pass to
// decode) on raw device pointers in a caller's stream. Torch-free;
// the numerics are levels_device.h's, verified on the host by levels_cuda_logic_test.cc.
//
// Every call only enqueues work on `stream`. Bad arguments throw cgx::InvalidArgument before
// anything is enqueued; a failing CUDA call throws cgx::cuda::CudaError.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "core/dtype.h"

namespace cgx::cuda {

// Which compressor: kind 0 qsgd (bits 2..8), 1 terngrad (2-bit codes, clip >= 0), 2 onebit,
// 3 efsignsgd (1-bit codes; bits and clip ignored); without bucket scalars (bucket_size ignored,
// non-finite input sets the envelope's flag bit 0): 4 signsgd, 5 signum (1-bit codes), 6 tbq
// (2-bit codes, `clip` is tau, in [1e-30, 1e30]).
struct LevelsConfig {
  int kind = 0;
  int bits = 4;
  float clip = 0.0f;
  int64_t bucket_size = 512;  // 0: the whole tensor is one bucket
};

// The payload size of `count` values: 32 + 4 scalars nb + packed(count, bits).
size_t levels_encoded_size(const LevelsConfig& c, int64_t count);

// Encodes `count` values of `dtype` at `in` into the `out_size` bytes at `out` (4-byte aligned;
// exactly levels_encoded_size), the uniforms keyed by (seed, stream_id) as EncodeContext's.
void levels_encode(const void* in, DType dtype, int64_t count, const LevelsConfig& c, uint64_t seed,
                   uint64_t stream_id, uint8_t* out, size_t out_size, cudaStream_t stream);

// out (+)= the values of a payload of `count` values encoded with `c` (the caller has checked
// its envelope; size must be levels_encoded_size). Code 3 of terngrad decodes to NaN.
void levels_decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                   const LevelsConfig& c, bool add, cudaStream_t stream);

}  // namespace cgx::cuda
