#include "engine.h"

#include <ATen/core/Tensor.h>

#include "c10d_transport.h"
#include "call_options.h"
#include "call_settings.h"
#include "compressors/registry.h"
#include "dtype_map.h"

namespace cgx::binding {

Engine::Engine(int rank, int size, c10::intrusive_ptr<c10d::Backend> wire,
               std::chrono::milliseconds timeout)
    : rank_(rank), size_(size), wire_(std::move(wire)), timeout_(timeout) {}

void Engine::set_timeout(std::chrono::milliseconds timeout) {
  if (wire_) wire_->setTimeout(timeout);
  timeout_ = timeout;
}

void Engine::release() {
  wire_.reset();
  hierarchy_.reset();  // the node and cross-node Gloo groups, and the shared-memory mapping
}

void Engine::agree(const BackendConfig& c) {
  C10dTransport transport(wire_);
  agree_call_settings(transport, c);
}

// The worker's compressor for `c` (max-min too): the call's own, else the cache's, made again
// only when the settings change (not per call).
const Compressor& Engine::compressor_for(const BackendConfig& c) {
  if (call_compressor_) return *call_compressor_;
  std::map<std::string, double> params = compressor_params_of(c);
  if (!compressor_ || compressor_name_ != c.compressor || compressor_params_ != params) {
    compressor_ = make_compressor(c.compressor, params);
    compressor_name_ = c.compressor;
    compressor_params_ = std::move(params);
  }
  return *compressor_;
}

void Engine::allreduce(at::Tensor& t, const BackendConfig& c, bool average, float* residual,
                       std::shared_ptr<const Compressor> compressor) {
  CallClock clock(stats_);
  const int64_t sent0 = total_bytes_sent_;
  ++stats_.calls_compressed;
  stats_.bytes_exact += GroupStats::ring_allreduce_bytes(size_, 4 * t.numel());
  call_compressor_ = std::move(compressor);
  try {
    if (rotates(c)) {
      reduce_rotated(t, c, average, residual);
    } else {
      reduce_unrotated(t, c, average, residual);
    }
  } catch (...) {
    call_compressor_.reset();
    throw;
  }
  call_compressor_.reset();
  stats_.bytes_sent += total_bytes_sent_ - sent0;
}

void Engine::reduce_unrotated(at::Tensor& t, const BackendConfig& c, bool average,
                              float* residual) {
  if (hierarchy_) return reduce_hierarchical(t, c, average, residual);
  // Works on a contiguous CPU copy when t is not one. A CUDA tensor reaches this host engine only
  // with data_plane="host" (the device plane takes it otherwise: process_group_cgx.cc).
  at::Tensor work = t.contiguous().cpu();
  run_algorithm(wire_, work, c, average, residual);
  if (!work.is_same(t)) t.copy_(work);
}

void Engine::run_algorithm(const c10::intrusive_ptr<c10d::Backend>& over, at::Tensor& work,
                           const BackendConfig& c, bool average, float* residual) {
  AllreduceOptions o = to_options(c, average, calls_++);
  o.compressor = &compressor_for(c);
  o.residual = residual;
  C10dTransport c10d(over);
  TimedTransport transport(c10d, stats_.wire_ns);
  algorithm_.run(transport, work.data_ptr(), to_cgx_dtype(work.scalar_type()), work.numel(), o);
  last_bytes_sent_ = int64_t(algorithm_.bytes_sent());
  total_bytes_sent_ += last_bytes_sent_;
}

void Engine::allreduce_exact(at::Tensor& t, const c10d::ReduceOp& op) {
  // Gloo has no bfloat16 reduction and no AVG: reduce in fp32 (fp16 too: no overflow of the
  // sum) and divide afterwards.
  const bool low = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  const bool avg = op.op_ == c10d::ReduceOp::AVG;
  // Always a tensor of our own, never the caller's: Gloo's threads may hold the last reference
  // to what they reduce, and freeing a tensor that has a Python object takes the GIL, which a
  // thread cannot get while the interpreter exits (it is killed mid-unwind: std::terminate).
  at::Tensor work =
      low ? t.to(at::kCPU, at::kFloat, false, true)
          : t.to(at::kCPU, t.scalar_type(), false, true, at::MemoryFormat::Contiguous);
  std::vector<at::Tensor> v = {work};
  c10d::AllreduceOptions o;
  o.reduceOp = avg ? c10d::ReduceOp(c10d::ReduceOp::SUM) : op;
  const auto start = std::chrono::steady_clock::now();
  wire_->allreduce(v, o)->wait();
  stats_.wire_ns += ns_since(start);
  const int64_t sent = GroupStats::ring_allreduce_bytes(size_, int64_t(work.nbytes()));
  total_bytes_sent_ += sent;
  ++stats_.calls_exact;
  stats_.bytes_sent += sent;
  stats_.bytes_exact += sent;
  if (avg) work.div_(size_);
  if (!work.is_same(t)) t.copy_(work);
}

void Engine::reduce_scatter(at::Tensor& output, const at::Tensor& input, const BackendConfig& c,
                            bool average) {
  CallClock clock(stats_);
  const int64_t sent0 = total_bytes_sent_;
  ++stats_.reduce_scatter_compressed;
  stats_.bytes_exact += (size_ - 1) * 4 * input.numel() / size_;
  reduce_scatter_compressed(output, input, c, average);
  stats_.bytes_sent += total_bytes_sent_ - sent0;
}

void Engine::reduce_scatter_exact(at::Tensor& output, at::Tensor& input,
                                  const c10d::ReduceScatterOptions& opts) {
  const auto start = std::chrono::steady_clock::now();
  wire_->_reduce_scatter_base(output, input, opts)->wait();
  stats_.wire_ns += ns_since(start);
  // What a ring reduce-scatter sends: W - 1 of the W chunks, in the tensor's own dtype.
  const int64_t sent = (size_ - 1) * int64_t(input.nbytes()) / size_;
  ++stats_.reduce_scatter_exact;
  stats_.bytes_sent += sent;
  stats_.bytes_exact += sent;
}

}  // namespace cgx::binding
