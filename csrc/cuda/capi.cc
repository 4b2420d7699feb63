// A C ABI over codec_cuda.h for ctypes (torch_cgx/device/kernels.py): raw device pointers, a
// cudaStream_t passed as void*, plain integers. Built as the shared library cgx_cuda_capi
// (libcgx_cuda_capi.so, CMakeLists.txt; docs/gpu.md). Every function returns 0 on success and a
// nonzero code on failure, with the message in cgx_cuda_capi_last_error(); no C++ exception
// crosses this boundary. Only the cgx_cuda_* symbols are exported (capi.map).
#include <cstdint>
#include <exception>
#include <string>

#include "codec_cuda.h"
#include "core/error.h"
#include "levels_cuda.h"

namespace {

thread_local std::string g_error;

enum Status : int { kOk = 0, kInvalidArgument = 1, kCudaError = 2, kOther = 3 };

template <typename F>
int guarded(F&& f) {
  try {
    f();
    g_error.clear();
    return kOk;
  } catch (const cgx::InvalidArgument& e) {
    g_error = e.what();
    return kInvalidArgument;
  } catch (const cgx::cuda::CudaError& e) {
    g_error = e.what();
    return kCudaError;
  } catch (const std::exception& e) {
    g_error = e.what();
    return kOther;
  } catch (...) {
    g_error = "unknown C++ exception";
    return kOther;
  }
}

cgx::CodecParams params_of(int bits, int64_t bucket_size, int raw_tail, int stochastic,
                           uint64_t seed, uint64_t stream) {
  cgx::CodecParams p;
  p.bits = bits;
  p.bucket_size = bucket_size;
  p.skip_incomplete_buckets = raw_tail != 0;
  p.rounding = stochastic ? cgx::Rounding::kStochastic : cgx::Rounding::kNearest;
  p.seed = seed;
  p.stream = stream;
  return p;
}

cgx::DType dtype_of(int code) {
  CGX_CHECK_ARG(code >= 0 && code < cgx::kNumDTypes, "dtype code ", code, " is unknown");
  return cgx::DType(uint8_t(code));
}

}  // namespace

extern "C" {

// Bumped whenever a signature below changes; kernels.py refuses another version.
__attribute__((visibility("default"))) int cgx_cuda_capi_version() { return 2; }

__attribute__((visibility("default"))) const char* cgx_cuda_capi_last_error() {
  return g_error.c_str();
}

__attribute__((visibility("default"))) int cgx_cuda_capi_available() {
  return cgx::cuda::available() ? 1 : 0;
}

// cgx::cuda::encode: `count` values of `dtype` (0 fp32, 1 fp16, 2 bf16) at `in` into the
// `out_size` bytes at `out`, enqueued on `stream` (a cudaStream_t; null: the legacy stream).
__attribute__((visibility("default"))) int cgx_cuda_capi_maxmin_encode(
    const void* in, int dtype, int64_t count, int bits, int64_t bucket_size, int raw_tail,
    int stochastic, uint64_t seed, uint64_t stream_id, void* out, uint64_t out_size, void* stream) {
  return guarded([&] {
    cgx::cuda::encode(in, dtype_of(dtype), count,
                      params_of(bits, bucket_size, raw_tail, stochastic, seed, stream_id),
                      static_cast<uint8_t*>(out), size_t(out_size),
                      static_cast<cudaStream_t>(stream));
  });
}

// cgx::cuda::decode / decode_add with the expected header of a payload encoded from `count`
// values of `dtype` with these parameters: asynchronous, the header compared on the device
// (mismatches OR'ed into *error_flag, a device uint32_t, which may be null).
__attribute__((visibility("default"))) int cgx_cuda_capi_maxmin_decode(
    const void* payload, uint64_t size, void* out, int out_dtype, int64_t count, int dtype,
    int bits, int64_t bucket_size, int raw_tail, int add, uint32_t* error_flag, void* stream) {
  return guarded([&] {
    const cgx::PayloadInfo expected = cgx::cuda::payload_info(
        dtype_of(dtype), count, params_of(bits, bucket_size, raw_tail, 0, 0, 0));
    const auto* p = static_cast<const uint8_t*>(payload);
    auto s = static_cast<cudaStream_t>(stream);
    if (add) {
      cgx::cuda::decode_add(p, size_t(size), out, dtype_of(out_dtype), count, expected, error_flag,
                            s);
    } else {
      cgx::cuda::decode(p, size_t(size), out, dtype_of(out_dtype), count, expected, error_flag, s);
    }
  });
}

// cgx::cuda::levels_encode (kind: 0 qsgd, 1 terngrad, 2 onebit, 3 efsignsgd, 4 signsgd, 5 signum,
// 6 tbq; bits, clip (tbq: tau) and bucket_size as the compressors' parameters): `count` values of
// `dtype` at `in` into the `out_size` bytes at `out`.
__attribute__((visibility("default"))) int cgx_cuda_capi_levels_encode(
    const void* in, int dtype, int64_t count, int kind, int bits, float clip, int64_t bucket_size,
    uint64_t seed, uint64_t stream_id, void* out, uint64_t out_size, void* stream) {
  return guarded([&] {
    cgx::cuda::levels_encode(in, dtype_of(dtype), count, {kind, bits, clip, bucket_size}, seed,
                             stream_id, static_cast<uint8_t*>(out), size_t(out_size),
                             static_cast<cudaStream_t>(stream));
  });
}

// cgx::cuda::levels_decode with add = 1: out += the payload's values (the caller checked its
// envelope; the layout comes from the parameters).
__attribute__((visibility("default"))) int cgx_cuda_capi_levels_decode_add(
    const void* payload, uint64_t size, void* out, int out_dtype, int64_t count, int kind, int bits,
    float clip, int64_t bucket_size, void* stream) {
  return guarded([&] {
    cgx::cuda::levels_decode(static_cast<const uint8_t*>(payload), size_t(size), out,
                             dtype_of(out_dtype), count, {kind, bits, clip, bucket_size}, true,
                             static_cast<cudaStream_t>(stream));
  });
}

}  // extern "C"
