// The collectives the cgx backend forwards unchanged to its inner Gloo backend (the device plane's
// backend for the tensors it serves), from the caller's thread (see process_group_cgx.h).
#include "process_group_cgx.h"

namespace cgx::binding {

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return inner(tensors.empty() ? at::Tensor() : tensors[0])->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return inner(tensors.empty() ? at::Tensor() : tensors[0])->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner(inputs.empty() ? at::Tensor() : inputs[0])->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return inner(input)->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner(inputs.empty() ? at::Tensor() : inputs[0])
      ->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner(inputs.empty() ? at::Tensor() : inputs[0])
      ->allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return inner(inputs.empty() ? at::Tensor() : inputs[0])->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return inner(outputs.empty() ? at::Tensor() : outputs[0])->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  return inner(input)->alltoall_base(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return inner(inputs.empty() ? at::Tensor() : inputs[0])->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return inner(tensors.empty() ? at::Tensor() : tensors[0])->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return inner(tensors.empty() ? at::Tensor() : tensors[0])->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return inner(tensors.empty() ? at::Tensor() : tensors[0])->recvAnysource(tensors, tag);
}

}  // namespace cgx::binding
