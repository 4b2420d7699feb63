// Deep Gradient Compression's selection (Lin et al. 2018): a threshold
// estimated from a random sample of |x| (prim::sampled_threshold) keeps about k
// = ceil(ratio * n) values, sent as (index, value) pairs; when the estimate
// lets through more than 2k, the 2k largest are kept. The sample takes
// max(ceil(sample_rate * n), 1024) values (all of them when n <= 1024: the
// threshold is then exact), drawn with rng_key(ctx.seed, ctx.stream). NaN ranks
// above +Inf. Stateless: momentum correction, local clipping, the accumulation
// of what was not sent and momentum-factor masking (zeroing u and v at the sent
// indices) are the caller's. Payload: docs/FORMAT.md, "Sparse compressors" ("dgc and
// graddrop").
#include <memory>
#include <vector>

#include "sparse_common.h"

namespace cgx {
namespace {

class Dgc final : public sparse::PairCompressor {
 public:
  Dgc(const char* name, uint8_t id, double ratio, double sample_rate)
      : PairCompressor(name, id), ratio_(ratio), sample_rate_(sample_rate) {}

 protected:
  std::vector<uint32_t> select(const void* in, DType dtype, int64_t count, const EncodeContext& ctx,
                               uint32_t* param1) const override {
    return sparse::sampled_select(in, dtype, count, sparse::count_for(ratio_, count), sample_rate_,
                                  ctx, param1);
  }
  int64_t max_pairs(int64_t count) const override {
    return sparse::cap_for(sparse::count_for(ratio_, count), count);
  }

 private:
  double ratio_, sample_rate_;
};

}  // namespace

std::vector<ParamSpec> specs_dgc() {
  return {{"ratio", 0.001, 0, 1, false, "fraction of the values sent, in (0, 1]"},
          {"sample_rate", 0.01, 0, 1, false,
           "fraction of the values sampled for the threshold, in (0, 1] (at least "
           "1024)"}};
}

std::unique_ptr<Compressor> make_dgc(const ParamValues& params, uint8_t id) {
  sparse::check_positive(params, "dgc", "ratio");
  sparse::check_positive(params, "dgc", "sample_rate");
  return std::make_unique<Dgc>("dgc", id, params.get("ratio"), params.get("sample_rate"));
}

}  // namespace cgx
