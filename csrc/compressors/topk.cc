// Top-k sparsification (GRACE's TopKCompressor; Aji & Heafield 2017, Lin 2018
// without the momentum): the k = ceil(ratio * n) values of largest magnitude
// travel as (index, value) pairs, the rest decode as 0. Stateless: error
// feedback (accumulating what was not sent) is the caller's. Exact selection
// (prim::top_k): NaN ranks above +Inf, so it is always sent and arrives; ties
// go to the lower index. Values travel in the input dtype, bit for bit.
// Payload: docs/FORMAT.md, "Sparse compressors" ("topk").
#include <memory>
#include <vector>

#include "sparse_common.h"

namespace cgx {
namespace {

class TopK final : public sparse::PairCompressor {
 public:
  TopK(const char* name, uint8_t id, double ratio) : PairCompressor(name, id), ratio_(ratio) {}

 protected:
  std::vector<uint32_t> select(const void* in, DType dtype, int64_t count, const EncodeContext&,
                               uint32_t*) const override {
    return prim::top_k(in, dtype, count, max_pairs(count));
  }
  int64_t max_pairs(int64_t count) const override { return sparse::count_for(ratio_, count); }
  bool exact_pairs() const override { return true; }

 private:
  double ratio_;
};

}  // namespace

std::vector<ParamSpec> specs_topk() {
  return {
      {"ratio", 0.01, 0, 1, false, "fraction of the values sent, in (0, 1]: k = ceil(ratio n)"}};
}

std::unique_ptr<Compressor> make_topk(const ParamValues& params, uint8_t id) {
  sparse::check_positive(params, "topk", "ratio");
  return std::make_unique<TopK>("topk", id, params.get("ratio"));
}

}  // namespace cgx
