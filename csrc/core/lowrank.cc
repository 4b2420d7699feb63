#include "lowrank.h"

#include <algorithm>
#include <vector>

#include "clones.h"

namespace cgx::lowrank {
namespace {

constexpr int64_t kBlock = 512;  // a block of a row and its products stay in L1
constexpr int kLanes = 8;        // partial sums: lets the compiler vectorize the dot products

// sum over j < n of x[j] * y[j], in kLanes partial sums (fp32), then added in fp64.
inline double dot(const float* x, const float* y, int64_t n) {
  float lanes[kLanes] = {};
  int64_t j = 0;
  for (; j + kLanes <= n; j += kLanes) {
    for (int l = 0; l < kLanes; ++l) lanes[l] += x[j + l] * y[j + l];
  }
  double s = 0;
  for (int l = 0; l < kLanes; ++l) s += lanes[l];
  for (; j < n; ++j) s += double(x[j]) * y[j];
  return s;
}

}  // namespace

// AVX2 and baseline copies (clones.h).
CGX_CLONES void add_and_project(float* m, const float* e, const float* qt, float* p, int64_t rows,
                                int64_t cols, int rank) {
  double acc[64];
  for (int64_t i = 0; i < rows; ++i) {
    float* row = m + i * cols;
    const float* erow = e ? e + i * cols : nullptr;
    for (int k0 = 0; k0 < rank; k0 += 64) {
      const int kn = std::min(64, rank - k0);
      std::fill(acc, acc + kn, 0.0);
      for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
        const int64_t n = std::min(kBlock, cols - j0);
        if (erow && k0 == 0) {
          for (int64_t j = 0; j < n; ++j) row[j0 + j] += erow[j0 + j];
        }
        for (int k = 0; k < kn; ++k) acc[k] += dot(row + j0, qt + (k0 + k) * cols + j0, n);
      }
      for (int k = 0; k < kn; ++k) p[i * rank + k0 + k] = float(acc[k]);
    }
  }
}

CGX_CLONES void transpose_project(const float* m, const float* p, float* qt, int64_t rows,
                                  int64_t cols, int rank) {
  constexpr int64_t kRows = 256;  // rows summed in fp32 before the fp64 total takes them
  std::vector<double> total(size_t(rank) * size_t(cols), 0.0);
  std::vector<float> part(size_t(rank) * size_t(cols));
  for (int64_t i0 = 0; i0 < rows; i0 += kRows) {
    std::fill(part.begin(), part.end(), 0.f);
    const int64_t in = std::min(kRows, rows - i0);
    for (int64_t i = i0; i < i0 + in; ++i) {
      const float* row = m + i * cols;
      for (int k = 0; k < rank; ++k) {
        const float c = p[i * rank + k];
        float* out = part.data() + size_t(k) * size_t(cols);
        for (int64_t j = 0; j < cols; ++j) out[j] += c * row[j];
      }
    }
    for (size_t t = 0; t < part.size(); ++t) total[t] += part[t];
  }
  for (size_t t = 0; t < total.size(); ++t) qt[t] = float(total[t]);
}

CGX_CLONES void decompress(float* m, float* err, const float* p, const float* qt, int64_t rows,
                           int64_t cols, int rank) {
  float a[kBlock];
  for (int64_t i = 0; i < rows; ++i) {
    float* row = m + i * cols;
    float* erow = err ? err + i * cols : nullptr;
    const float* prow = p + i * rank;
    for (int64_t j0 = 0; j0 < cols; j0 += kBlock) {
      const int64_t n = std::min(kBlock, cols - j0);
      const float c0 = prow[0];
      for (int64_t j = 0; j < n; ++j) a[j] = c0 * qt[j0 + j];
      for (int k = 1; k < rank; ++k) {
        const float c = prow[k];
        const float* q = qt + k * cols + j0;
        for (int64_t j = 0; j < n; ++j) a[j] += c * q[j];
      }
      if (erow) {
        for (int64_t j = 0; j < n; ++j) erow[j0 + j] = row[j0 + j] - a[j];
      }
      std::copy(a, a + n, row + j0);
    }
  }
}

}  // namespace cgx::lowrank
