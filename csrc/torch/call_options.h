// How a call's settings become the algorithms' options, shared by the allreduce
// (process_group_cgx.cc) and the reduce-scatter (reduce_scatter.cc).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

#include "algorithms/allreduce.h"
#include "process_group_cgx.h"

namespace cgx::binding {

// Whether some bits setting would compress t (minimal_size is agreed at creation; bits may
// change per call).
bool eligible(const at::Tensor& t, const BackendConfig& c);
// Whether c compresses t now.
bool compressible(const at::Tensor& t, const BackendConfig& c);
AllreduceOptions to_options(const BackendConfig& c, bool average, uint64_t call_index);

// The buffer a reduction works on in fp32: t itself, flattened, when it is contiguous fp32 on
// the CPU (the result replaces it anyway), else an fp32 copy; finish() writes a copy back to t.
struct Fp32Work {
  at::Tensor flat;
  bool in_place = false;
  void finish(at::Tensor& t) const {
    if (!in_place) t.copy_(flat.view(t.sizes()));
  }
};
Fp32Work fp32_work(const at::Tensor& t);

}  // namespace cgx::binding
