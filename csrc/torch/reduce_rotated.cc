// The backend's rotation lever (CGX_COMPRESSION_ROTATION, docs/accuracy.md section 4): every
// full bucket of the buffer rotated (core/rotation.h) before the compressed allreduce and rotated
// back after, the residual too.
#include "call_options.h"
#include "core/rotation.h"
#include "process_group_cgx.h"

namespace cgx::binding {

namespace {

// The same on every rank: the group's seed and the call's agreed stream, or the count of rotated
// calls before this one (every rank makes the same calls in the same order).
uint64_t rotation_seed(const BackendConfig& c, uint64_t call) {
  return c.seed * 1000003u + (c.stream >= 0 ? uint64_t(c.stream) : call) + 1;
}

}  // namespace

// Every full bucket of an fp32 copy rotated (the same seed on every rank: the ranks reduce in
// the rotated domain, the rotation being linear), reduced, and rotated back, with the residual.
void ProcessGroupCGX::reduce_rotated(at::Tensor& t, const BackendConfig& c, bool average,
                                     float* residual) {
  const uint64_t seed = rotation_seed(c, rotated_calls_++);
  Fp32Work work = fp32_work(t);
  const int64_t full = work.flat.numel() / c.bucket_size * c.bucket_size;
  rotation::rotate(work.flat.data_ptr<float>(), full, c.bucket_size, seed, true);
  reduce_unrotated(work.flat, c, average, residual);
  rotation::rotate(work.flat.data_ptr<float>(), full, c.bucket_size, seed, false);
  if (residual) rotation::rotate(residual, full, c.bucket_size, seed, false);
  work.finish(t);
}

}  // namespace cgx::binding
