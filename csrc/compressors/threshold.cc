// Threshold sparsification (GRACE's ThresholdCompressor): every value with |x|
// >= tau travels as an (index, value) pair, the rest decode as 0. |x| is
// compared in fp32 with tau rounded to fp32; NaN counts as the largest
// magnitude (kept, arrives as NaN), +-Inf is kept; tau = 0 keeps every value.
// The payload size depends on the data (up to every value). Stateless: error
// feedback is the caller's. Payload: docs/FORMAT.md, "Sparse compressors" ("threshold").
#include <cfloat>
#include <memory>
#include <vector>

#include "sparse_common.h"

namespace cgx {
namespace {

class Threshold final : public sparse::PairCompressor {
 public:
  Threshold(const char* name, uint8_t id, double tau)
      : PairCompressor(name, id), tau_(float(tau)) {}

 protected:
  std::vector<uint32_t> select(const void* in, DType dtype, int64_t count, const EncodeContext&,
                               uint32_t* param1) const override {
    *param1 = float_bits(tau_);
    return sparse::select_at_least(in, dtype, count, tau_);
  }
  int64_t max_pairs(int64_t count) const override { return count; }

 private:
  float tau_;
};

}  // namespace

std::vector<ParamSpec> specs_threshold() {
  return {{"tau", 0.01, 0, double(FLT_MAX), false, "send the values with |x| >= tau"}};
}

std::unique_ptr<Compressor> make_threshold(const ParamValues& params, uint8_t id) {
  return std::make_unique<Threshold>("threshold", id, params.get("tau"));
}

}  // namespace cgx
