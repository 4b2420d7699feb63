// The backend's rotation lever (CGX_COMPRESSION_ROTATION, docs/accuracy.md section 4), over the
// torch-free wrapper csrc/algorithms/rotated.h: this file only picks the seed and adapts tensors.
#include <ATen/ops/from_blob.h>

#include "algorithms/rotated.h"
#include "call_options.h"
#include "engine.h"

namespace cgx::binding {

// Every full bucket of an fp32 copy rotated (the same seed on every rank: the group's seed and
// the call's agreed stream, or the count of rotated calls before this one), reduced, and rotated
// back, with the residual.
void Engine::reduce_rotated(at::Tensor& t, const BackendConfig& c, bool average, float* residual) {
  const uint64_t call = rotated_calls_++;
  const uint64_t seed = rotation_seed(c.seed, c.stream >= 0 ? uint64_t(c.stream) : call);
  Fp32Work work = fp32_work(t);
  with_rotation(work.flat.data_ptr<float>(), work.flat.numel(), c.bucket_size, seed, residual,
                [&](float* data, int64_t n, float* res) {
                  at::Tensor rotated =
                      at::from_blob(data, {n}, at::TensorOptions().dtype(at::kFloat));
                  reduce_unrotated(rotated, c, average, res);
                });
  work.finish(t);
}

}  // namespace cgx::binding
