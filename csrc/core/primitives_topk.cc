// top_k_into: prim::top_k's selection for many small ranges (SparseLoCo's chunks), without its
// allocations and full sort. The largest keys of g interleaved groups (g >= 2k) bound the k-th
// largest key from below (the k largest group maxima are k values at or above the k-th of them),
// so only the values at or above the bound are candidates; the exact k-th largest key among them
// is found a bit at a time, and one pass in index order keeps the values above it and, of those
// equal to it, the lowest indices: top_k's indices exactly. Written once (primitives_topk.inc),
// compiled for the baseline and for AVX2.
#include <algorithm>

#include "error.h"
#include "primitives.h"

#define CGX_TOPK_NS generic
#define CGX_TOPK_AVX2 0
#include "primitives_topk.inc"
#undef CGX_TOPK_AVX2
#undef CGX_TOPK_NS

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>  // its functions carry their own target attributes

namespace cgx::prim::avx2 {
namespace {
// Byte j of kPack[m]: the position of the j-th set bit of m (an 8-lane mask).
constexpr uint64_t pack_entry(unsigned m) {
  uint64_t e = 0;
  for (unsigned lane = 0, j = 0; lane < 8; ++lane) {
    if (m >> lane & 1) e |= uint64_t(lane) << (8 * j++);
  }
  return e;
}
struct PackTable {
  uint64_t v[256];
  constexpr PackTable() : v() {
    for (unsigned m = 0; m < 256; ++m) v[m] = pack_entry(m);
  }
};
constexpr PackTable kPackTable;
constexpr const uint64_t* kPack = kPackTable.v;
}  // namespace
}  // namespace cgx::prim::avx2

#define CGX_HAVE_AVX2_TOPK 1
#pragma GCC push_options
#pragma GCC target("avx2")
#define CGX_TOPK_NS avx2
#define CGX_TOPK_AVX2 1
#include "primitives_topk.inc"
#undef CGX_TOPK_AVX2
#undef CGX_TOPK_NS
#pragma GCC pop_options
#endif

namespace cgx::prim {

void top_k_into(const void* in, DType t, int64_t n, int64_t k, TopKScratch& s, uint32_t* out) {
  CGX_CHECK_ARG(n < (int64_t(1) << 32), "top_k: at most 2^32 - 1 elements, got ", n);
  k = std::clamp<int64_t>(k, 0, n);
  if (k == n) {
    for (int64_t i = 0; i < n; ++i) out[i] = uint32_t(i);
    return;
  }
  if (k == 0) return;
  if (int64_t(s.keys.size()) < n) {
    s.keys.resize(size_t(n));
    s.cand.resize(size_t(n) + 8);
    s.cand_keys.resize(size_t(n) + 8);
    s.groups.resize(size_t(n));
  }
#ifdef CGX_HAVE_AVX2_TOPK
  if (use_avx2()) {
    avx2::keys_into(in, t, n, s);
    return avx2::select_keys(n, k, s, out);
  }
#endif
  generic::keys_into(in, t, n, s);
  generic::select_keys(n, k, s, out);
}

}  // namespace cgx::prim
