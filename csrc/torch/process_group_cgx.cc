#include "process_group_cgx.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <set>
#include <thread>

#include "bucket_call.h"
#include "c10d_transport.h"
#include "call_options.h"
#include "compressors/registry.h"
#include "core/error.h"
#include "dtype_map.h"

namespace cgx::binding {
namespace {

std::mutex g_live_mu;
std::set<ProcessGroupCGX*> g_live;  // every constructed, not yet destroyed group

}  // namespace

ProcessGroupCGX::ProcessGroupCGX(int rank, int size, c10::intrusive_ptr<c10d::Backend> inner,
                                 c10::intrusive_ptr<c10d::Backend> wire, BackendConfig config,
                                 c10::intrusive_ptr<c10d::Store> store,
                                 std::chrono::milliseconds timeout)
    : c10d::Backend(rank, size),
      inner_(std::move(inner)),
      store_(std::move(store)),
      settings_(config),
      engine_(rank, size, std::move(wire), timeout),
      worker_(timeout) {
  std::lock_guard<std::mutex> lk(g_live_mu);
  g_live.insert(this);
}

ProcessGroupCGX::~ProcessGroupCGX() {
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    g_live.erase(this);
  }
  stop_threads();
}

void ProcessGroupCGX::stop_threads() {
  // Python drops the last reference with the GIL held, and the worker may need the GIL to finish
  // what is queued (Python callbacks, releasing tensors that have a Python object): join
  // without it.
  auto stop = [this] {
    worker_.stop();
    // Gloo's threads go too, now: they may free the last reference to a tensor with a Python
    // object, which needs the GIL, and at interpreter exit a thread that asks for it is killed.
    // The inner and the engine's Gloo groups go in parallel: joining each one's threads took
    // about 25 ms under load, and the sooner rank 0 (the store's host) is done, the narrower
    // the window in which a group created next on the same port meets the old server
    // (docs/reliability.md, section 7).
    std::thread inner_gone(
        [inner = std::move(inner_), device = std::move(plane_.backend)]() mutable {
          inner.reset();
          device.reset();
        });
    engine_.release();
    inner_gone.join();
  };
  if (Py_IsInitialized() && PyGILState_Check()) {
    plane_.call = nullptr;  // a Python callable: goes while this thread holds the GIL
    pybind11::gil_scoped_release no_gil;
    stop();
  } else {
    stop();
  }
}

void ProcessGroupCGX::shutdown() {
  stop_threads();
  if (!departure_.armed() || !store_) return;
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;  // the waits take up to seconds
    departure_.leave(*store_);
  } else {
    departure_.leave(*store_);
  }
}

void ProcessGroupCGX::shutdown_all() {
  std::vector<ProcessGroupCGX*> live;
  {
    std::lock_guard<std::mutex> lk(g_live_mu);
    live.assign(g_live.begin(), g_live.end());
  }
  for (ProcessGroupCGX* pg : live) pg->stop_threads();
}

const c10::intrusive_ptr<c10d::Backend>& ProcessGroupCGX::inner() const {
  TORCH_CHECK(!worker_.stopped() && inner_, "cgx: the group has stopped (the process is exiting)");
  return inner_;
}

const c10::intrusive_ptr<c10d::Backend>& ProcessGroupCGX::inner(const at::Tensor& t) const {
  if (plane_.backend && plane_.serves(t) && t.is_cuda()) {
    TORCH_CHECK(!worker_.stopped(), "cgx: the group has stopped (the process is exiting)");
    return plane_.backend;
  }
  return inner();
}

void ProcessGroupCGX::setTimeout(std::chrono::milliseconds timeout) {
  inner()->setTimeout(timeout);
  engine_.set_timeout(timeout);
  worker_.set_timeout(timeout);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::plane_call(const std::string& kind,
                                                           std::vector<at::Tensor> outputs,
                                                           std::vector<at::Tensor> inputs,
                                                           int64_t op, const BackendConfig& c) {
  const bool sum = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  // As natively: the coalesced tensors count as the one piece they are reduced as.
  int64_t n = 0;
  for (const at::Tensor& t : outputs) n += t.numel();
  const bool coalesced = kind == "allreduce_coalesced";
  if (sum && c.settings_per_call && !c.planned && getSize() > 1 && !outputs.empty() &&
      is_codec_dtype(outputs[0].scalar_type()) &&
      (coalesced ? n : outputs[0].numel()) >=
          std::max<int64_t>(c.minimal_size, rules::kMinSizeFloor)) {
    auto agreed = enqueue({}, c10d::OpType::ALLREDUCE, [this, c]() { engine_.agree(c); });
    if (PyGILState_Check()) {
      pybind11::gil_scoped_release no_gil;  // queued work's callbacks may need it
      agreed->wait();
    } else {
      agreed->wait();
    }
  }
  return plane_.call(kind, std::move(outputs), std::move(inputs), op, c);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cgx allreduce takes one tensor, got ", tensors.size());
  const BackendConfig c = call_config(tensors[0].numel());
  if (plane_.serves(tensors, c.compressor)) {
    return plane_call("allreduce", tensors, {}, opts.reduceOp.op_, c);
  }
  check_native(c.compressor);
  if (c.compressor == kAutoCompressor && opts.reduceOp.op_ != c10d::ReduceOp::AVG) {
    return inner()->allreduce(tensors, opts);  // planned exact: Gloo's own, no worker hop
  }
  return enqueue(tensors, c10d::OpType::ALLREDUCE, reduce_job(tensors[0], c, opts.reduceOp));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
  int64_t n = 0;
  for (const at::Tensor& t : tensors) n += t.numel();
  if (plane_.serves(tensors, call_config(n).compressor)) {
    return plane_call("allreduce_coalesced", tensors, {}, opts.reduceOp.op_, call_config(n));
  }
  check_native(call_config(n).compressor);
  bool uniform = true;
  for (const at::Tensor& t : tensors) {
    uniform = uniform && t.scalar_type() == tensors[0].scalar_type() &&
              t.device() == tensors[0].device() && t.layout() == at::kStrided;
  }
  if (!uniform) return inner()->allreduce_coalesced(tensors, opts);  // Gloo names the problem
  // One fused piece: the flattened tensors reduced like one allreduce (compressed when the
  // settings say so), then copied back.
  std::vector<at::Tensor> flat_views;
  for (const at::Tensor& t : tensors) flat_views.push_back(t.reshape({-1}));
  at::Tensor flat = at::cat(flat_views);
  auto job = reduce_job(flat, call_config(flat.numel()), opts.reduceOp);
  return enqueue(tensors, c10d::OpType::ALLREDUCE_COALESCED, [job, flat, tensors]() mutable {
    job();
    int64_t at = 0;
    for (at::Tensor& t : tensors) {
      t.copy_(flat.narrow(0, at, t.numel()).view(t.sizes()));
      at += t.numel();
    }
  });
}

std::function<void()> ProcessGroupCGX::reduce_job(at::Tensor t, const BackendConfig& c,
                                                  const c10d::ReduceOp& rop) {
  const auto op = rop.op_;
  TORCH_CHECK_VALUE(op != c10d::ReduceOp::AVG || at::isFloatingType(t.scalar_type()),
                    "ReduceOp.AVG needs a floating-point tensor, got ", t.scalar_type());
  const bool sum = op == c10d::ReduceOp::SUM || op == c10d::ReduceOp::AVG;
  if (sum && c.settings_per_call && !c.planned && eligible(t, c) && getSize() > 1) {
    // The ranks agree on this call's settings first, then all take the same branch.
    return [this, t, c, rop]() mutable {
      engine_.agree(c);
      if (compressible(t, c)) {
        engine_.allreduce(t, c, rop.op_ == c10d::ReduceOp::AVG, nullptr);
      } else {
        engine_.allreduce_exact(t, rop);
      }
    };
  }
  if (sum && compressible(t, c)) {
    const bool average = op == c10d::ReduceOp::AVG;
    return [this, t, c, average]() mutable { engine_.allreduce(t, c, average, nullptr); };
  }
  // Exact, on the worker too: every allreduce of the group in one order (see the header).
  return [this, t, rop]() mutable { engine_.allreduce_exact(t, rop); };
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_with(at::Tensor tensor,
                                                               const BackendConfig& config,
                                                               bool average,
                                                               std::optional<at::Tensor> residual) {
  return allreduce_call(std::move(tensor), CallOptions(config), average, std::move(residual));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_call(at::Tensor tensor,
                                                               const CallOptions& options,
                                                               bool average,
                                                               std::optional<at::Tensor> residual) {
  TORCH_CHECK_VALUE(at::isFloatingType(tensor.scalar_type()),
                    "allreduce_with needs a floating-point tensor, got ", tensor.scalar_type());
  TORCH_CHECK_VALUE(tensor.device().is_cpu() || tensor.device().is_cuda(),
                    "allreduce_with needs a tensor with data on the CPU or a GPU, got one on ",
                    tensor.device());
  if (plane_.serves(tensor, options.config().compressor)) {  // the config carries the stream
    std::vector<at::Tensor> residuals;
    if (residual) residuals.push_back(*residual);
    const int64_t op = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
    return plane_.call("allreduce_call", {tensor}, residuals, op, options.config());
  }
  if (residual) {
    TORCH_CHECK_VALUE(residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                          residual->device().is_cpu() && residual->numel() == tensor.numel(),
                      "residual must be a contiguous CPU float32 tensor of ", tensor.numel(),
                      " elements");
    residual->zero_();
  }
  check_native(options.config().compressor);
  std::vector<at::Tensor> outputs = {tensor};
  if (options.compressed() && eligible(tensor, options.config())) {
    return enqueue(outputs, c10d::OpType::ALLREDUCE,
                   [this, tensor, options, average, residual]() mutable {
                     // The options' compressor serves this call, not the engine's cache.
                     engine_.allreduce(tensor, options.config(), average,
                                       residual ? residual->data_ptr<float>() : nullptr,
                                       options.shared_compressor());
                   });
  }
  const auto op = c10d::ReduceOp(average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
  return enqueue(outputs, c10d::OpType::ALLREDUCE,
                 [this, tensor, op]() mutable { engine_.allreduce_exact(tensor, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::reduce_bucket(at::Tensor buf,
                                                              std::vector<BucketPart> parts,
                                                              bool average) {
  TORCH_CHECK_VALUE(at::isFloatingType(buf.scalar_type()) && buf.device().is_cpu() &&
                        buf.dim() == 1 && buf.is_contiguous(),
                    "reduce_bucket needs a contiguous 1-D floating-point CPU buffer, got ",
                    buf.scalar_type(), " on ", buf.device(), " with ", buf.dim(), " dimensions");
  for (BucketPart& p : parts) check_part(p, buf);
  const auto op = c10d::ReduceOp(average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
  std::vector<at::Tensor> outputs = {buf};
  return enqueue(outputs, c10d::OpType::ALLREDUCE,
                 [this, buf, parts = std::move(parts), average, op]() mutable {
                   for (BucketPart& p : parts) stage_part(p, buf);
                   for (BucketPart& p : parts) {
                     if (p.options.compressed() && eligible(p.staged, p.options.config())) {
                       BackendConfig c = p.options.config();
                       c.stream = p.stream;
                       float* res = p.residual.defined() ? p.residual.data_ptr<float>() : nullptr;
                       engine_.allreduce(p.staged, c, average, res, p.options.shared_compressor());
                     } else {
                       engine_.allreduce_exact(p.staged, op);
                     }
                   }
                   for (BucketPart& p : parts) unstage_part(p, buf);
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::barrier(const c10d::BarrierOptions& opts) {
  // Issued now on the caller's thread (in order with the forwarded collectives); completed on
  // the worker after this rank's earlier allreduces. Never blocks the caller.
  auto issued = inner()->barrier(opts);
  return enqueue({}, c10d::OpType::BARRIER, [issued] { issued->wait(); });
}

}  // namespace cgx::binding
