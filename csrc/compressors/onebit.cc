// onebit (Seide et al. 2014): one sign bit per value; per bucket the mean of its negative values
// and the mean of its non-negative values (sums (sum x -+ sum |x|) / 2 of prim::stats' fp64
// lanes), which the bits select on decode. Biased: pair it with
// error feedback (the original keeps the residual). A bucket holding NaN or Inf sends NaN means
// and decodes to NaN. Body: nb x (neg_mean f32, pos_mean f32), then n sign bits (1 = negative).
// Envelope param0: bucket size (0 = the whole tensor is one bucket).
#include <cmath>
#include <vector>

#include "sign_buckets.h"

namespace cgx {
namespace {

class OneBit final : public bucketed::SignBuckets<OneBit, 2> {
 public:
  OneBit(const ParamValues& p, uint8_t id) : SignBuckets("onebit", p, id) {}
  static void put_scalars(uint8_t* at, const prim::RangeStats& st, int64_t n) {
    const double neg = (st.sum - st.abs_sum) / 2, pos = (st.sum + st.abs_sum) / 2;
    const int64_t nneg = st.negatives, npos = n - nneg;
    const float nm = !st.finite ? NAN : nneg ? float(neg / double(nneg)) : 0.0f;
    const float pm = !st.finite ? NAN : npos ? float(pos / double(npos)) : 0.0f;
    bucketed::put_f32(at, nm);
    bucketed::put_f32(at + 4, pm);
  }
  static float value(const uint8_t* scalars, bool negative) {
    return bucketed::get_f32(scalars + (negative ? 0 : 4));
  }
};

}  // namespace

std::vector<ParamSpec> specs_onebit() {
  return {{"bucket_size", 512, 0, 4294967295.0, true, "values per pair of means; 0: whole tensor"}};
}

std::unique_ptr<Compressor> make_onebit(const ParamValues& p, uint8_t id) {
  return std::make_unique<OneBit>(p, id);
}

}  // namespace cgx
