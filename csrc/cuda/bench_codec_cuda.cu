// Throughput of the CUDA codec against a device-to-device cudaMemcpyAsync of the same input
// bytes, timed with CUDA events. Not part of the tests.
//
//   cgx_cuda_bench [MB=256] [bits=4] [bucket=512] [iters=20]
//
// GB/s are input bytes (n * 4 for fp32) per second for encode, output bytes for decode_add, and
// the copied bytes for memcpy (each of which is read once and written once); a ratio above 1 means
// faster than copying the fp32 buffer.
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <exception>

#include "codec_cuda.h"

namespace {

#define CHECK(expr)                                                           \
  do {                                                                        \
    const cudaError_t e_ = (expr);                                            \
    if (e_ != cudaSuccess) {                                                  \
      std::fprintf(stderr, "%s failed: %s\n", #expr, cudaGetErrorString(e_)); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

// Normal-ish values from a counter hash (Irwin-Hall of 4 uniforms), so buckets have a real range.
__global__ void fill(float* x, int64_t n, uint32_t seed) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float s = 0.0f;
    for (uint32_t k = 0; k < 4; ++k) {
      uint32_t h = uint32_t(i) * 0x9e3779b1u ^ (seed + k * 0x85ebca6bu);
      h ^= h >> 15;
      h *= 0x2c1b3c6du;
      h ^= h >> 12;
      h *= 0x297a2d39u;
      h ^= h >> 15;
      s += float(h >> 8) * 0x1p-24f;
    }
    x[i] = (s - 2.0f) * 1.7f;
  }
}

template <typename F>
float time_ms(F&& f, int iters, cudaStream_t stream) {
  cudaEvent_t start, stop;
  CHECK(cudaEventCreate(&start));
  CHECK(cudaEventCreate(&stop));
  f();  // warm-up
  CHECK(cudaEventRecord(start, stream));
  for (int i = 0; i < iters; ++i) f();
  CHECK(cudaEventRecord(stop, stream));
  CHECK(cudaEventSynchronize(stop));
  float ms = 0.0f;
  CHECK(cudaEventElapsedTime(&ms, start, stop));
  CHECK(cudaEventDestroy(start));
  CHECK(cudaEventDestroy(stop));
  return ms / float(iters);
}

}  // namespace

int main(int argc, char** argv) {
  const int64_t mb = argc > 1 ? std::atoll(argv[1]) : 256;
  const int bits = argc > 2 ? std::atoi(argv[2]) : 4;
  const int64_t bucket = argc > 3 ? std::atoll(argv[3]) : 512;
  const int iters = argc > 4 ? std::atoi(argv[4]) : 20;
  if (!cgx::cuda::available()) {
    std::fprintf(stderr, "no CUDA device\n");
    return 2;
  }
  try {
    const int64_t n = mb * (int64_t(1) << 20) / 4;
    const size_t bytes = size_t(n) * 4;
    cgx::CodecParams p;
    p.bits = bits;
    p.bucket_size = bucket;
    const size_t payload_size = cgx::encoded_size(n, cgx::DType::kFloat32, p);
    const cgx::PayloadInfo info = cgx::cuda::payload_info(cgx::DType::kFloat32, n, p);

    cudaDeviceProp prop;
    int dev = 0;
    CHECK(cudaGetDevice(&dev));
    CHECK(cudaGetDeviceProperties(&prop, dev));
    cudaStream_t stream;
    CHECK(cudaStreamCreate(&stream));
    float *x, *acc, *copy;
    uint8_t* payload;
    uint32_t* flag;
    CHECK(cudaMalloc(&x, bytes));
    CHECK(cudaMalloc(&acc, bytes));
    CHECK(cudaMalloc(&copy, bytes));
    CHECK(cudaMalloc(&payload, payload_size));
    CHECK(cudaMalloc(&flag, 4));
    CHECK(cudaMemsetAsync(flag, 0, 4, stream));
    fill<<<1024, 256, 0, stream>>>(x, n, 1);
    fill<<<1024, 256, 0, stream>>>(acc, n, 2);
    CHECK(cudaGetLastError());

    const float t_copy =
        time_ms([&] { CHECK(cudaMemcpyAsync(copy, x, bytes, cudaMemcpyDeviceToDevice, stream)); },
                iters, stream);
    const float t_enc = time_ms(
        [&] { cgx::cuda::encode(x, cgx::DType::kFloat32, n, p, payload, payload_size, stream); },
        iters, stream);
    p.rounding = cgx::Rounding::kStochastic;
    const float t_enc_sr = time_ms(
        [&] { cgx::cuda::encode(x, cgx::DType::kFloat32, n, p, payload, payload_size, stream); },
        iters, stream);
    const float t_dec = time_ms(
        [&] {
          cgx::cuda::decode_add(payload, payload_size, acc, cgx::DType::kFloat32, n, info, flag,
                                stream);
        },
        iters, stream);
    uint32_t err = 0;
    CHECK(cudaMemcpy(&err, flag, 4, cudaMemcpyDeviceToHost));

    const double gb = double(bytes) / 1e9;
    std::printf("device %s, %lld MB fp32 (%lld elements), %d bits, bucket %lld, %d iterations\n",
                prop.name, (long long)mb, (long long)n, bits, (long long)bucket, iters);
    std::printf("%-26s %9s %9s %14s\n", "", "ms", "GB/s", "vs memcpy");
    const auto row = [&](const char* name, float ms) {
      std::printf("%-26s %9.3f %9.1f %13.2fx\n", name, ms, gb / (ms * 1e-3), t_copy / ms);
    };
    row("cudaMemcpyAsync D2D", t_copy);
    row("encode (nearest)", t_enc);
    row("encode (stochastic)", t_enc_sr);
    row("decode_add", t_dec);
    std::printf("payload %zu bytes (%.3f of the input); decode error flag %u\n", payload_size,
                double(payload_size) / double(bytes), err);

    CHECK(cudaFree(x));
    CHECK(cudaFree(acc));
    CHECK(cudaFree(copy));
    CHECK(cudaFree(payload));
    CHECK(cudaFree(flag));
    CHECK(cudaStreamDestroy(stream));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
