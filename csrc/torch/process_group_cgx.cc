#include "process_group_cgx.h"

#include <ATen/core/Tensor.h>
#include <torch/csrc/utils/pybind.h>

#include <algorithm>
#include <set>

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
      wire_(std::move(wire)),
      store_(std::move(store)),
      settings_(config),
      timeout_(timeout),
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
    inner_.reset();
    wire_.reset();
    hierarchy_.reset();  // the node and cross-node Gloo groups, and the shared-memory mapping
  };
  if (Py_IsInitialized() && PyGILState_Check()) {
    pybind11::gil_scoped_release no_gil;
    stop();
  } else {
    stop();
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

void ProcessGroupCGX::setTimeout(std::chrono::milliseconds timeout) {
  inner()->setTimeout(timeout);
  if (wire_) wire_->setTimeout(timeout);
  worker_.set_timeout(timeout);
  timeout_ = timeout;
}

// The worker's compressor for `c`, made again only when the settings change (not per call).
const Compressor& ProcessGroupCGX::compressor_for(const BackendConfig& c) {
  if (call_compressor_) return *call_compressor_;  // allreduce_call's, built with its options
  if (!compressor_ || compressor_name_ != c.compressor ||
      compressor_params_ != c.compressor_params) {
    compressor_ = make_compressor(c.compressor, c.compressor_params);
    compressor_name_ = c.compressor;
    compressor_params_ = c.compressor_params;
  }
  return *compressor_;
}

void ProcessGroupCGX::reduce_compressed(at::Tensor& t, const BackendConfig& c, bool average,
                                        float* residual) {
  CallClock clock(stats_);
  const int64_t sent0 = total_bytes_sent_;
  ++stats_.calls_compressed;
  stats_.bytes_exact += GroupStats::ring_allreduce_bytes(getSize(), 4 * t.numel());
  if (rotates(c)) {
    reduce_rotated(t, c, average, residual);
  } else {
    reduce_unrotated(t, c, average, residual);
  }
  stats_.bytes_sent += total_bytes_sent_ - sent0;
}

void ProcessGroupCGX::reduce_unrotated(at::Tensor& t, const BackendConfig& c, bool average,
                                       float* residual) {
  if (hierarchy_) return reduce_hierarchical(t, c, average, residual);
  // Works on a contiguous CPU copy when t is not one (CUDA tensors: staged through the host).
  at::Tensor work = t.contiguous().cpu();
  run_algorithm(wire_, work, c, average, residual);
  if (!work.is_same(t)) t.copy_(work);
}

// The compressed algorithm of `c` over the ranks of `over`, in place on `work` (contiguous CPU).
void ProcessGroupCGX::run_algorithm(const c10::intrusive_ptr<c10d::Backend>& over, at::Tensor& work,
                                    const BackendConfig& c, bool average, float* residual) {
  AllreduceOptions o = to_options(c, average, calls_++);
  if (c.compressor != "maxmin") o.compressor = &compressor_for(c);
  o.residual = residual;
  C10dTransport c10d(over);
  TimedTransport transport(c10d, stats_.wire_ns);
  algorithm_.run(transport, work.data_ptr(), to_cgx_dtype(work.scalar_type()), work.numel(), o);
  last_bytes_sent_ = int64_t(algorithm_.bytes_sent());
  total_bytes_sent_ += last_bytes_sent_;
}

void ProcessGroupCGX::reduce_exact(at::Tensor& t, const c10d::ReduceOp& op) {
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
  stats_.wire_ns +=
      std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - start)
          .count();
  const int64_t sent = GroupStats::ring_allreduce_bytes(getSize(), int64_t(work.nbytes()));
  total_bytes_sent_ += sent;
  ++stats_.calls_exact;
  stats_.bytes_sent += sent;
  stats_.bytes_exact += sent;
  if (avg) work.div_(getSize());
  if (!work.is_same(t)) t.copy_(work);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  TORCH_CHECK_VALUE(tensors.size() == 1, "cgx allreduce takes one tensor, got ", tensors.size());
  const BackendConfig c = call_config(tensors[0].numel());
  if (c.compressor == kAutoCompressor && opts.reduceOp.op_ != c10d::ReduceOp::AVG) {
    return inner()->allreduce(tensors, opts);  // planned exact: Gloo's own, no worker hop
  }
  return enqueue(tensors, c10d::OpType::ALLREDUCE, reduce_job(tensors[0], c, opts.reduceOp));
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK_VALUE(!tensors.empty(), "allreduce_coalesced needs at least one tensor");
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
      C10dTransport transport(wire_);
      agree_call_settings(transport, c);
      if (compressible(t, c)) {
        reduce_compressed(t, c, rop.op_ == c10d::ReduceOp::AVG);
      } else {
        reduce_exact(t, rop);
      }
    };
  }
  if (sum && compressible(t, c)) {
    const bool average = op == c10d::ReduceOp::AVG;
    return [this, t, c, average]() mutable { reduce_compressed(t, c, average); };
  }
  // Exact, on the worker too: every allreduce of the group in one order (see the header).
  return [this, t, rop]() mutable { reduce_exact(t, rop); };
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
  if (residual) {
    TORCH_CHECK_VALUE(residual->scalar_type() == at::kFloat && residual->is_contiguous() &&
                          residual->device().is_cpu() && residual->numel() == tensor.numel(),
                      "residual must be a contiguous CPU float32 tensor of ", tensor.numel(),
                      " elements");
    residual->zero_();
  }
  std::vector<at::Tensor> outputs = {tensor};
  if (options.compressed() && eligible(tensor, options.config())) {
    return enqueue(outputs, c10d::OpType::ALLREDUCE,
                   [this, tensor, options, average, residual]() mutable {
                     // The options' compressor serves this call (compressor_for), not the cache.
                     call_compressor_ = options.shared_compressor();
                     try {
                       reduce_compressed(tensor, options.config(), average,
                                         residual ? residual->data_ptr<float>() : nullptr);
                     } catch (...) {
                       call_compressor_.reset();
                       throw;
                     }
                     call_compressor_.reset();
                   });
  }
  const auto op = c10d::ReduceOp(average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM);
  return enqueue(outputs, c10d::OpType::ALLREDUCE,
                 [this, tensor, op]() mutable { reduce_exact(tensor, op); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupCGX::barrier(const c10d::BarrierOptions& opts) {
  // Issued now on the caller's thread (in order with the forwarded collectives); completed on
  // the worker after this rank's earlier allreduces. Never blocks the caller.
  auto issued = inner()->barrier(opts);
  return enqueue({}, c10d::OpType::BARRIER, [issued] { issued->wait(); });
}

}  // namespace cgx::binding
