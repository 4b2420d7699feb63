// The fused qsgd / terngrad / onebit / efsignsgd / signsgd / signum / tbq kernels
// (cuda/levels_cuda.h) against the native
// compressors: the same payload bytes, the same decode_add values (bit for bit, any NaN equal to
// any NaN: GPU arithmetic returns the canonical NaN, x86 keeps the operand's payload), also
// with the grid-stride loops running several rounds. Needs a GPU (skipped otherwise); the argument
// errors run everywhere. The host-side twin of these checks is
// csrc/tests/levels_cuda_logic_test.cc.
#include "cuda/levels_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "compressors/registry.h"
#include "core/error.h"
#include "cuda/codec_cuda.h"
#include "tests/codec_cases.h"

namespace cgx {
namespace {

std::vector<uint8_t> values(int64_t n, DType t, uint32_t seed, bool specials) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> normal;
  std::vector<uint8_t> raw(size_t(n) * elem_size(t));
  for (int64_t i = 0; i < n; ++i) {
    float v = normal(gen) * std::pow(10.0f, float((i / 41) % 7) - 3.0f);
    if ((i / 41) % 13 == 6) v = 0.0f;
    if (specials && i == n / 2) v = NAN;
    store_from_float(raw.data(), t, i, v);
  }
  return raw;
}

std::unique_ptr<Compressor> native(const cuda::LevelsConfig& c) {
  if (c.kind == 4) return make_compressor("signsgd", {});
  if (c.kind == 5) return make_compressor("signum", {});
  if (c.kind == 6) return make_compressor("tbq", {{"tau", c.clip}});
  if (c.kind == 2) return make_compressor("onebit", {{"bucket_size", double(c.bucket_size)}});
  if (c.kind == 3) return make_compressor("efsignsgd", {{"bucket_size", double(c.bucket_size)}});
  if (c.kind == 0) {
    return make_compressor("qsgd", {{"bits", c.bits}, {"bucket_size", double(c.bucket_size)}});
  }
  return make_compressor("terngrad", {{"clip", c.clip}, {"bucket_size", double(c.bucket_size)}});
}

class CudaLevels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) GTEST_SKIP() << "no CUDA device: GPU test skipped";
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    for (void* p : owned_) cudaFree(p);
  }
  uint8_t* device_copy(const std::vector<uint8_t>& host, size_t bytes) {
    void* p = nullptr;
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(bytes, 1)), cudaSuccess);
    owned_.push_back(p);
    if (!host.empty()) {
      EXPECT_EQ(cudaMemcpy(p, host.data(), host.size(), cudaMemcpyHostToDevice), cudaSuccess);
    }
    return static_cast<uint8_t*>(p);
  }
  std::vector<uint8_t> download(const uint8_t* p, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpy(out.data(), p, bytes, cudaMemcpyDeviceToHost), cudaSuccess);
    }
    return out;
  }

  void check(const cuda::LevelsConfig& c, int64_t n, DType t) {
    const std::string what = "kind=" + std::to_string(c.kind) + " bits=" + std::to_string(c.bits) +
                             " clip=" + std::to_string(c.clip) +
                             " bucket=" + std::to_string(c.bucket_size) +
                             " n=" + std::to_string(n) + " dtype=" + std::to_string(int(t));
    const auto in = values(n, t, uint32_t(n + c.bucket_size), n % 3 == 1);
    auto comp = native(c);
    std::vector<uint8_t> want(comp->max_encoded_size(n, t));
    want.resize(comp->encode(in.data(), t, n, EncodeContext{11, 22, 0}, want.data(), want.size()));
    const size_t size = cuda::levels_encoded_size(c, n);
    ASSERT_EQ(size, want.size()) << what;
    uint8_t* x = device_copy(in, in.size());
    uint8_t* payload = device_copy(std::vector<uint8_t>(size, 0xAB), size);
    cuda::levels_encode(x, t, n, c, 11, 22, payload, size, stream_);
    ASSERT_EQ(download(payload, size), want) << what;
    auto acc = values(n, t, 5, false);
    uint8_t* out = device_copy(acc, acc.size());
    cuda::levels_decode(payload, size, out, t, n, c, true, stream_);
    comp->decode(want.data(), want.size(), acc.data(), t, n, true);
    ASSERT_EQ(testing::first_difference(download(out, acc.size()), acc, t), -1)
        << what << ": decode_add";
  }

  cudaStream_t stream_ = nullptr;
  std::vector<void*> owned_;
};

TEST_F(CudaLevels, BytesAndValuesAreTheNativeOnes) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int64_t bucket : {0, 1, 7, 512, 4097}) {
      for (int64_t n : {0, 1, 9, 1000, 20011}) {
        for (int bits : {2, 4, 8}) check({0, bits, 0.0f, bucket}, n, t);
        for (float clip : {0.0f, 2.5f}) check({1, 2, clip, bucket}, n, t);
        for (int kind : {2, 3}) check({kind, 1, 0.0f, bucket}, n, t);
        for (int kind : {4, 5}) check({kind, 1, 0.0f, bucket}, n, t);
        for (float tau : {1.0f, 1e-3f}) check({6, 2, tau, bucket}, n, t);
      }
    }
  }
}

TEST_F(CudaLevels, GridStrideLoopsMatchNative) {
  cuda::set_max_blocks(3);
  check({0, 4, 0.0f, 8}, 100003, DType::kFloat32);
  check({1, 2, 2.5f, 100}, 100003, DType::kBFloat16);
  check({2, 1, 0.0f, 33}, 100003, DType::kFloat16);
  check({4, 1, 0.0f, 0}, 100003, DType::kFloat32);  // n % 3 == 1: a NaN, the flag from one block
  check({6, 2, 0.5f, 0}, 100003, DType::kBFloat16);
  cuda::set_max_blocks(0);
}

TEST(CudaLevelsArgs, BadArgumentsThrowBeforeAnyLaunch) {
  alignas(8) uint8_t dummy[64];
  EXPECT_THROW(
      cuda::levels_encode(dummy, DType::kFloat32, 10, {0, 9, 0.0f, 512}, 0, 0, dummy, 41, nullptr),
      InvalidArgument);
  EXPECT_THROW(
      cuda::levels_encode(dummy, DType::kFloat32, 10, {0, 4, 0.0f, 512}, 0, 0, dummy, 40, nullptr),
      InvalidArgument);
  EXPECT_THROW(
      cuda::levels_decode(dummy, 46, dummy, DType::kFloat32, 10, {1, 2, 0.0f, 4}, true, nullptr),
      InvalidArgument);
  EXPECT_THROW(
      cuda::levels_encode(dummy, DType::kFloat32, 10, {6, 2, 0.0f, 0}, 0, 0, dummy, 35, nullptr),
      InvalidArgument);  // tau 0
  EXPECT_THROW(
      cuda::levels_encode(dummy, DType::kFloat32, 10, {7, 1, 0.0f, 0}, 0, 0, dummy, 34, nullptr),
      InvalidArgument);
  EXPECT_THROW(cuda::levels_encode(dummy, DType::kFloat32, 10, {4, 1, 0.0f, 0}, 0, 0, dummy + 1, 34,
                                   nullptr),
               InvalidArgument);  // out not 4-byte aligned
  EXPECT_EQ(cuda::levels_encoded_size({1, 2, 0.0f, 4}, 10), 47u);
  EXPECT_EQ(cuda::levels_encoded_size({4, 1, 0.0f, 4}, 10), 34u);
  EXPECT_EQ(cuda::levels_encoded_size({6, 2, 1.0f, 4}, 10), 35u);
}

}  // namespace
}  // namespace cgx
