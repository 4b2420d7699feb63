// The `cgx` c10d backend: the adapter between c10d and the units that do the work. Every allreduce
// runs on the group's worker thread (worker.h), through the engine (engine.h), which owns a
// private Gloo backend (`wire`): float32 / float16 / bfloat16 with SUM or AVG are compressed
// (csrc/algorithms), the rest reduced exactly. Every other operation is forwarded unchanged to
// the inner Gloo backend (`inner`), called from the user's thread, so both keep their own call
// order and cannot overhear each other. The group's settings live in a SettingsStore
// (settings_store.h); the adapter decides what runs where, and when.
#pragma once

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include "backend_config.h"
#include "call_settings.h"
#include "cgx_work.h"
#include "device_plane.h"
#include "engine.h"
#include "host_departure.h"
#include "settings_store.h"
#include "worker.h"

namespace cgx::binding {

class CallOptions;
struct BucketPart;

class ProcessGroupCGX : public c10d::Backend {
 public:
  // `store` holds this group instance's keys (settings agreement); kept for the group's life.
  ProcessGroupCGX(int rank, int size, c10::intrusive_ptr<c10d::Backend> inner,
                  c10::intrusive_ptr<c10d::Backend> wire, BackendConfig config,
                  c10::intrusive_ptr<c10d::Store> store, std::chrono::milliseconds timeout);
  ~ProcessGroupCGX() override;

  const std::string getBackendName() const override { return "cgx"; }
  void setTimeout(std::chrono::milliseconds timeout) override;

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  // One fused piece (the tensors flattened and concatenated), reduced like allreduce.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override;
  // SUM and AVG compressed when the settings say so (csrc/torch/reduce_scatter.cc): the list form
  // as one input, the coalesced form as one fused piece; other calls forwarded.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override;

  // destroy_process_group's first step: stops the threads (as destruction would), then, for the
  // default group on a store rank 0 may host, leaves it in step with rank 0 (host_departure.h).
  void shutdown() override;
  // Arms that departure (torch_cgx.backend, at creation): rank 0 announces; the others wait,
  // watching `watch_fd` (owned from now on; -1: none). Bounds in milliseconds.
  void watch_store_host(int watch_fd, int64_t wait_for_host_ms, int64_t grace_ms) {
    departure_.arm(getRank(), watch_fd, std::chrono::milliseconds(wait_for_host_ms),
                   std::chrono::milliseconds(grace_ms));
  }

  // Stops the threads of every live cgx group (runs what they have queued first). Called at
  // interpreter exit, before Python finalizes: a background thread that needs the GIL then
  // would be killed mid-unwind.
  static void shutdown_all();

  // The hooks' entry point: reduces `tensor` with `config` (not compressing: exactly). With
  // `residual` (fp32, contiguous, tensor's size) it also receives this rank's compression error
  // of what it sent (AllreduceOptions::residual), for error feedback; zeros when exact.
  c10::intrusive_ptr<c10d::Work> allreduce_with(at::Tensor tensor, const BackendConfig& config,
                                                bool average,
                                                std::optional<at::Tensor> residual = std::nullopt);

  // allreduce_with with options validated and resolved once (call_options.h): no validation and
  // no compressor built per call; the worker uses the options' compressor.
  c10::intrusive_ptr<c10d::Work> allreduce_call(at::Tensor tensor, const CallOptions& options,
                                                bool average,
                                                std::optional<at::Tensor> residual = std::nullopt);

  // The hooks' fused entry point (bucket_call.h): one job reducing every part of a gradient
  // bucket's buffer `buf` (contiguous, 1-D, on the CPU) in order, staging and unstaging on the
  // worker. The parts are checked here (ValueError); the work's future holds [buf].
  c10::intrusive_ptr<c10d::Work> reduce_bucket(at::Tensor buf, std::vector<BucketPart> parts,
                                               bool average);

  BackendConfig config() const { return settings_.config(); }
  void set_config(const BackendConfig& config) { settings_.set_config(config); }
  // Changes whenever set_config, set_plan or a changed per-call variable change the group's
  // settings: a hook caches CallOptions and rebuilds them only when this moves.
  int64_t settings_version() const { return settings_.version(); }
  // The size rules every allreduce and allreduce_coalesced follow (ascending max_numel; empty:
  // the group's settings alone). The caller makes them identical on every rank.
  void set_plan(const std::vector<PlanRule>& plan) { settings_.set_plan(plan); }
  std::vector<PlanRule> plan() const { return settings_.plan(); }
  // Routes CUDA tensors (every tensor with `every_tensor`) to the device plane (device_plane.h);
  // set once, at creation, before the group's first use.
  void set_device_plane(DevicePlane::Call call, c10::intrusive_ptr<c10d::Backend> backend,
                        bool every_tensor, int64_t token) {
    plane_ = DevicePlane{std::move(call), std::move(backend), every_tensor, token};
  }
  // The installed plane's token; 0: none.
  int64_t device_plane_token() const { return plane_.call ? plane_.token : 0; }
  // Turns on the hierarchical path for compressed allreduces (before the group's first use).
  void set_hierarchy(const Hierarchy& h) { engine_.set_hierarchy(h); }
  bool hierarchical() const { return engine_.hierarchical(); }
  // Removes the node segment's name once every local rank has mapped it (leader; idempotent).
  void unlink_node_segment() { engine_.unlink_node_segment(); }
  const c10::intrusive_ptr<c10d::Store>& store() const { return store_; }
  // 1, 2, ...: numbers the settings agreements of this group (keys in the store).
  int64_t next_config_version() { return settings_.next_agreement(); }
  // Bytes this rank handed to the transport in its last compressed allreduce.
  int64_t last_bytes_sent() const { return engine_.last_bytes_sent(); }
  // Bytes this rank sent in all allreduces it ran itself (compressed, and exact ones counted as a
  // ring allreduce's 2 (W - 1) / W * size), since creation.
  int64_t total_bytes_sent() const { return engine_.total_bytes_sent(); }
  // The group's counters since creation or the last reset_stats (engine_stats.h).
  StatsSnapshot stats() const { return engine_.stats(); }
  void reset_stats() { engine_.reset_stats(); }

  // ---- forwarded to the inner backend ----
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits,
                                               std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  // Completes when the inner barrier has and when this rank's allreduces issued before it have.
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;

 private:
  c10::intrusive_ptr<c10d::Work> enqueue(std::vector<at::Tensor> outputs, c10d::OpType type,
                                         std::function<void()> fn) {
    return worker_.enqueue(getRank(), std::move(outputs), type, std::move(fn));
  }
  // The forwarded collectives' backend; raises once the group has stopped.
  const c10::intrusive_ptr<c10d::Backend>& inner() const;
  // The forwarded collectives' backend for tensors like `t`: the device plane's carrier for the
  // CUDA tensors it serves, else inner().
  const c10::intrusive_ptr<c10d::Backend>& inner(const at::Tensor& t) const;
  // Runs what is queued and stops the worker and the watchdog, then lets Gloo's threads go;
  // later work raises. Idempotent.
  void stop_threads();
  // The worker's job for a reduce-scatter of input into output (the settings agreement when per
  // call, then compressed or exact); empty when the call is to be forwarded as it is.
  std::function<void()> reduce_scatter_job(at::Tensor output, at::Tensor input,
                                           const c10d::ReduceScatterOptions& opts);
  // The group's settings for an allreduce of `numel` values issued now (per-call variables and
  // the plan applied; numel < 0: no plan).
  BackendConfig call_config(int64_t numel = -1) { return settings_.call_config(numel); }
  // The device plane's call `kind` (device_plane.h) with the settings `c`. A float SUM / AVG
  // whose settings are read per call first makes the ranks agree on them, as the native path
  // does (a 16-byte allgather on the worker, which the caller waits for, the GIL released):
  // ranks whose variables differ raise ValueError instead of exchanging payloads of different
  // sizes on the carrier. settings_per_call=False removes this host round trip.
  c10::intrusive_ptr<c10d::Work> plane_call(const std::string& kind,
                                            std::vector<at::Tensor> outputs,
                                            std::vector<at::Tensor> inputs, int64_t op,
                                            const BackendConfig& c);
  // The worker's job reducing t in place with c: the settings agreement when per call, then
  // compressed or exact.
  std::function<void()> reduce_job(at::Tensor t, const BackendConfig& c, const c10d::ReduceOp& rop);

  c10::intrusive_ptr<c10d::Backend> inner_;
  DevicePlane plane_;

  c10::intrusive_ptr<c10d::Store> store_;
  StoreHostDeparture departure_;
  SettingsStore settings_;

  Engine engine_;  // the worker's: only jobs call it
  Worker worker_;  // last: stops (after running what is queued) before the rest goes
};

}  // namespace cgx::binding
