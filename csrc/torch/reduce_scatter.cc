// The compressed reduce-scatter's c10d side (FSDP2's gradients): which calls compress, the
// list and coalesced forms as one input, and the worker's job. The algorithm itself is torch-free
// (csrc/algorithms/reduce_scatter.h).
#include "algorithms/reduce_scatter.h"

#include <ATen/ops/empty.h>

#include <vector>

#include "c10d_transport.h"
#include "call_options.h"
#include "call_settings.h"
#include "dtype_map.h"
#include "process_group_cgx.h"

namespace cgx::binding {

std::function<void()> ProcessGroupCGX::reduce_scatter_job(at::Tensor output, at::Tensor input,
                                                          const c10d::ReduceScatterOptions& opts) {
  const auto op = opts.reduceOp.op_;
  const bool sum = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  const BackendConfig c = call_config();
  const bool fits = input.numel() == output.numel() * getSize() && input.is_contiguous() &&
                    output.is_contiguous() && input.scalar_type() == output.scalar_type();
  if (!sum || !fits || getSize() == 1 || !eligible(output, c)) return nullptr;
  check_native(c.compressor);
  const bool per_call = c.settings_per_call;
  if (!per_call && !compressible(output, c)) return nullptr;
  const bool average = op == c10d::ReduceOp::AVG;
  // On the worker, so that the ranks agree on this call's settings (and run the exact path, if
  // any, on the worker's own connection, in one order with the compressed allreduces).
  return [this, output, input, c, opts, per_call, average]() mutable {
    if (per_call) engine_.agree(c);
    if (compressible(output, c)) {
      engine_.reduce_scatter(output, input, c, average);
    } else {
      engine_.reduce_scatter_exact(output, input, opts);
    }
  };
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  if (plane_.serves(output, call_config().compressor)) {
    return plane_call("reduce_scatter_base", {output}, {input}, opts.reduceOp.op_, call_config());
  }
  auto job = reduce_scatter_job(output, input, opts);
  if (!job) return inner()->_reduce_scatter_base(output, input, opts);  // Gloo checks the rest
  return enqueue({output}, c10d::OpType::_REDUCE_SCATTER_BASE, std::move(job));
}

namespace {

// The list form's W inputs of one output, as one contiguous input (chunk j = inputs[j]); an
// undefined tensor when they do not all match the output.
at::Tensor joined_inputs(const std::vector<at::Tensor>& outputs,
                         const std::vector<std::vector<at::Tensor>>& inputs, int world) {
  if (outputs.size() != 1 || inputs.size() != 1 || inputs[0].size() != size_t(world)) return {};
  const at::Tensor& out = outputs[0];
  std::vector<at::Tensor> flat;
  for (const at::Tensor& t : inputs[0]) {
    if (t.sizes() != out.sizes() || t.scalar_type() != out.scalar_type() ||
        t.device() != out.device() || t.layout() != at::kStrided)
      return {};
    flat.push_back(t.reshape({-1}));
  }
  return at::cat(flat);
}

}  // namespace

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (plane_.serves(outputs, call_config().compressor) && inputs.size() == 1) {
    return plane_call("reduce_scatter", outputs, inputs[0], opts.reduceOp.op_, call_config());
  }
  at::Tensor input = joined_inputs(outputs, inputs, getSize());
  auto job = input.defined() ? reduce_scatter_job(outputs[0], input, opts) : nullptr;
  if (!job) return inner()->reduce_scatter(outputs, inputs, opts);
  return enqueue(outputs, c10d::OpType::REDUCE_SCATTER, std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  if (plane_.serves(outputs, call_config().compressor)) {
    return plane_call("reduce_scatter_coalesced", outputs, inputs, opts.reduceOp.op_,
                      call_config());
  }
  const int world = getSize();
  bool uniform = !outputs.empty() && outputs.size() == inputs.size();
  for (size_t i = 0; uniform && i < outputs.size(); ++i) {
    uniform = outputs[i].scalar_type() == outputs[0].scalar_type() &&
              inputs[i].scalar_type() == outputs[0].scalar_type() &&
              outputs[i].device() == outputs[0].device() &&
              inputs[i].device() == outputs[0].device() &&
              inputs[i].numel() == outputs[i].numel() * world && inputs[i].is_contiguous() &&
              outputs[i].layout() == at::kStrided;
  }
  if (!uniform) return inner()->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  // One fused piece: chunk j of the fused input is chunk j of every input in turn, so rank j owns
  // the concatenation of its outputs.
  std::vector<at::Tensor> rows;
  int64_t n = 0;
  for (size_t i = 0; i < outputs.size(); ++i) {
    rows.push_back(inputs[i].view({world, outputs[i].numel()}));
    n += outputs[i].numel();
  }
  at::Tensor input = at::cat(rows, 1).reshape({-1});
  at::Tensor output = at::empty({n}, outputs[0].options());
  auto job = reduce_scatter_job(output, input, opts);
  if (!job) return inner()->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
  return enqueue(outputs, c10d::OpType::COALESCED,
                 [job = std::move(job), output, outputs]() mutable {
                   job();
                   int64_t at = 0;
                   for (at::Tensor& t : outputs) {
                     t.copy_(output.narrow(0, at, t.numel()).view(t.sizes()));
                     at += t.numel();
                   }
                 });
}

// The algorithm is csrc/algorithms/reduce_scatter.cc; this adapts the tensors and counts bytes.
void Engine::reduce_scatter_compressed(at::Tensor& output, const at::Tensor& input,
                                       const BackendConfig& c, bool average) {
  AllreduceOptions o = to_options(c, average, calls_++);
  o.compressor = &compressor_for(c);
  // The host engine: a CUDA input is here only with data_plane="host" (the device plane takes
  // it otherwise); a CPU input is used as it is (cpu() returns the same tensor).
  const at::Tensor in = input.cpu();
  at::Tensor acc = at::empty({output.numel()}, in.options().dtype(at::kFloat));
  C10dTransport c10d(wire_);
  TimedTransport transport(c10d, stats_.wire_ns);
  CompressedReduceScatter rs;
  rs.run(transport, in.data_ptr(), to_cgx_dtype(in.scalar_type()), output.numel(), o,
         acc.data_ptr<float>());
  output.copy_(acc.view(output.sizes()));
  last_bytes_sent_ = int64_t(rs.bytes_sent());
  total_bytes_sent_ += last_bytes_sent_;
}

}  // namespace cgx::binding
