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

}  // namespace cgx::binding
