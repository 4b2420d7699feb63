// Fused kernels of the level quantizers and the sign compressors (levels_cuda.h): every number is
// computed by levels_device.h's functions, in the decomposition levels_cuda_logic_test.cc replays
// on the host. Deterministic: the only reduction of numbers (the bucket sums) runs in prim::stats'
// lane order; the one atomic is an OR of the non-finite flag (signsgd, signum, tbq), whose result
// does not depend on the order.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "codec_cuda_launch.h"
#include "core/error.h"
#include "levels_cuda.h"
#include "levels_device.h"

namespace cgx::cuda {
namespace {

using detail::blocks_for;
using detail::check_cuda;
using detail::kThreads;

__device__ __forceinline__ lv::Lane shfl_lane(const lv::Lane& l, int offset) {
  lv::Lane r;
  r.sum = __shfl_xor_sync(0xffffffffu, l.sum, offset);
  r.abs = __shfl_xor_sync(0xffffffffu, l.abs, offset);
  r.sq = __shfl_xor_sync(0xffffffffu, l.sq, offset);
  r.neg = __shfl_xor_sync(0xffffffffu, static_cast<long long>(l.neg), offset);
  r.mn = __shfl_xor_sync(0xffffffffu, l.mn, offset);
  r.mx = __shfl_xor_sync(0xffffffffu, l.mx, offset);
  r.nan = __shfl_xor_sync(0xffffffffu, l.nan, offset);
  return r;
}

// Eight threads per bucket (thread j of the group: lane j), the lanes then combined by an xor
// butterfly (offsets 1, 2, 4); lane 0 stores the scalar. Block 0's thread 0 writes the envelope.
// Every thread of a warp runs the same number of rounds (the shuffles need the whole warp).
template <DType D>
__global__ void scalars_kernel(const typename dev::ElemIO<D>::Raw* x, lv::Params p, int dtype_code,
                               uint32_t param0, uint8_t* out) {
  using IO = dev::ElemIO<D>;
  if (blockIdx.x == 0 && threadIdx.x == 0) lv::write_envelope(p, dtype_code, param0, out);
  const int64_t work = p.buckets * lv::kLanes;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t rounds_end = (work + stride - 1) / stride * stride;
  for (int64_t w = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; w < rounds_end; w += stride) {
    const int64_t b = w / lv::kLanes;
    const int j = int(w % lv::kLanes);
    lv::Lane l = lv::lane_init();
    int64_t length = 0;
    if (b < p.buckets) {
      const int64_t lo = b * p.bucket;
      const int64_t hi = lo + p.bucket < p.count ? lo + p.bucket : p.count;
      length = hi - lo;
      for (int64_t i = lo + j; i < hi; i += lv::kLanes) lv::lane_add(l, IO::to_float(x[i]));
    }
    for (int offset = 1; offset < lv::kLanes; offset <<= 1) {
      l = lv::lane_merge(l, shfl_lane(l, offset));
    }
    if (b < p.buckets && j == 0) {
      const lv::Scalars v = lv::bucket_scalars(p, l, length);
      uint8_t* at = out + 32 + 4 * p.scalars * b;
      dev::store_u32(at, lv::as_u32(v.s0));
      if (p.scalars == 2) dev::store_u32(at + 4, lv::as_u32(v.s1));
    }
  }
}

// The envelope alone (the kinds without bucket scalars), before the codes kernel ORs the flag.
__global__ void envelope_kernel(lv::Params p, int dtype_code, uint8_t* out) {
  lv::write_envelope(p, dtype_code, 0u, out);
}

// One thread per group of eight codes (`bits` bytes of the stream), reading the scalars the
// previous kernel stored in the payload; a thread that saw NaN or Inf ORs the flag into the
// envelope (the kinds without bucket scalars; `out` 4-byte aligned).
template <DType D>
__global__ void codes_kernel(const typename dev::ElemIO<D>::Raw* x, lv::Params p, uint8_t* out) {
  using IO = dev::ElemIO<D>;
  const uint8_t* scalars = out + 32;
  uint8_t* codes = out + 32 + p.codes_offset;
  const int64_t groups = (p.count + 7) / 8;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  bool nonfinite = false;
  for (int64_t g = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; g < groups; g += stride) {
    const uint64_t word =
        lv::group_codes(p, scalars, g, [&](int64_t i) { return IO::to_float(x[i]); }, nonfinite);
    const int nbytes = lv::group_bytes(p, g);
    for (int k = 0; k < nbytes; ++k) codes[g * p.bits + k] = uint8_t(word >> (8 * k));
  }
  if (nonfinite && !lv::has_buckets(p.kind)) {
    atomicOr(reinterpret_cast<unsigned int*>(out + 4), lv::kNonFiniteWord);
  }
}

template <DType D, bool kAdd>
__global__ void decode_kernel(const uint8_t* payload, lv::Params p,
                              typename dev::ElemIO<D>::Raw* out) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < p.count; i += stride) {
    lv::put<D>(out, i, lv::element_value(p, payload, i), kAdd);
  }
}

lv::Params checked_params(const LevelsConfig& c, int64_t count, uint64_t seed, uint64_t stream) {
  CGX_CHECK_ARG(c.kind >= 0 && c.kind <= 6,
                "levels kind must be 0 (qsgd), 1 (terngrad), 2 (onebit), 3 (efsignsgd), "
                "4 (signsgd), 5 (signum) or 6 (tbq), got ",
                c.kind);
  CGX_CHECK_ARG(c.kind != 0 || (c.bits >= 2 && c.bits <= 8), "qsgd bits must be in [2, 8], got ",
                c.bits);
  CGX_CHECK_ARG(c.kind != 1 || (std::isfinite(c.clip) && c.clip >= 0),
                "terngrad clip must be finite and >= 0, got ", c.clip);
  CGX_CHECK_ARG(c.kind != 6 || (c.clip >= 1e-30f && c.clip <= 1e30f),
                "tbq tau must be in [1e-30, 1e30], got ", c.clip);
  CGX_CHECK_ARG(c.bucket_size >= 0 && c.bucket_size <= int64_t(4294967295u),
                "bucket_size must be in [0, 2^32 - 1], got ", c.bucket_size);
  CGX_CHECK_ARG(count >= 0 && count <= (int64_t(1) << 48), "count must be in [0, 2^48], got ",
                count);
  return lv::make_params(c.kind, c.bits, c.clip, count, c.bucket_size, seed, stream);
}

template <typename F>
void by_dtype(DType d, F&& f) {
  switch (d) {
    case DType::kFloat32:
      return f(std::integral_constant<DType, DType::kFloat32>{});
    case DType::kFloat16:
      return f(std::integral_constant<DType, DType::kFloat16>{});
    case DType::kBFloat16:
      return f(std::integral_constant<DType, DType::kBFloat16>{});
  }
  CGX_CHECK_ARG(false, "dtype code ", int(uint8_t(d)), " is unknown");
}

}  // namespace

size_t levels_encoded_size(const LevelsConfig& c, int64_t count) {
  return 32 + size_t(checked_params(c, count, 0, 0).body);
}

void levels_encode(const void* in, DType dtype, int64_t count, const LevelsConfig& c, uint64_t seed,
                   uint64_t stream_id, uint8_t* out, size_t out_size, cudaStream_t stream) {
  detail::check_dtype(dtype, "levels_encode:");
  const lv::Params p = checked_params(c, count, seed, stream_id);
  CGX_CHECK_ARG(out_size == 32 + p.body, "levels_encode: out has ", out_size, " bytes, need ",
                32 + p.body);
  CGX_CHECK_ARG(out != nullptr && (in != nullptr || count == 0), "levels_encode: null pointer");
  CGX_CHECK_ARG(reinterpret_cast<uintptr_t>(out) % 4 == 0,
                "levels_encode: out must be 4-byte aligned");
  by_dtype(dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using Raw = typename dev::ElemIO<D>::Raw;
    const Raw* x = static_cast<const Raw*>(in);
    if (lv::has_buckets(p.kind)) {
      const int blocks = blocks_for(p.buckets * lv::kLanes, kThreads);  // >= 1: the envelope
      scalars_kernel<D><<<blocks, kThreads, 0, stream>>>(x, p, int(uint8_t(dtype)),
                                                         uint32_t(c.bucket_size), out);
      check_cuda(cudaGetLastError(), "levels scalars kernel launch");
    } else {
      envelope_kernel<<<1, 1, 0, stream>>>(p, int(uint8_t(dtype)), out);
      check_cuda(cudaGetLastError(), "levels envelope kernel launch");
    }
    if (count == 0) return;
    codes_kernel<D><<<blocks_for((count + 7) / 8, kThreads), kThreads, 0, stream>>>(x, p, out);
    check_cuda(cudaGetLastError(), "levels codes kernel launch");
  });
}

void levels_decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                   const LevelsConfig& c, bool add, cudaStream_t stream) {
  detail::check_dtype(out_dtype, "levels_decode:");
  const lv::Params p = checked_params(c, count, 0, 0);
  CGX_CHECK_ARG(size == 32 + p.body, "levels_decode: payload has ", size, " bytes, need ",
                32 + p.body);
  if (count == 0) return;
  CGX_CHECK_ARG(payload != nullptr && out != nullptr, "levels_decode: null pointer");
  by_dtype(out_dtype, [&](auto tag) {
    constexpr DType D = decltype(tag)::value;
    using Raw = typename dev::ElemIO<D>::Raw;
    Raw* o = static_cast<Raw*>(out);
    const int blocks = blocks_for(count, kThreads);
    if (add) {
      decode_kernel<D, true><<<blocks, kThreads, 0, stream>>>(payload, p, o);
    } else {
      decode_kernel<D, false><<<blocks, kThreads, 0, stream>>>(payload, p, o);
    }
    check_cuda(cudaGetLastError(), "levels decode kernel launch");
  });
}

}  // namespace cgx::cuda
