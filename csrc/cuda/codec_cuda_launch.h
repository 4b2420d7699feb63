// Internal to the CUDA codec (codec_cuda.cu: decode and the public API; codec_cuda_encode.cu:
// encode): launch parameters, error plumbing and the device helper both kernels use.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "codec_cuda.h"
#include "core/dtype.h"
#include "core/error.h"

namespace cgx::cuda::detail {

constexpr int kThreads = 256;  // threads per block, all kernels
constexpr int kWarps = kThreads / 32;
constexpr int64_t kMaxBlocks = int64_t(1) << 20;  // grid-stride loops beyond this
inline int64_t g_max_blocks = kMaxBlocks;         // set_max_blocks()

inline thread_local std::string g_last_error;  // last_error()

inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw CudaError(std::string("torch_cgx CUDA codec: ") + what + ": " + cudaGetErrorName(e) +
                    ": " + cudaGetErrorString(e));
  }
}

template <typename F>
void guarded(F&& f) {
  try {
    f();
  } catch (const std::exception& e) {
    g_last_error = e.what();
    throw;
  }
}

inline int blocks_for(int64_t work_items, int64_t per_block) {
  const int64_t b = (work_items + per_block - 1) / per_block;
  return int(std::clamp<int64_t>(b, 1, g_max_blocks));
}

inline void check_dtype(DType d, const char* what) {
  CGX_CHECK_ARG(uint8_t(d) < kNumDTypes, what, " dtype code ", int(uint8_t(d)), " is unknown");
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

}  // namespace cgx::cuda::detail
