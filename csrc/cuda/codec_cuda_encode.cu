// CUDA encode kernels of the max-min codec and their launcher (codec_cuda.h's encode). The
// per-element and per-bucket arithmetic lives in codec_device.h; layout and grid design:
// docs/gpu.md.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <string>

#include "codec_cuda.h"
#include "codec_cuda_launch.h"
#include "codec_device.h"
#include "core/codec_layout.h"
#include "core/error.h"
#include "core/rng.h"

namespace cgx::cuda {
namespace {

using namespace detail;  // this file's own launch support

// ---- block-level helpers --------------------------------------------------------------------

__device__ __forceinline__ dev::MinMax warp_reduce(dev::MinMax r) {
  for (int o = 16; o > 0; o >>= 1) {
    dev::MinMax other;
    other.mn = __shfl_xor_sync(0xffffffffu, r.mn, o);
    other.mx = __shfl_xor_sync(0xffffffffu, r.mx, o);
    other.finite = __shfl_xor_sync(0xffffffffu, r.finite, o);
    r = dev::minmax_merge(r, other);
  }
  return r;  // in every lane
}

// Min / max / finiteness over the block; the result is valid in thread 0. `scratch` holds
// kWarps entries; the call begins and ends with a barrier, so it may be called in a loop.
__device__ dev::MinMax block_reduce(dev::MinMax r, dev::MinMax* scratch) {
  r = warp_reduce(r);
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  __syncthreads();
  if (lane == 0) scratch[warp] = r;
  __syncthreads();
  if (warp == 0) {
    r = lane < kWarps ? scratch[lane] : dev::minmax_init();
    r = warp_reduce(r);
  }
  __syncthreads();
  return r;
}

// Constant indices only: indexing the kernel parameter by thread would copy it to local memory.
__device__ __forceinline__ void write_header(uint8_t* out, const dev::Header& h) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    CGX_UNROLL
    for (int k = 0; k < 24; ++k) out[k] = h.bytes[k];
  }
}

// Bucket parameters from its range: kept in shared memory for quantization, metadata written.
__device__ __forceinline__ void finish_bucket(const dev::MinMax& r, int levels,
                                              dev::BucketQuant* slot, uint8_t* meta,
                                              int64_t bucket) {
  const dev::BucketQuant s = dev::bucket_quant(r, levels);
  *slot = s;
  dev::store_u32(meta + 8 * bucket, dev::as_u32(s.mn));
  dev::store_u32(meta + 8 * bucket + 4, dev::as_u32(s.unit));
}

// Block-cooperative copy of n bytes from shared memory to global memory at any alignment:
// 4-byte stores for the aligned middle.
__device__ void copy_out(uint8_t* dst, const uint8_t* src, int n) {
  const int head = min(n, int((4u - (reinterpret_cast<uintptr_t>(dst) & 3u)) & 3u));
  if (int(threadIdx.x) < head) dst[threadIdx.x] = src[threadIdx.x];
  const int words = (n - head) / 4;
  uint32_t* dw = reinterpret_cast<uint32_t*>(dst + head);
  const uint8_t* s = src + head;
  for (int w = int(threadIdx.x); w < words; w += kThreads) {
    dw[w] = uint32_t(s[4 * w]) | uint32_t(s[4 * w + 1]) << 8 | uint32_t(s[4 * w + 2]) << 16 |
            uint32_t(s[4 * w + 3]) << 24;
  }
  for (int i = head + 4 * words + int(threadIdx.x); i < n; i += kThreads) dst[i] = src[i];
}

// Elements [0, cnt) of p as fp32 (cnt <= 8); one or two 16-byte loads when p is 16-byte aligned
// and cnt == 8.
template <DType D>
__device__ __forceinline__ void load8(const typename dev::ElemIO<D>::Raw* __restrict__ p, int cnt,
                                      float* v) {
  using IO = dev::ElemIO<D>;
  using Raw = typename IO::Raw;
  if (cnt == 8 && (reinterpret_cast<uintptr_t>(p) & 15u) == 0) {
    constexpr int kVecs = int(8 * sizeof(Raw) / 16);
    Raw r[8];
    for (int k = 0; k < kVecs; ++k) {
      const uint4 u = __ldg(reinterpret_cast<const uint4*>(p) + k);
      memcpy(reinterpret_cast<uint8_t*>(r) + 16 * k, &u, 16);
    }
    CGX_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = IO::to_float(r[j]);
  } else {
    CGX_UNROLL
    for (int j = 0; j < 8; ++j) v[j] = j < cnt ? IO::to_float(p[j]) : 0.0f;
  }
}

// ---- encode ---------------------------------------------------------------------------------

struct EncodeGeom {
  dev::Header header;
  int64_t quantized;  // nq
  int64_t bucket_size;
  int64_t tile;  // elements per tile (dev::plan_tiles)
  int bits;
  bool stochastic;
  dev::Key key;
  uint8_t* out;    // payload
  uint8_t* meta;   // out + meta_offset
  uint8_t* codes;  // out + codes_offset
};

// Staged tiles (bucket chunks of at most kTileElems elements): one tile per block iteration.
// (1) the tile is loaded once, converted to fp32, into shared memory (16-byte loads when
// aligned); (2) bucket ranges: one thread per bucket for buckets of <= 32 elements, else one warp
// per bucket with shuffles; the bucket parameters go to shared memory and the metadata to the
// payload; (3) one thread per group of 8 elements quantizes and packs its codes (b bytes) into
// shared memory; (4) the block copies the tile's code bytes out.
template <DType D>
__global__ void __launch_bounds__(kThreads)
    encode_staged(const typename dev::ElemIO<D>::Raw* __restrict__ x, EncodeGeom g) {
  using IO = dev::ElemIO<D>;
  using Raw = typename IO::Raw;
  __shared__ __align__(16) float xs[dev::kTileElems];
  __shared__ dev::BucketQuant stats[dev::kTileBuckets];
  __shared__ __align__(16) uint8_t packed[dev::kTileElems];  // tile * bits / 8 <= kTileElems

  write_header(g.out, g.header);
  const int levels = (1 << g.bits) - 1;
  const int bucket = int(g.bucket_size);  // <= kTileElems when staged
  const int warp = int(threadIdx.x) / 32;
  const int lane = int(threadIdx.x) % 32;
  for (int64_t t0 = int64_t(blockIdx.x) * g.tile; t0 < g.quantized;
       t0 += int64_t(gridDim.x) * g.tile) {
    const int m = int(min64(g.tile, g.quantized - t0));
    const Raw* xt = x + t0;

    // (1) load
    int loaded = 0;
    if ((reinterpret_cast<uintptr_t>(xt) & 15u) == 0) {
      constexpr int kPerVec = int(16 / sizeof(Raw));
      const int vecs = m / kPerVec;
      for (int v = int(threadIdx.x); v < vecs; v += kThreads) {
        const uint4 u = __ldg(reinterpret_cast<const uint4*>(xt) + v);
        Raw r[kPerVec];
        memcpy(r, &u, 16);
        CGX_UNROLL
        for (int j = 0; j < kPerVec; ++j) xs[v * kPerVec + j] = IO::to_float(r[j]);
      }
      loaded = vecs * kPerVec;
    }
    for (int i = loaded + int(threadIdx.x); i < m; i += kThreads) xs[i] = IO::to_float(xt[i]);
    __syncthreads();

    // (2) bucket parameters
    const int nbk = (m + bucket - 1) / bucket;
    const int64_t first_bucket = t0 / g.bucket_size;
    if (bucket <= 32) {
      for (int k = int(threadIdx.x); k < nbk; k += kThreads) {
        const int e = min((k + 1) * bucket, m);
        dev::MinMax r = dev::minmax_init();
        for (int i = k * bucket; i < e; ++i) dev::minmax_add(r, xs[i]);
        finish_bucket(r, levels, &stats[k], g.meta, first_bucket + k);
      }
    } else {
      for (int k = warp; k < nbk; k += kWarps) {  // warp-uniform loop
        const int e = min((k + 1) * bucket, m);
        dev::MinMax r = dev::minmax_init();
        for (int i = k * bucket + lane; i < e; i += 32) dev::minmax_add(r, xs[i]);
        r = warp_reduce(r);
        if (lane == 0) finish_bucket(r, levels, &stats[k], g.meta, first_bucket + k);
      }
    }
    __syncthreads();

    // (3) quantize and pack, one group of 8 elements per thread
    const int groups = (m + 7) / 8;
    for (int gi = int(threadIdx.x); gi < groups; gi += kThreads) {
      const int cnt = min(8, m - 8 * gi);
      const uint64_t w = dev::quantize_pack8(xs + 8 * gi, cnt, 8 * gi, stats, g.bucket_size, g.bits,
                                             g.stochastic, g.key, uint64_t(t0 + 8 * gi));
      for (int b = 0; b < g.bits; ++b) packed[gi * g.bits + b] = uint8_t(w >> (8 * b));
    }
    __syncthreads();

    // (4) code bytes out; t0 is a multiple of 8, so the tile's codes start at byte t0 / 8 * bits
    copy_out(g.codes + (t0 / 8) * g.bits, packed, (m * g.bits + 7) / 8);
    __syncthreads();  // xs, stats and packed are reused by the next tile
  }
}

// Large chunks (lcm(bucket_size, 8) > kTileElems): one chunk of at most 8 buckets per block
// iteration, read from global memory twice: block reductions give each bucket's parameters, then
// one thread per group of 8 elements quantizes, packs and stores its b code bytes.
template <DType D>
__global__ void __launch_bounds__(kThreads)
    encode_chunked(const typename dev::ElemIO<D>::Raw* __restrict__ x, EncodeGeom g) {
  using IO = dev::ElemIO<D>;
  __shared__ dev::BucketQuant stats[8];
  __shared__ dev::MinMax scratch[kWarps];

  write_header(g.out, g.header);
  const int levels = (1 << g.bits) - 1;
  for (int64_t c0 = int64_t(blockIdx.x) * g.tile; c0 < g.quantized;
       c0 += int64_t(gridDim.x) * g.tile) {
    const int64_t m = min64(g.tile, g.quantized - c0);
    const int nbk = int((m + g.bucket_size - 1) / g.bucket_size);  // <= 8
    const int64_t first_bucket = c0 / g.bucket_size;
    for (int k = 0; k < nbk; ++k) {
      const int64_t e = min64((k + 1) * g.bucket_size, m);
      dev::MinMax r = dev::minmax_init();
      for (int64_t i = k * g.bucket_size + threadIdx.x; i < e; i += kThreads) {
        dev::minmax_add(r, IO::to_float(x[c0 + i]));
      }
      r = block_reduce(r, scratch);
      if (threadIdx.x == 0) finish_bucket(r, levels, &stats[k], g.meta, first_bucket + k);
    }
    __syncthreads();

    const int64_t groups = (m + 7) / 8;
    uint8_t* codes = g.codes + (c0 / 8) * g.bits;
    for (int64_t gi = threadIdx.x; gi < groups; gi += kThreads) {
      const int cnt = int(min64(8, m - 8 * gi));
      float v[8];
      load8<D>(x + c0 + 8 * gi, cnt, v);
      const uint64_t w = dev::quantize_pack8(v, cnt, 8 * gi, stats, g.bucket_size, g.bits,
                                             g.stochastic, g.key, uint64_t(c0 + 8 * gi));
      const int nbytes = cnt == 8 ? g.bits : (cnt * g.bits + 7) / 8;
      uint8_t* dst = codes + gi * g.bits;
      for (int b = 0; b < nbytes; ++b) dst[b] = uint8_t(w >> (8 * b));
    }
    __syncthreads();  // stats are reused by the next chunk
  }
}

template <DType D>
void launch_encode(const void* in, const EncodeGeom& g, const dev::TilePlan& plan,
                   cudaStream_t stream) {
  using Raw = typename dev::ElemIO<D>::Raw;
  const Raw* x = static_cast<const Raw*>(in);
  const int blocks = blocks_for(g.quantized, plan.tile);  // at least 1: block 0 writes the header
  if (plan.staged) {
    encode_staged<D><<<blocks, kThreads, 0, stream>>>(x, g);
  } else {
    encode_chunked<D><<<blocks, kThreads, 0, stream>>>(x, g);
  }
  check_cuda(cudaGetLastError(), "encode kernel launch");
}

}  // namespace

void encode(const void* in, DType dtype, int64_t count, const CodecParams& params, uint8_t* out,
            size_t out_size, cudaStream_t stream) {
  guarded([&] {
    check_dtype(dtype, "input");
    const size_t need = encoded_size(count, dtype, params);  // validates params and count
    CGX_CHECK_ARG(out_size == need, "encode needs an output of exactly ", need, " bytes, got ",
                  out_size);
    CGX_CHECK_ARG(in != nullptr || count == 0, "input buffer is null");
    CGX_CHECK_ARG(out != nullptr, "output buffer is null");
    CGX_CHECK_ARG(!params.clip, "the CUDA codec has no clipped range (clip): encode on the CPU");
    const bool stochastic = params.rounding == Rounding::kStochastic;
    const Layout l =
        make_layout(count, dtype, params.bits, params.bucket_size, params.skip_incomplete_buckets);
    const RngKey key = rng_key(params.seed, params.stream);
    EncodeGeom g;
    g.header = dev::make_header(dtype, params.bits, params.bucket_size,
                                params.skip_incomplete_buckets, stochastic, count);
    g.quantized = l.quantized;
    g.bucket_size = params.bucket_size;
    const dev::TilePlan plan = dev::plan_tiles(params.bucket_size);
    g.tile = plan.tile;
    g.bits = params.bits;
    g.stochastic = stochastic;
    g.key = dev::Key{key.k0, key.k1};
    g.out = out;
    g.meta = out + l.meta_offset;
    g.codes = out + l.codes_offset;
    switch (dtype) {
      case DType::kFloat32:
        launch_encode<DType::kFloat32>(in, g, plan, stream);
        break;
      case DType::kFloat16:
        launch_encode<DType::kFloat16>(in, g, plan, stream);
        break;
      case DType::kBFloat16:
        launch_encode<DType::kBFloat16>(in, g, plan, stream);
        break;
    }
    const size_t tail_bytes = size_t(count - l.quantized) * elem_size(dtype);
    if (tail_bytes > 0) {
      check_cuda(
          cudaMemcpyAsync(out + l.tail_offset,
                          static_cast<const uint8_t*>(in) + size_t(l.quantized) * elem_size(dtype),
                          tail_bytes, cudaMemcpyDefault, stream),
          "raw tail copy");
    }
  });
}

}  // namespace cgx::cuda
