// A gradient bucket's reductions in one native call: the hooks' fused entry point
// (ProcessGroupCGX::reduce_bucket, torch_cgx/hooks/core.py). The caller's thread only checks the
// layout and enqueues one job; the worker stages each part (the spans of the bucket's buffer
// copied into one tensor, each plus its residual, padded to whole buckets and rotated per layer:
// what torch_cgx/hooks/levers.py's stage does), reduces the parts in order, then writes them back
// (rotated back) and hands each layer its residual (the error feedback of what it sent).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "call_options.h"

namespace cgx::binding {

// One reduction of a gradient bucket: the spans (offset, numel) of the buffer it covers, in
// increasing order, and how to stage them.
struct BucketPart {
  explicit BucketPart(CallOptions o) : options(std::move(o)) {}

  CallOptions options;  // not compressing: an exact reduction
  int64_t stream = -1;  // the call's random streams (-1: the group's call counter)
  std::vector<int64_t> offsets, numels;
  // Per span, or empty: added to the span before reducing (any floating dtype, numel values).
  std::vector<std::optional<at::Tensor>> residuals;
  // Per span, or empty: receives the span's new residual (fp32, contiguous, numel values).
  std::vector<at::Tensor> residuals_out;
  // Per span, or empty: the seed of each layer's rotation (split) or, without split, the first
  // seed rotates the whole concatenation (padded to whole buckets).
  std::vector<uint64_t> seeds;
  int64_t bucket_size = 1;
  bool split = false;  // each span padded to whole buckets with copies of its last value
  bool fp32 = false;   // staged in fp32, else in the buffer's dtype
  bool whole = false;  // the bucket's only part, covering all of the buffer

  // Layout (set by check_part) and the worker's tensors.
  struct Rotation {
    int64_t start, size;
    uint64_t seed;
  };
  std::vector<int64_t> starts, sizes;
  std::vector<Rotation> rotations;
  int64_t end = 0;        // values staged
  bool in_place = false;  // the buffer itself is reduced (residuals added in place)
  at::Tensor staged, residual;
};

// Checks `part` against `buf` (ValueError naming the problem) and lays it out.
void check_part(BucketPart& part, const at::Tensor& buf);
// On the worker: the staged tensor (and a zeroed residual when the part feeds back).
void stage_part(BucketPart& part, at::Tensor& buf);
// On the worker, after the reduction: rotated back into `buf`, residuals handed out.
void unstage_part(BucketPart& part, at::Tensor& buf);

}  // namespace cgx::binding
