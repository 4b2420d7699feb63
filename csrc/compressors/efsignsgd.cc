// EF-signSGD (Karimireddy et al. 2019): the signs, scaled per bucket by the mean magnitude
// ||x||_1 / n of the bucket, so that the scaled sign keeps the bucket's l1 mass. Biased by
// design: meant to run with error feedback. A bucket holding NaN or Inf sends a NaN scale and
// decodes to NaN. Body: nb x scale f32, then n sign bits (1 = negative). Envelope param0: bucket
// size (0, the default: the whole tensor is one bucket, as in the paper).
#include <cmath>
#include <vector>

#include "sign_buckets.h"

namespace cgx {
namespace {

class EFSignSGD final : public bucketed::SignBuckets<EFSignSGD, 1> {
 public:
  EFSignSGD(const ParamValues& p, uint8_t id) : SignBuckets("efsignsgd", p, id) {}
  static void put_scalars(uint8_t* at, const prim::RangeStats& s, int64_t n) {
    bucketed::put_f32(at, s.finite ? float(s.abs_sum / double(n)) : NAN);
  }
  static float value(const uint8_t* scalars, bool negative) {
    const float scale = bucketed::get_f32(scalars);
    return negative ? -scale : scale;
  }
};

}  // namespace

std::vector<ParamSpec> specs_efsignsgd() {
  return {{"bucket_size", 0, 0, 4294967295.0, true, "values per scale; 0: whole tensor"}};
}

std::unique_ptr<Compressor> make_efsignsgd(const ParamValues& p, uint8_t id) {
  return std::make_unique<EFSignSGD>(p, id);
}

}  // namespace cgx
