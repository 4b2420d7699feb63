// CUDA decode kernels of the max-min codec, their launchers and the rest of codec_cuda.h (the
// encode kernels: codec_cuda_encode.cu). The per-element and per-bucket arithmetic lives in
// codec_device.h, shared with a host test; this file holds the parallel decomposition. Layout
// and grid design: docs/gpu.md.
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

// out[j] = v[j] (or out[j] + v[j] in fp32), rounded to out's dtype, for j < cnt.
template <DType D, bool kAdd>
__device__ __forceinline__ void store8(typename dev::ElemIO<D>::Raw* out, int cnt, const float* v) {
  using IO = dev::ElemIO<D>;
  using Raw = typename IO::Raw;
  if (cnt == 8 && (reinterpret_cast<uintptr_t>(out) & 15u) == 0) {
    constexpr int kVecs = int(8 * sizeof(Raw) / 16);
    Raw r[8];
    if (kAdd) {
      for (int k = 0; k < kVecs; ++k) {
        const uint4 u = reinterpret_cast<const uint4*>(out)[k];
        memcpy(reinterpret_cast<uint8_t*>(r) + 16 * k, &u, 16);
      }
      CGX_UNROLL
      for (int j = 0; j < 8; ++j) r[j] = IO::from_float(dev::fadd(IO::to_float(r[j]), v[j]));
    } else {
      CGX_UNROLL
      for (int j = 0; j < 8; ++j) r[j] = IO::from_float(v[j]);
    }
    for (int k = 0; k < kVecs; ++k) {
      uint4 u;
      memcpy(&u, reinterpret_cast<const uint8_t*>(r) + 16 * k, 16);
      reinterpret_cast<uint4*>(out)[k] = u;
    }
  } else {
    CGX_UNROLL
    for (int j = 0; j < 8; ++j) {
      if (j < cnt) out[j] = IO::from_float(kAdd ? dev::fadd(IO::to_float(out[j]), v[j]) : v[j]);
    }
  }
}

// ---- decode ---------------------------------------------------------------------------------

struct DecodeGeom {
  dev::Header expect;
  int64_t count;  // n
  int64_t quantized;
  int64_t bucket_size;
  int bits;
  DType tail_dtype;
  const uint8_t* payload;
  const uint8_t* meta;
  const uint8_t* codes;
  const uint8_t* tail;
  uint32_t* error_flag;
};

// One work item per group of 8 quantized elements (b code bytes in, 8 values out), then one per
// raw-tail element; grid-stride. Every block first checks the payload header against the
// expected one and writes nothing if it differs.
template <DType D, bool kAdd>
__global__ void __launch_bounds__(kThreads)
    decode_kernel(DecodeGeom g, typename dev::ElemIO<D>::Raw* __restrict__ out) {
  using IO = dev::ElemIO<D>;
  __shared__ uint32_t bad;
  if (threadIdx.x == 0) {
    bad = dev::header_mismatch(g.payload, g.expect);
    if (bad != 0 && blockIdx.x == 0 && g.error_flag != nullptr) atomicOr(g.error_flag, bad);
  }
  __syncthreads();
  if (bad != 0) return;

  const int64_t groups = (g.quantized + 7) / 8;
  const int64_t total = groups + (g.count - g.quantized);
  const int64_t stride = int64_t(gridDim.x) * kThreads;
  for (int64_t item = int64_t(blockIdx.x) * kThreads + threadIdx.x; item < total; item += stride) {
    if (item < groups) {
      const int64_t i0 = 8 * item;
      const int cnt = int(min64(8, g.quantized - i0));
      const int nbytes = cnt == 8 ? g.bits : (cnt * g.bits + 7) / 8;
      const uint64_t w = dev::load_le(g.codes + item * g.bits, nbytes);
      float v[8];
      dev::dequant8(w, cnt, i0, g.meta, g.bucket_size, g.bits, v);
      store8<D, kAdd>(out + i0, cnt, v);
    } else {
      const int64_t j = item - groups;
      float v = dev::load_tail(g.tail, g.tail_dtype, j);
      const int64_t i = g.quantized + j;
      if (kAdd) v = dev::fadd(IO::to_float(out[i]), v);
      out[i] = IO::from_float(v);
    }
  }
}

template <DType D>
void launch_decode(const DecodeGeom& g, void* out, bool add, cudaStream_t stream) {
  using Raw = typename dev::ElemIO<D>::Raw;
  Raw* o = static_cast<Raw*>(out);
  const int64_t items = (g.quantized + 7) / 8 + (g.count - g.quantized);
  const int blocks = blocks_for(items, kThreads);  // at least 1: the header is always checked
  if (add) {
    decode_kernel<D, true><<<blocks, kThreads, 0, stream>>>(g, o);
  } else {
    decode_kernel<D, false><<<blocks, kThreads, 0, stream>>>(g, o);
  }
  check_cuda(cudaGetLastError(), "decode kernel launch");
}

CodecParams params_of(const PayloadInfo& info) {
  CodecParams p;
  p.bits = info.bits;
  p.bucket_size = info.bucket_size;
  p.skip_incomplete_buckets = info.raw_tail;
  p.rounding = info.stochastic ? Rounding::kStochastic : Rounding::kNearest;
  return p;
}

void decode_async(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                  const PayloadInfo& expected, uint32_t* error_flag, cudaStream_t stream,
                  bool add) {
  check_dtype(expected.dtype, "expected payload");
  check_dtype(out_dtype, "output");
  const CodecParams p = params_of(expected);
  const size_t need = encoded_size(expected.count, expected.dtype, p);  // validates p, count
  CGX_CHECK_ARG(expected.count == count, "expected payload holds ", expected.count,
                " elements but the output has ", count);
  CGX_CHECK_ARG(size == need, "payload has ", size, " bytes, the expected header describes ", need);
  CGX_CHECK_ARG(payload != nullptr, "payload is null");
  CGX_CHECK_ARG(out != nullptr || count == 0, "output buffer is null");
  const Layout l = make_layout(count, expected.dtype, p.bits, p.bucket_size, expected.raw_tail);
  DecodeGeom g;
  g.expect = dev::make_header(expected.dtype, p.bits, p.bucket_size, expected.raw_tail,
                              expected.stochastic, count);
  g.count = count;
  g.quantized = l.quantized;
  g.bucket_size = p.bucket_size;
  g.bits = p.bits;
  g.tail_dtype = expected.dtype;
  g.payload = payload;
  g.meta = payload + l.meta_offset;
  g.codes = payload + l.codes_offset;
  g.tail = payload + l.tail_offset;
  g.error_flag = error_flag;
  switch (out_dtype) {
    case DType::kFloat32:
      return launch_decode<DType::kFloat32>(g, out, add, stream);
    case DType::kFloat16:
      return launch_decode<DType::kFloat16>(g, out, add, stream);
    case DType::kBFloat16:
      return launch_decode<DType::kBFloat16>(g, out, add, stream);
  }
}

void decode_checked(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                    cudaStream_t stream, bool add) {
  uint8_t header[kHeaderBytes] = {};
  const bool readable = payload != nullptr && size >= kHeaderBytes;
  if (readable) {
    check_cuda(cudaMemcpyAsync(header, payload, kHeaderBytes, cudaMemcpyDefault, stream),
               "payload header copy");
    check_cuda(cudaStreamSynchronize(stream), "payload header copy");
  }
  // inspect() reads only the 24 header bytes; `size` is the device payload's length.
  const PayloadInfo info = inspect(readable ? header : payload, size);
  CGX_CHECK_ARG(info.count == count, "payload holds ", info.count, " elements but the output has ",
                count);
  decode_async(payload, size, out, out_dtype, count, info, nullptr, stream, add);
}

}  // namespace

bool available() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // clear it: "no device" is an answer, not an error
    return false;
  }
  return n > 0;
}

const char* last_error() { return g_last_error.c_str(); }

void set_max_blocks(int64_t blocks) {
  g_max_blocks = blocks > 0 ? std::min(blocks, kMaxBlocks) : kMaxBlocks;
}

PayloadInfo payload_info(DType dtype, int64_t count, const CodecParams& params) {
  PayloadInfo info;
  guarded([&] {
    check_dtype(dtype, "input");
    (void)encoded_size(count, dtype, params);  // validates params and count
    info.dtype = dtype;
    info.bits = params.bits;
    info.bucket_size = params.bucket_size;
    info.raw_tail = params.skip_incomplete_buckets;
    info.stochastic = params.rounding == Rounding::kStochastic;
    info.count = count;
  });
  return info;
}

std::string describe_header_error(uint32_t flags) {
  static const char* const kNames[] = {
      "bad magic",    "version differs",     "dtype differs",  "bits differ",
      "flags differ", "bucket size differs", "reserved not 0", "element count differs"};
  std::string s;
  for (int k = 0; k < 8; ++k) {
    if (flags & (1u << k)) {
      if (!s.empty()) s += ", ";
      s += kNames[k];
    }
  }
  if (flags >> 8) s += s.empty() ? "unknown error bits" : ", unknown error bits";
  return s;
}

void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
            const PayloadInfo& expected, uint32_t* error_flag, cudaStream_t stream) {
  guarded([&] {
    decode_async(payload, size, out, out_dtype, count, expected, error_flag, stream, false);
  });
}

void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                const PayloadInfo& expected, uint32_t* error_flag, cudaStream_t stream) {
  guarded([&] {
    decode_async(payload, size, out, out_dtype, count, expected, error_flag, stream, true);
  });
}

void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
            cudaStream_t stream) {
  guarded([&] { decode_checked(payload, size, out, out_dtype, count, stream, false); });
}

void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                cudaStream_t stream) {
  guarded([&] { decode_checked(payload, size, out, out_dtype, count, stream, true); });
}

}  // namespace cgx::cuda
