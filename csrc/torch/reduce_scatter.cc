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

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  const auto op = opts.reduceOp.op_;
  const bool sum = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  const BackendConfig c = call_config();
  const bool fits = input.numel() == output.numel() * getSize() && input.is_contiguous() &&
                    output.is_contiguous() && input.scalar_type() == output.scalar_type();
  if (!sum || !fits || getSize() == 1 || !eligible(output, c)) {
    return inner()->_reduce_scatter_base(output, input, opts);  // Gloo checks the rest
  }
  const bool average = op == c10d::ReduceOp::AVG;
  const bool per_call = c.settings_per_call;
  if (!per_call && !compressible(output, c))
    return inner()->_reduce_scatter_base(output, input, opts);
  // On the worker, so that the ranks agree on this call's settings (and run the exact path, if
  // any, on the worker's own connection, in one order with the compressed allreduces).
  return enqueue({output}, c10d::OpType::_REDUCE_SCATTER_BASE,
                 [this, output, input, c, opts, per_call, average]() mutable {
                   if (per_call) {
                     C10dTransport transport(wire_);
                     agree_call_settings(transport, c);
                   }
                   if (compressible(output, c)) {
                     reduce_scatter_compressed(output, input, c, average);
                   } else {
                     wire_->_reduce_scatter_base(output, input, opts)->wait();
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
