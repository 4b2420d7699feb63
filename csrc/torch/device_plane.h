// The device plane's entry from the c10d adapter: CUDA tensors (and, with data_plane "device",
// every tensor) are compressed by tensor operations on their own device (torch_cgx/device/), not
// by the native engine. The group's creator (torch_cgx/backend.py) installs a Python callable and
// the backend that carries the device's payloads (NCCL, or Gloo where NCCL cannot serve); the
// adapter hands it the calls it serves and forwards their other collectives to that backend.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <vector>

#include "backend_config.h"
#include "external_compressors.h"

namespace cgx::binding {

struct DevicePlane {
  // (kind, outputs, inputs, reduce op, the call's settings) -> the call's Work. Kinds:
  // "allreduce_call" (allreduce_with / allreduce_call: outputs the tensor, inputs its residual,
  // if any; SUM or AVG; the settings hold the stream), "allreduce"
  // (outputs: the tensor), "allreduce_coalesced" (outputs: the tensors), "reduce_scatter" (outputs:
  // one output; inputs: its chunks in rank order), "reduce_scatter_base" and
  // "reduce_scatter_coalesced" (outputs and inputs pairwise). Called with the GIL taken.
  using Call = std::function<c10::intrusive_ptr<c10d::Work>(
      const std::string&, std::vector<at::Tensor>, std::vector<at::Tensor>, int64_t,
      const BackendConfig&)>;

  Call call;
  c10::intrusive_ptr<c10d::Backend> backend;  // carries the served tensors' other collectives
  bool every_tensor = false;                  // data_plane "device": CPU tensors too
  int64_t token = 0;  // names the Python side's plane (its counters: torch_cgx/counters.py)

  // `compressor`: the call's; one written in Python runs here on any device.
  bool serves(const at::Tensor& t, const std::string& compressor = "") const {
    return call && t.defined() &&
           (every_tensor || t.is_cuda() ||
            (!compressor.empty() && is_external_compressor(compressor)));
  }
  bool serves(const std::vector<at::Tensor>& ts, const std::string& compressor = "") const {
    return !ts.empty() && serves(ts[0], compressor);
  }
};

}  // namespace cgx::binding
