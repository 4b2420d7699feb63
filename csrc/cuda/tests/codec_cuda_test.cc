// The CUDA codec against the CPU codec: the same payload bytes from encode (nearest and
// stochastic rounding), the same values from decode / decode_add (NaN payloads aside), the
// header check of the asynchronous decode, and host-side argument errors. Tests that need a GPU
// skip themselves when cgx::cuda::available() is false; the argument tests run everywhere.
#include "cuda/codec_cuda.h"

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "core/codec.h"
#include "core/error.h"
#include "tests/codec_cases.h"

namespace cgx {
namespace {

using testing::describe;

// A device allocation that grows, so that the property loops reuse one buffer.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() {
    if (ptr_ != nullptr) cudaFree(ptr_);
  }
  uint8_t* get(size_t bytes) {
    if (bytes > cap_ || ptr_ == nullptr) {
      if (ptr_ != nullptr) cudaFree(ptr_);
      ptr_ = nullptr;
      cap_ = std::max<size_t>(bytes, 256);
      if (cudaMalloc(reinterpret_cast<void**>(&ptr_), cap_) != cudaSuccess) {
        ptr_ = nullptr;
        cap_ = 0;
        ADD_FAILURE() << "cudaMalloc of " << bytes << " bytes failed";
      }
    }
    return ptr_;
  }

 private:
  uint8_t* ptr_ = nullptr;
  size_t cap_ = 0;
};

class CudaCodec : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::available()) {
      GTEST_SKIP() << "no CUDA device (cgx::cuda::available() is false): GPU test skipped";
    }
    ASSERT_EQ(cudaStreamCreate(&stream_), cudaSuccess);
    ASSERT_EQ(cudaMalloc(reinterpret_cast<void**>(&flag_), sizeof(uint32_t)), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    if (flag_ != nullptr) cudaFree(flag_);
  }

  void upload(uint8_t* dst, const std::vector<uint8_t>& src) {
    if (!src.empty()) {
      ASSERT_EQ(cudaMemcpyAsync(dst, src.data(), src.size(), cudaMemcpyHostToDevice, stream_),
                cudaSuccess);
    }
  }
  std::vector<uint8_t> download(const uint8_t* src, size_t bytes) {
    std::vector<uint8_t> out(bytes);
    if (bytes > 0) {
      EXPECT_EQ(cudaMemcpyAsync(out.data(), src, bytes, cudaMemcpyDeviceToHost, stream_),
                cudaSuccess);
    }
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return out;
  }
  uint32_t read_flag() {
    uint32_t f = 0;
    EXPECT_EQ(cudaMemcpyAsync(&f, flag_, 4, cudaMemcpyDeviceToHost, stream_), cudaSuccess);
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    return f;
  }
  void clear_flag() { ASSERT_EQ(cudaMemsetAsync(flag_, 0, 4, stream_), cudaSuccess); }

  // GPU encode of host input `in` (n elements of dtype), returned on the host. `in_offset` and
  // `out_offset` (bytes) misalign the device buffers.
  std::vector<uint8_t> gpu_encode(const std::vector<uint8_t>& in, DType dtype, int64_t n,
                                  const CodecParams& p, size_t in_offset = 0,
                                  size_t out_offset = 0) {
    const size_t size = encoded_size(n, dtype, p);
    uint8_t* din = in_buf_.get(in.size() + in_offset) + in_offset;
    uint8_t* dout = out_buf_.get(size + out_offset) + out_offset;
    upload(din, in);
    EXPECT_EQ(cudaMemsetAsync(dout, 0xAB, size, stream_), cudaSuccess);  // poison
    cuda::encode(din, dtype, n, p, dout, size, stream_);
    return download(dout, size);
  }

  // GPU decode (add: decode_add) of host payload into host `out` (n elements of out_dtype).
  // `sync_check`: the decode that validates the header on the host; otherwise the asynchronous
  // one with `expected`, whose error flag is returned.
  uint32_t gpu_decode(const std::vector<uint8_t>& payload, const PayloadInfo& expected,
                      std::vector<uint8_t>& out, DType out_dtype, int64_t n, bool add,
                      bool sync_check = false, size_t payload_offset = 0, size_t out_offset = 0) {
    uint8_t* dp = in_buf_.get(payload.size() + payload_offset) + payload_offset;
    uint8_t* dout = out_buf_.get(out.size() + out_offset) + out_offset;
    upload(dp, payload);
    upload(dout, out);
    clear_flag();
    if (sync_check && add) {
      cuda::decode_add(dp, payload.size(), dout, out_dtype, n, stream_);
    } else if (sync_check) {
      cuda::decode(dp, payload.size(), dout, out_dtype, n, stream_);
    } else if (add) {
      cuda::decode_add(dp, payload.size(), dout, out_dtype, n, expected, flag_, stream_);
    } else {
      cuda::decode(dp, payload.size(), dout, out_dtype, n, expected, flag_, stream_);
    }
    out = download(dout, out.size());
    return read_flag();
  }

  // Encode on both sides and compare bytes; then decode / decode_add the CPU payload on the GPU
  // into every dtype and compare with the CPU's values.
  void check_case(const std::vector<uint8_t>& in, DType dtype, int64_t n, CodecParams p,
                  bool decode_too) {
    for (auto rounding : {Rounding::kNearest, Rounding::kStochastic}) {
      p.rounding = rounding;
      p.seed = 42;
      p.stream = uint64_t(n) + 3;
      const auto want = testing::cpu_encode(in, dtype, n, p);
      const auto got = gpu_encode(in, dtype, n, p);
      ASSERT_EQ(got.size(), want.size());
      const auto diff = std::mismatch(got.begin(), got.end(), want.begin());
      ASSERT_TRUE(diff.first == got.end())
          << describe("encode", n, dtype, p) << ": first differing byte "
          << (diff.first - got.begin()) << " of " << got.size();
    }
    if (!decode_too) return;
    p.rounding = Rounding::kNearest;
    const auto payload = testing::cpu_encode(in, dtype, n, p);
    const PayloadInfo expected = cuda::payload_info(dtype, n, p);
    for (DType od : testing::kDTypes) {
      for (bool add : {false, true}) {
        std::vector<uint8_t> want = testing::accumulator(n, od);
        std::vector<uint8_t> got = want;
        if (add) {
          decode_add(payload.data(), payload.size(), want.data(), od, n);
        } else {
          decode(payload.data(), payload.size(), want.data(), od, n);
        }
        ASSERT_EQ(gpu_decode(payload, expected, got, od, n, add), 0u);
        ASSERT_EQ(testing::first_difference(got, want, od), -1)
            << describe(add ? "decode_add" : "decode", n, dtype, p) << " into " << dtype_name(od);
      }
    }
  }

  cudaStream_t stream_ = nullptr;
  uint32_t* flag_ = nullptr;
  DeviceBuffer in_buf_, out_buf_;
};

TEST_F(CudaCodec, PropertyMatrixMatchesCpu) {
  // bits 1..8 x sizes x buckets x raw tail x fp32 / fp16 / bf16 x nearest / stochastic encode;
  // decode and decode_add into each dtype.
  testing::for_each_property_case(
      [this](const std::vector<uint8_t>& in, DType dtype, int64_t n, const CodecParams& p) {
        check_case(in, dtype, n, p, true);
        return !HasFatalFailure();
      });
}

TEST_F(CudaCodec, LargeBucketsMatchCpu) {
  // The chunked encoder (lcm(bucket, 8) > 4096) and the edges of the staged one.
  for (int64_t bucket : testing::large_buckets()) {
    for (int64_t n : {int64_t(4099), int64_t(70001), int64_t(1000003)}) {
      for (int bits : {1, 3, 4, 8}) {
        const DType dtype = bits == 3 ? DType::kBFloat16 : DType::kFloat32;
        const auto in = testing::random_input(n, dtype, uint32_t(bucket + bits));
        CodecParams p;
        p.bits = bits;
        p.bucket_size = bucket;
        p.skip_incomplete_buckets = bits == 8;
        check_case(in, dtype, n, p, bits != 1);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaCodec, ExtremeValuesMatchCpu) {
  const auto x = testing::extreme_values();
  for (DType dtype : testing::kDTypes) {
    const auto in = testing::to_dtype(x, dtype);
    for (int bits = 1; bits <= 8; ++bits) {
      for (int64_t bucket : {1, 2, 4, 5, 4097}) {
        CodecParams p;
        p.bits = bits;
        p.bucket_size = bucket;
        check_case(in, dtype, int64_t(x.size()), p, true);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(CudaCodec, ManyBlocksMatchCpu) {
  // Thousands of blocks at the default grid size.
  const int64_t n = (int64_t(12) << 20) + 5;
  const auto in = testing::random_input(n, DType::kFloat32, 9);
  CodecParams p;
  p.bits = 5;
  p.bucket_size = 100;
  check_case(in, DType::kFloat32, n, p, true);
}

TEST_F(CudaCodec, GridStrideLoopsMatchCpu) {
  // With the grid capped at a few blocks, every kernel loops over many tiles / items per block
  // (at the default cap that takes billions of elements).
  for (int64_t blocks : {1, 3}) {
    cuda::set_max_blocks(blocks);
    for (int64_t bucket : {int64_t(1), int64_t(100), int64_t(512), int64_t(5000)}) {
      const int64_t n = 100003;
      const auto in = testing::random_input(n, DType::kFloat16, uint32_t(bucket));
      CodecParams p;
      p.bits = 4;
      p.bucket_size = bucket;
      p.skip_incomplete_buckets = true;
      check_case(in, DType::kFloat16, n, p, true);
      if (HasFatalFailure()) break;
    }
  }
  cuda::set_max_blocks(0);
}

TEST_F(CudaCodec, UnalignedBuffersMatchCpu) {
  // Input not 16-byte aligned (scalar loads), payload at odd byte offsets (byte-wise metadata
  // and tail), output not 16-byte aligned (scalar stores).
  const int64_t n = 10007;
  for (DType dtype : testing::kDTypes) {
    const auto in = testing::random_input(n, dtype, 3);
    for (int64_t bucket : {int64_t(100), int64_t(512), int64_t(5000)}) {
      CodecParams p;
      p.bits = 3;
      p.bucket_size = bucket;
      p.skip_incomplete_buckets = true;
      const auto want = testing::cpu_encode(in, dtype, n, p);
      EXPECT_EQ(gpu_encode(in, dtype, n, p, elem_size(dtype), 3), want)
          << describe("unaligned encode", n, dtype, p);
      std::vector<uint8_t> cpu_out = testing::random_input(n, dtype, 4);
      std::vector<uint8_t> gpu_out = cpu_out;
      decode_add(want.data(), want.size(), cpu_out.data(), dtype, n);
      EXPECT_EQ(gpu_decode(want, cuda::payload_info(dtype, n, p), gpu_out, dtype, n, true, false, 5,
                           elem_size(dtype)),
                0u);
      EXPECT_EQ(testing::first_difference(gpu_out, cpu_out, dtype), -1)
          << describe("unaligned decode_add", n, dtype, p);
    }
  }
}

TEST_F(CudaCodec, HeaderMismatchSetsFlagAndWritesNothing) {
  const int64_t n = 5000;
  CodecParams p;
  p.bits = 4;
  p.bucket_size = 512;
  const auto payload =
      testing::cpu_encode(testing::random_input(n, DType::kFloat32, 1), DType::kFloat32, n, p);
  const std::vector<uint8_t> acc = testing::random_input(n, DType::kFloat32, 2);

  // The payload says bucket size 512 where the receiver expects 500 (the byte length is that
  // of a 500-bucket payload, so the host-side checks pass and the device catches it).
  CodecParams q = p;
  q.bucket_size = 500;
  auto corrupt =
      testing::cpu_encode(testing::random_input(n, DType::kFloat32, 1), DType::kFloat32, n, q);
  corrupt[8] = uint8_t(512 & 0xff);
  corrupt[9] = uint8_t(512 >> 8);
  std::vector<uint8_t> out = acc;
  EXPECT_EQ(
      gpu_decode(corrupt, cuda::payload_info(DType::kFloat32, n, q), out, DType::kFloat32, n, true),
      uint32_t(cuda::kErrBucketSize));
  EXPECT_EQ(out, acc) << "a rejected payload must leave the output untouched";

  // Corrupt magic and version; the stochastic flag alone is accepted.
  corrupt = payload;
  corrupt[0] = 'X';
  corrupt[4] = 2;
  out = acc;
  const uint32_t f = gpu_decode(corrupt, cuda::payload_info(DType::kFloat32, n, p), out,
                                DType::kFloat32, n, false);
  EXPECT_EQ(f, uint32_t(cuda::kErrMagic | cuda::kErrVersion));
  EXPECT_EQ(cuda::describe_header_error(f), "bad magic, version differs");
  EXPECT_EQ(out, acc);
  corrupt = payload;
  corrupt[7] |= 2;
  out = acc;
  EXPECT_EQ(gpu_decode(corrupt, cuda::payload_info(DType::kFloat32, n, p), out, DType::kFloat32, n,
                       false),
            0u);
  EXPECT_NE(out, acc);

  // The flag is sticky: OR-ed over decodes until the caller clears it.
  clear_flag();
  uint8_t* dp = in_buf_.get(payload.size());
  uint8_t* dout = out_buf_.get(acc.size());
  corrupt = payload;
  corrupt[6] = 3;
  upload(dp, corrupt);
  cuda::decode(dp, corrupt.size(), dout, DType::kFloat32, n,
               cuda::payload_info(DType::kFloat32, n, p), flag_, stream_);
  upload(dp, payload);
  cuda::decode(dp, payload.size(), dout, DType::kFloat32, n,
               cuda::payload_info(DType::kFloat32, n, p), flag_, stream_);
  EXPECT_EQ(read_flag(), uint32_t(cuda::kErrBits));
}

TEST_F(CudaCodec, SynchronousDecodeValidatesLikeCpu) {
  const int64_t n = 3000;
  CodecParams p;
  p.bits = 6;
  p.bucket_size = 256;
  p.skip_incomplete_buckets = true;
  const auto in = testing::random_input(n, DType::kBFloat16, 5);
  const auto payload = testing::cpu_encode(in, DType::kBFloat16, n, p);
  std::vector<uint8_t> want = testing::random_input(n, DType::kFloat32, 6);
  std::vector<uint8_t> got = want;
  decode_add(payload.data(), payload.size(), want.data(), DType::kFloat32, n);
  gpu_decode(payload, PayloadInfo{}, got, DType::kFloat32, n, true, true);
  EXPECT_EQ(testing::first_difference(got, want, DType::kFloat32), -1);

  auto corrupt = payload;
  corrupt[1] = 'x';
  uint8_t* dp = in_buf_.get(payload.size());
  uint8_t* dout = out_buf_.get(got.size());
  upload(dp, corrupt);
  EXPECT_THROW(cuda::decode(dp, corrupt.size(), dout, DType::kFloat32, n, stream_),
               InvalidArgument);
  EXPECT_NE(std::string(cuda::last_error()).find("bad magic"), std::string::npos);
  upload(dp, payload);
  EXPECT_THROW(cuda::decode(dp, payload.size() - 1, dout, DType::kFloat32, n, stream_),
               InvalidArgument);
  EXPECT_THROW(cuda::decode(dp, payload.size(), dout, DType::kFloat32, n + 1, stream_),
               InvalidArgument);
}

// ---- host-side argument checks: no device needed ---------------------------------------------

TEST(CudaCodecArgs, BadArgumentsThrowBeforeAnyDeviceWork) {
  CodecParams p;
  p.bits = 0;
  EXPECT_THROW(cuda::encode(nullptr, DType::kFloat32, 0, p, nullptr, 0, nullptr), InvalidArgument);
  EXPECT_NE(std::string(cuda::last_error()).find("bits"), std::string::npos);
  p.bits = 4;
  p.bucket_size = 0;
  EXPECT_THROW(cuda::encode(nullptr, DType::kFloat32, 0, p, nullptr, 0, nullptr), InvalidArgument);
  p.bucket_size = 512;
  const size_t size = encoded_size(1000, DType::kFloat16, p);
  EXPECT_THROW(cuda::encode(nullptr, DType::kFloat16, 1000, p, nullptr, size + 1, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::encode(nullptr, DType::kFloat16, 1000, p, nullptr, size, nullptr),
               InvalidArgument);  // null input
  EXPECT_THROW(cuda::encode(nullptr, DType(7), 0, p, nullptr, 24, nullptr), InvalidArgument);

  const PayloadInfo info = cuda::payload_info(DType::kFloat16, 1000, p);
  uint8_t* fake = reinterpret_cast<uint8_t*>(uintptr_t(4096));  // never dereferenced
  EXPECT_THROW(cuda::decode(fake, size + 1, fake, DType::kFloat32, 1000, info, nullptr, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::decode(fake, size, fake, DType::kFloat32, 999, info, nullptr, nullptr),
               InvalidArgument);
  PayloadInfo bad = info;
  bad.bits = 9;
  EXPECT_THROW(cuda::decode_add(fake, size, fake, DType::kFloat32, 1000, bad, nullptr, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::decode_add(fake, size, fake, DType(3), 1000, info, nullptr, nullptr),
               InvalidArgument);
  EXPECT_THROW(cuda::decode(nullptr, 10, fake, DType::kFloat32, 1000, nullptr), InvalidArgument);
}

TEST(CudaCodecArgs, PayloadInfoIsWhatTheCpuHeaderSays) {
  for (bool raw : {false, true}) {
    CodecParams p;
    p.bits = 7;
    p.bucket_size = 33;
    p.skip_incomplete_buckets = raw;
    p.rounding = Rounding::kStochastic;
    const auto payload = testing::cpu_encode(testing::random_input(100, DType::kBFloat16, 1),
                                             DType::kBFloat16, 100, p);
    const PayloadInfo a = inspect(payload.data(), payload.size());
    const PayloadInfo b = cuda::payload_info(DType::kBFloat16, 100, p);
    EXPECT_EQ(a.dtype, b.dtype);
    EXPECT_EQ(a.bits, b.bits);
    EXPECT_EQ(a.bucket_size, b.bucket_size);
    EXPECT_EQ(a.raw_tail, b.raw_tail);
    EXPECT_EQ(a.stochastic, b.stochastic);
    EXPECT_EQ(a.count, b.count);
  }
  EXPECT_EQ(cuda::describe_header_error(0), "");
  EXPECT_EQ(cuda::describe_header_error(cuda::kErrBits | cuda::kErrCount),
            "bits differ, element count differs");
}

TEST(CudaCodecArgs, AvailableDoesNotThrow) {
  const bool a = cuda::available();
  std::printf("cgx::cuda::available() = %d\n", int(a));
}

}  // namespace
}  // namespace cgx
