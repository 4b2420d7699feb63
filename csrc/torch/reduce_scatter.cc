// The compressed reduce-scatter (FSDP2's gradients): chunk j of the input belongs to rank j. Each
// rank encodes the W - 1 chunks it does not own (each value quantized once), one alltoall
// delivers them (sizes first: data-dependent compressors), and the owner adds them, decoded, to
// its own chunk in fp32. Bound and bytes: docs/algorithms.md ("One-shot reduce-scatter").
#include <vector>

#include "algorithms/payload.h"
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
  const bool per_call = c.settings_per_call;
  if (!per_call && !compressible(output, c)) return nullptr;
  const bool average = op == c10d::ReduceOp::AVG;
  // On the worker, so that the ranks agree on this call's settings (and run the exact path, if
  // any, on the worker's own connection, in one order with the compressed allreduces).
  return [this, output, input, c, opts, per_call, average]() mutable {
    if (per_call) {
      C10dTransport transport(wire_);
      agree_call_settings(transport, c);
    }
    if (compressible(output, c)) {
      reduce_scatter_compressed(output, input, c, average);
    } else {
      wire_->_reduce_scatter_base(output, input, opts)->wait();
    }
  };
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
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
  at::Tensor input = joined_inputs(outputs, inputs, getSize());
  auto job = input.defined() ? reduce_scatter_job(outputs[0], input, opts) : nullptr;
  if (!job) return inner()->reduce_scatter(outputs, inputs, opts);
  return enqueue(outputs, c10d::OpType::REDUCE_SCATTER, std::move(job));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
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

void ProcessGroupCGX::reduce_scatter_compressed(at::Tensor& output, const at::Tensor& input,
                                                const BackendConfig& c, bool average) {
  AllreduceOptions o = to_options(c, average, calls_++);
  if (c.compressor != "maxmin") o.compressor = &compressor_for(c);
  const int world = getSize(), me = getRank();
  const int64_t n = output.numel();
  const at::Tensor in = input.cpu();
  const DType dtype = to_cgx_dtype(in.scalar_type());
  const size_t cap = payload_size(o, n, dtype), elem = in.element_size();
  std::vector<uint8_t> send(cap * static_cast<size_t>(world));
  std::vector<size_t> send_sizes(static_cast<size_t>(world), 0);
  size_t at = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    const auto* chunk = static_cast<const uint8_t*>(in.data_ptr()) + size_t(j) * size_t(n) * elem;
    const Streams s = streams_for(o, 0, me, j, 0);
    send_sizes[size_t(j)] = encode_payload(o, chunk, dtype, n, s, send.data() + at, cap);
    at += send_sizes[size_t(j)];
  }
  C10dTransport transport(wire_);
  std::vector<uint64_t> my_sizes(send_sizes.begin(), send_sizes.end());
  std::vector<uint64_t> their_sizes(static_cast<size_t>(world));
  const std::vector<size_t> eight(static_cast<size_t>(world), sizeof(uint64_t));
  transport.alltoallv(reinterpret_cast<const uint8_t*>(my_sizes.data()), eight,
                      reinterpret_cast<uint8_t*>(their_sizes.data()), eight);
  std::vector<size_t> recv_sizes(their_sizes.begin(), their_sizes.end());
  size_t total = 0;
  for (size_t b : recv_sizes) total += b;
  std::vector<uint8_t> recv(total);
  transport.alltoallv(send.data(), send_sizes, recv.data(), recv_sizes);
  at::Tensor acc = in.narrow(0, int64_t(me) * n, n).to(at::kFloat, false, true);
  size_t from = 0;
  for (int j = 0; j < world; ++j) {
    if (j == me) continue;
    decode_payload(o, recv.data() + from, recv_sizes[size_t(j)], acc.data_ptr<float>(),
                   DType::kFloat32, n, /*add=*/true);
    from += recv_sizes[size_t(j)];
  }
  if (average) acc.div_(world);
  output.copy_(acc.view(output.sizes()));
  last_bytes_sent_ = int64_t(at + eight.size() * sizeof(uint64_t));
  total_bytes_sent_ += last_bytes_sent_;
}

}  // namespace cgx::binding
