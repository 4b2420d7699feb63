// GradDrop (Aji & Heafield 2017): drops the fraction `drop` of smallest
// magnitudes, sending the top 1 - drop as (index, value) pairs, with the
// threshold estimated from a random sample exactly as dgc does (k = ceil((1 -
// drop) * n), at most 2k sent, sample of max(ceil(sample_rate * n), 1024)
// values drawn with rng_key(ctx.seed, ctx.stream)). NaN ranks above +Inf.
// Stateless: the residual (R += g before, R = 0 at the sent indices after) is
// the caller's. Payload: docs/FORMAT.md, "Sparse compressors" ("dgc and graddrop").
#include <memory>
#include <vector>

#include "sparse_common.h"

namespace cgx {
namespace {

class GradDrop final : public sparse::PairCompressor {
 public:
  GradDrop(const char* name, uint8_t id, double drop, double sample_rate)
      : PairCompressor(name, id), keep_(1 - drop), sample_rate_(sample_rate) {}

 protected:
  std::vector<uint32_t> select(const void* in, DType dtype, int64_t count, const EncodeContext& ctx,
                               uint32_t* param1) const override {
    return sparse::sampled_select(in, dtype, count, sparse::count_for(keep_, count), sample_rate_,
                                  ctx, param1);
  }
  int64_t max_pairs(int64_t count) const override {
    return sparse::cap_for(sparse::count_for(keep_, count), count);
  }

 private:
  double keep_, sample_rate_;
};

}  // namespace

std::vector<ParamSpec> specs_graddrop() {
  return {{"drop", 0.999, 0, 1, false, "fraction of the values dropped, in [0, 1)"},
          {"sample_rate", 0.01, 0, 1, false,
           "fraction of the values sampled for the threshold, in (0, 1] (at least "
           "1024)"}};
}

std::unique_ptr<Compressor> make_graddrop(const ParamValues& params, uint8_t id) {
  CGX_CHECK_ARG(params.get("drop") < 1, "graddrop parameter drop must be in [0, 1), got ",
                params.get("drop"));
  sparse::check_positive(params, "graddrop", "sample_rate");
  return std::make_unique<GradDrop>("graddrop", id, params.get("drop"), params.get("sample_rate"));
}

}  // namespace cgx
