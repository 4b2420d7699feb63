// Bits of the CUDA decoder's error flag: one per payload header field that differs from the
// header the caller expected (codec_cuda.h's asynchronous decode). Shared by the host API and
// the device code.
#pragma once

#include <cstdint>

namespace cgx::cuda {

enum HeaderError : uint32_t {
  kErrMagic = 1u << 0,
  kErrVersion = 1u << 1,
  kErrDType = 1u << 2,
  kErrBits = 1u << 3,
  kErrFlags = 1u << 4,
  kErrBucketSize = 1u << 5,
  kErrReserved = 1u << 6,
  kErrCount = 1u << 7,
};

}  // namespace cgx::cuda
