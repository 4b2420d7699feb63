// Baseline build of the codec kernels and the run-time choice between it and AVX2.
#include "codec_kernels.h"

#include <atomic>
#include <cstdlib>

#define CGX_KERNEL_NS generic
#define CGX_KERNEL_AVX2 0
#include "codec_kernels.inc"
#undef CGX_KERNEL_AVX2
#undef CGX_KERNEL_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CGX_HAVE_AVX2_KERNELS 1
namespace cgx::kernels::avx2 {
void encode_span(const EncodeArgs& args);
void decode_span(const DecodeArgs& args);
void pack_groups(const uint8_t* codes, int64_t groups, int bits, uint8_t* out);
}  // namespace cgx::kernels::avx2
#endif

namespace cgx::kernels {
namespace {

bool avx2_available() {
#ifdef CGX_HAVE_AVX2_KERNELS
  return __builtin_cpu_supports("avx2");
#else
  return false;
#endif
}

std::atomic<bool> g_avx2{avx2_available()};  // CGX_DISABLE_AVX2: set_isa(false) from Python

bool use_avx2() { return g_avx2.load(std::memory_order_relaxed); }

}  // namespace

bool set_isa(bool avx2) {
  g_avx2 = avx2 && avx2_available();
  return g_avx2;
}

void encode_span(const EncodeArgs& args) {
#ifdef CGX_HAVE_AVX2_KERNELS
  if (use_avx2()) return avx2::encode_span(args);
#endif
  generic::encode_span(args);
}

void decode_span(const DecodeArgs& args) {
#ifdef CGX_HAVE_AVX2_KERNELS
  if (use_avx2()) return avx2::decode_span(args);
#endif
  generic::decode_span(args);
}

void pack_groups(const uint8_t* codes, int64_t groups, int bits, uint8_t* out) {
#ifdef CGX_HAVE_AVX2_KERNELS
  if (use_avx2()) return avx2::pack_groups(codes, groups, bits, out);
#endif
  generic::pack_groups(codes, groups, bits, out);
}

const char* isa() { return use_avx2() ? "avx2" : "generic"; }

}  // namespace cgx::kernels
