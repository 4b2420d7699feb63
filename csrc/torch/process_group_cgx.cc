#include "process_group_cgx.h"

#include <ATen/core/Tensor.h>

#include <algorithm>

#include "c10d_transport.h"
#include "core/error.h"
#include "dtype_map.h"

namespace cgx::binding {
namespace {

bool compressible(const at::Tensor& t, const BackendConfig& c) {
  return c.bits >= 1 && c.bits <= 8 && is_codec_dtype(t.scalar_type()) &&
         t.numel() >= std::max<int64_t>(c.minimal_size, 16);
}

}  // namespace

ProcessGroupCGX::ProcessGroupCGX(int rank, int size, c10::intrusive_ptr<c10d::Backend> inner,
                                 c10::intrusive_ptr<c10d::Backend> wire, BackendConfig config)
    : c10d::Backend(rank, size),
      inner_(std::move(inner)),
      wire_(std::move(wire)),
      config_(config),
      worker_([this] { worker_loop(); }) {}

ProcessGroupCGX::~ProcessGroupCGX() {
  {
    std::lock_guard<std::mutex> lk(queue_mu_);
    stopping_ = true;
  }
  queue_cv_.notify_all();
  worker_.join();
}

void ProcessGroupCGX::setTimeout(std::chrono::milliseconds timeout) {
  inner_->setTimeout(timeout);
  wire_->setTimeout(timeout);
}

BackendConfig ProcessGroupCGX::config() const {
  std::lock_guard<std::mutex> lk(config_mu_);
  return config_;
}

void ProcessGroupCGX::set_config(const BackendConfig& config) {
  std::lock_guard<std::mutex> lk(config_mu_);
  config_ = config;
}

// ---- worker ---------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::enqueue(std::vector<at::Tensor> outputs,
                                                        c10d::OpType type,
                                                        std::function<void()> fn) {
  auto work = c10::make_intrusive<CGXWork>(getRank(), type, std::move(outputs));
  {
    std::lock_guard<std::mutex> lk(queue_mu_);
    queue_.emplace_back(work, std::move(fn));
  }
  queue_cv_.notify_one();
  return work;
}

void ProcessGroupCGX::worker_loop() {
  std::unique_lock<std::mutex> lk(queue_mu_);
  for (;;) {
    queue_cv_.wait(lk, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything queued has run
    auto [work, fn] = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lk.unlock();
    std::exception_ptr error;
    try {
      fn();
    } catch (...) {
      error = std::current_exception();
    }
    work->finish(error);
    lk.lock();
    busy_ = false;
    if (queue_.empty()) idle_cv_.notify_all();
  }
}

void ProcessGroupCGX::flush() {
  std::unique_lock<std::mutex> lk(queue_mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !busy_; });
}

void ProcessGroupCGX::reduce_compressed(at::Tensor& t, const BackendConfig& c, bool average) {
  // Works on a contiguous CPU copy when t is not one (CUDA tensors: staged through the host).
  at::Tensor work = t.contiguous().cpu();
  AllreduceOptions o;
  o.codec.bits = c.bits;
  o.codec.bucket_size = c.bucket_size;
  o.codec.skip_incomplete_buckets = c.skip_incomplete_buckets;
  o.codec.rounding = c.stochastic ? Rounding::kStochastic : Rounding::kNearest;
  o.codec.seed = c.seed;
  o.algorithm = Algorithm(c.algorithm);
  o.average = average;
  o.fusion_bytes = size_t(c.fusion_buffer_bytes);
  o.segment_bytes = size_t(c.pipeline_segment_bytes);
  o.call_index = calls_++;
  C10dTransport transport(wire_);
  algorithm_.run(transport, work.data_ptr(), to_cgx_dtype(work.scalar_type()), work.numel(), o);
  last_bytes_sent_ = int64_t(algorithm_.bytes_sent());
  total_bytes_sent_ += last_bytes_sent_;
  if (!work.is_same(t)) t.copy_(work);
}

void ProcessGroupCGX::reduce_exact(at::Tensor& t, c10d::ReduceOp::RedOpType op) {
  // Gloo has no bfloat16 reduction and no AVG: reduce in fp32 (fp16 too: no overflow of the
  // sum) and divide afterwards.
  const bool low = t.scalar_type() == at::kHalf || t.scalar_type() == at::kBFloat16;
  at::Tensor work = low ? t.to(at::kCPU, at::kFloat) : t.contiguous().cpu();
  std::vector<at::Tensor> v = {work};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp(op == c10d::ReduceOp::AVG ? c10d::ReduceOp::SUM : op);
  wire_->allreduce(v, o)->wait();
  total_bytes_sent_ += 2 * (getSize() - 1) * int64_t(work.nbytes()) / getSize();
  if (op == c10d::ReduceOp::AVG) work.div_(getSize());
  if (!work.is_same(t)) t.copy_(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cgx allreduce takes one tensor, got ", tensors.size());
  at::Tensor t = tensors[0];
  const auto op = opts.reduceOp.op_;
  const bool floating = at::isFloatingType(t.scalar_type());
  TORCH_CHECK_VALUE(op != c10d::ReduceOp::AVG || floating,
                    "ReduceOp.AVG needs a floating-point tensor, got ", t.scalar_type());
  const BackendConfig c = config();
  if ((op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG) && compressible(t, c)) {
    const bool average = op == c10d::ReduceOp::AVG;
    return enqueue(tensors, c10d::OpType::ALLREDUCE,
                   [this, t, c, average]() mutable { reduce_compressed(t, c, average); });
  }
  if (op == c10d::ReduceOp::AVG || t.scalar_type() == at::kBFloat16) {
    return enqueue(tensors, c10d::OpType::ALLREDUCE,
                   [this, t, op]() mutable { reduce_exact(t, op); });
  }
  return inner_->allreduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_with(at::Tensor tensor,
                                                               const BackendConfig& config,
                                                               bool average) {
  TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()),
                    "allreduce_with needs a floating-point tensor, got ", tensor.scalar_type());
  std::vector<at::Tensor> outputs = {tensor};
  if (compressible(tensor, config)) {
    return enqueue(outputs, c10d::OpType::ALLREDUCE, [this, tensor, config, average]() mutable {
      reduce_compressed(tensor, config, average);
    });
  }
  const auto op = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
  return enqueue(outputs, c10d::OpType::ALLREDUCE,
                 [this, tensor, op]() mutable { reduce_exact(tensor, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::barrier(const c10d::BarrierOptions& opts) {
  flush();
  return inner_->barrier(opts);
}

// ---- forwarded ------------------------------------------------------------------------------

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  return inner_->broadcast(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  return inner_->allreduce_coalesced(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce(std::vector<at::Tensor>& tensors,
                                                       const c10d::ReduceOptions& opts) {
  return inner_->reduce(tensors, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  return inner_->_allgather_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather_coalesced(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  return inner_->allgather_into_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::gather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::GatherOptions& opts) {
  return inner_->gather(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ScatterOptions& opts) {
  return inner_->scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_->reduce_scatter(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  return inner_->_reduce_scatter_base(output, input, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  return inner_->reduce_scatter_tensor_coalesced(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  return inner_->alltoall_base(output, input, output_splits, input_splits, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::alltoall(std::vector<at::Tensor>& outputs,
                                                         std::vector<at::Tensor>& inputs,
                                                         const c10d::AllToAllOptions& opts) {
  return inner_->alltoall(outputs, inputs, opts);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  return inner_->send(tensors, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  return inner_->recv(tensors, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::recvAnysource(std::vector<at::Tensor>& tensors,
                                                              int tag) {
  return inner_->recvAnysource(tensors, tag);
}

}  // namespace cgx::binding
