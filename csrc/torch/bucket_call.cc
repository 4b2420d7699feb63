// A gradient bucket's reductions in one native call (bucket_call.h).
#include "bucket_call.h"

#include <ATen/ATen.h>

#include "core/error.h"
#include "core/rotation.h"

namespace cgx::binding {
namespace {

int64_t padded(int64_t numel, int64_t bucket_size, bool split) {
  return split ? (numel + bucket_size - 1) / bucket_size * bucket_size : numel;
}

void check_spans(const BucketPart& p, const at::Tensor& buf) {
  const size_t n = p.offsets.size();
  CGX_CHECK_ARG(p.numels.size() == n && n > 0,
                "a bucket part needs offsets and numels of one "
                "non-zero length, got ",
                n, " and ", p.numels.size());
  int64_t at = 0;
  for (size_t i = 0; i < n; ++i) {
    CGX_CHECK_ARG(
        p.offsets[i] >= at && p.numels[i] >= 0 && p.offsets[i] + p.numels[i] <= buf.numel(),
        "bucket spans must be increasing, not overlapping and inside the buffer (", buf.numel(),
        " values): span ", i, " is (", p.offsets[i], ", ", p.numels[i], ")");
    at = p.offsets[i] + p.numels[i];
  }
  CGX_CHECK_ARG(p.residuals.empty() || p.residuals.size() == n,
                "residuals: one per span (or none), got ", p.residuals.size(), " for ", n);
  CGX_CHECK_ARG(p.residuals_out.empty() || p.residuals_out.size() == n,
                "residuals_out: one per span (or none), got ", p.residuals_out.size(), " for ", n);
  CGX_CHECK_ARG(p.seeds.empty() || p.seeds.size() == n, "seeds: one per span (or none), got ",
                p.seeds.size(), " for ", n);
  for (size_t i = 0; i < p.residuals.size(); ++i) {
    const auto& r = p.residuals[i];
    CGX_CHECK_ARG(!r || (r->device().is_cpu() && at::isFloatingType(r->scalar_type()) &&
                         r->numel() == p.numels[i]),
                  "residual ", i, " must be a floating CPU tensor of ", p.numels[i], " values");
  }
  for (size_t i = 0; i < p.residuals_out.size(); ++i) {
    const at::Tensor& r = p.residuals_out[i];
    CGX_CHECK_ARG(r.scalar_type() == at::kFloat && r.device().is_cpu() && r.is_contiguous() &&
                      r.numel() == p.numels[i],
                  "residual output ", i, " must be a contiguous CPU float32 tensor of ",
                  p.numels[i], " values");
  }
}

}  // namespace

void check_part(BucketPart& p, const at::Tensor& buf) {
  check_spans(p, buf);
  CGX_CHECK_ARG(p.bucket_size >= 1, "bucket_size must be >= 1, got ", p.bucket_size);
  CGX_CHECK_ARG(p.stream >= -1, "stream must be >= 0, or -1 for the group's call counter, got ",
                p.stream);
  const bool fp32 = p.fp32 || buf.scalar_type() == at::kFloat;
  CGX_CHECK_ARG(p.seeds.empty() || (fp32 && rotation::valid_block(p.bucket_size)),
                "rotation needs fp32 staging and a bucket_size that is a power of two in [2, "
                "2^20], got ",
                p.bucket_size);
  if (p.whole) {
    int64_t covered = 0;
    for (int64_t n : p.numels) covered += n;
    CGX_CHECK_ARG(p.offsets.front() == 0 && covered == buf.numel(),
                  "a whole part must cover the buffer's ", buf.numel(), " values with its spans");
  }
  p.starts.clear();
  p.sizes.clear();
  p.rotations.clear();
  int64_t pos = 0;
  for (size_t i = 0; i < p.numels.size(); ++i) {
    p.starts.push_back(pos);
    p.sizes.push_back(padded(p.numels[i], p.bucket_size, p.split));
    pos += p.sizes.back();
  }
  if (!p.seeds.empty() && !p.split) {
    p.rotations.push_back({0, padded(pos, p.bucket_size, true), p.seeds[0]});
  } else {
    for (size_t i = 0; i < p.seeds.size(); ++i) {
      p.rotations.push_back({p.starts[i], p.sizes[i], p.seeds[i]});
    }
  }
  p.end = pos;
  for (const auto& r : p.rotations) p.end = std::max(p.end, r.start + r.size);
  // The rule of core.stage: the buffer itself when the call covers all of it in its own dtype,
  // unpadded and unrotated.
  p.in_place = p.whole && (!p.split || p.numels.size() == 1) && p.seeds.empty() &&
               (!p.fp32 || buf.scalar_type() == at::kFloat);
}

void stage_part(BucketPart& p, at::Tensor& buf) {
  const auto dtype = p.fp32 ? at::kFloat : buf.scalar_type();
  const size_t n = p.numels.size();
  if (p.in_place) {
    for (size_t i = 0; i < p.residuals.size(); ++i) {
      if (p.residuals[i]) buf.narrow(0, p.offsets[i], p.numels[i]).add_(p.residuals[i]->to(dtype));
    }
    p.staged = buf;
  } else {
    at::Tensor out = at::empty({p.end}, buf.options().dtype(dtype));
    int64_t pos = 0;
    for (size_t i = 0; i < n; ++i) {
      const int64_t len = p.numels[i], size = p.sizes[i];
      at::Tensor part = out.narrow(0, p.starts[i], len);
      part.copy_(buf.narrow(0, p.offsets[i], len));
      if (i < p.residuals.size() && p.residuals[i]) part.add_(p.residuals[i]->to(dtype));
      if (size > len && len > 0) {  // copies of the last value: the last bucket's range stays
        out.narrow(0, p.starts[i] + len, size - len)
            .copy_(part.narrow(0, len - 1, 1).expand({size - len}));
      }
      pos = p.starts[i] + size;
    }
    if (p.end > pos && pos > 0) {  // the last value sent (with its residual)
      out.narrow(0, pos, p.end - pos).copy_(out.narrow(0, pos - 1, 1).expand({p.end - pos}));
    }
    for (const auto& r : p.rotations) {
      rotation::rotate(out.data_ptr<float>() + r.start, r.size, p.bucket_size, r.seed, true);
    }
    p.staged = out;
  }
  if (!p.residuals_out.empty()) p.residual = at::zeros({p.staged.numel()}, at::kFloat);
}

void unstage_part(BucketPart& p, at::Tensor& buf) {
  float* res = p.residual.defined() ? p.residual.data_ptr<float>() : nullptr;
  for (const auto& r : p.rotations) {
    rotation::rotate(p.staged.data_ptr<float>() + r.start, r.size, p.bucket_size, r.seed, false);
    // R^T (R x - Q(R x)) = x - R^T Q(R x): the error where x lives
    if (res != nullptr) rotation::rotate(res + r.start, r.size, p.bucket_size, r.seed, false);
  }
  const std::vector<int64_t>& at = p.in_place ? p.offsets : p.starts;
  for (size_t i = 0; i < p.numels.size(); ++i) {
    if (!p.in_place) {
      buf.narrow(0, p.offsets[i], p.numels[i]).copy_(p.staged.narrow(0, at[i], p.numels[i]));
    }
    if (res != nullptr) p.residuals_out[i].copy_(p.residual.narrow(0, at[i], p.numels[i]));
  }
  p.staged.reset();
  p.residual.reset();
}

}  // namespace cgx::binding
