// Python bindings of the cgx process group (torch_cgx/backend.py registers it with c10d).
#include "backend_binding.h"

#include <ATen/ops/empty_like.h>
#include <pybind11/chrono.h>
#include <pybind11/functional.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "algorithms/error_bound.h"
#include "bucket_call.h"
#include "c10d_transport.h"
#include "call_options.h"
#include "core/error.h"
#include "dtype_map.h"
#include "process_group_cgx.h"

namespace cgx::binding {
namespace {

// error_bound.h over float64 tensors of per-bucket sums (torch_cgx/bounds.py).
at::Tensor bucket_error_bound(const at::Tensor& range_sum, const at::Tensor& magnitude_sum,
                              int bits, int world, int algorithm, bool average, bool stochastic,
                              c10::ScalarType dtype) {
  CGX_CHECK_ARG(range_sum.scalar_type() == at::kDouble &&
                    magnitude_sum.sizes() == range_sum.sizes() &&
                    magnitude_sum.scalar_type() == at::kDouble,
                "range_sum and magnitude_sum must be float64 tensors of one shape");
  BoundParams p;
  p.bits = bits;
  p.world = world;
  p.algorithm = algorithm_from_int(algorithm);
  p.average = average;
  p.rounding = stochastic ? Rounding::kStochastic : Rounding::kNearest;
  p.dtype = to_cgx_dtype(dtype);
  // A diagnostic of the error bound (tests, benchmarks), not a data path: read on the host.
  at::Tensor r = range_sum.contiguous().cpu(), m = magnitude_sum.contiguous().cpu();
  at::Tensor out = at::empty_like(r);
  const double *rp = r.data_ptr<double>(), *mp = m.data_ptr<double>();
  double* op = out.data_ptr<double>();
  for (int64_t i = 0; i < r.numel(); ++i) op[i] = cgx::bucket_error_bound(rp[i], mp[i], p);
  return out;
}

// reduce_bucket's parts from Python: _C.BucketPart, its fields by name (torch_cgx/hooks/core.py).
c10::intrusive_ptr<c10d::Work> reduce_bucket(ProcessGroupCGX& pg, at::Tensor buf,
                                             std::vector<BucketPart> parts, bool average) {
  pybind11::gil_scoped_release no_gil;
  return pg.reduce_bucket(std::move(buf), std::move(parts), average);
}

void bind_bucket_part(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<BucketPart>(m, "BucketPart",
                         "One reduction of a gradient bucket for reduce_bucket "
                         "(csrc/torch/bucket_call.h): its options, then its fields by name.")
      .def(py::init<CallOptions>(), py::arg("options"))
      .def_readwrite("options", &BucketPart::options)
      .def_readwrite("stream", &BucketPart::stream)
      .def_readwrite("offsets", &BucketPart::offsets)
      .def_readwrite("numels", &BucketPart::numels)
      .def_readwrite("residuals", &BucketPart::residuals)
      .def_readwrite("residuals_out", &BucketPart::residuals_out)
      .def_readwrite("seeds", &BucketPart::seeds)
      .def_readwrite("bucket_size", &BucketPart::bucket_size)
      .def_readwrite("split", &BucketPart::split)
      .def_readwrite("fp32", &BucketPart::fp32)
      .def_readwrite("whole", &BucketPart::whole);
}

// The rules this build was compiled with (settings_rules.h): tests/test_settings_rules.py checks
// them against the table, so a build older than the table fails there.
pybind11::dict compiled_rules() {
  namespace py = pybind11;
  using namespace rules;
  auto range = [](const Range& r) { return py::make_tuple(r.lo, r.hi, r.also, r.text); };
  py::dict d;
  d["bits"] = range(kBitsRange);
  d["bucket_size"] = range(kBucketSizeRange);
  d["min_size"] = range(kMinSizeRange);
  d["fusion_buffer_mb"] = range(kFusionBufferMbRange);
  d["pipeline_segment_mb"] = range(kPipelineSegmentMbRange);
  d["call_vars"] = std::vector<std::string>(kCallVars, kCallVars + kCallSettings);
  d["rotation_blocks"] = py::make_tuple(kRotationMinBlock, kRotationMaxBlock, kRotationBlocksText);
  d["min_size_floor"] = kMinSizeFloor;
  return d;
}

}  // namespace

void bind_backend(pybind11::module& m) {
  namespace py = pybind11;
  py::module::import("torch.distributed");  // c10d::Backend's Python type must exist first

  py::class_<BackendConfig>(m, "BackendConfig")
      .def(py::init<>())
      .def_readwrite("bits", &BackendConfig::bits)
      .def_readwrite("bucket_size", &BackendConfig::bucket_size)
      .def_readwrite("skip_incomplete_buckets", &BackendConfig::skip_incomplete_buckets)
      .def_readwrite("minimal_size", &BackendConfig::minimal_size)
      .def_readwrite("fusion_buffer_bytes", &BackendConfig::fusion_buffer_bytes)
      .def_readwrite("pipeline_segment_bytes", &BackendConfig::pipeline_segment_bytes)
      .def_readwrite("algorithm", &BackendConfig::algorithm)
      .def_readwrite("stochastic", &BackendConfig::stochastic)
      .def_readwrite("rotation", &BackendConfig::rotation)
      .def_readwrite("clip", &BackendConfig::clip)
      .def_readwrite("seed", &BackendConfig::seed)
      .def_readwrite("stream", &BackendConfig::stream)
      .def_readwrite("compressor", &BackendConfig::compressor)
      .def_readwrite("compressor_params", &BackendConfig::compressor_params)
      .def_readwrite("settings_per_call", &BackendConfig::settings_per_call)
      .def_readwrite("hierarchical", &BackendConfig::hierarchical)
      .def_readwrite("intra_broadcast", &BackendConfig::intra_broadcast)
      .def_readwrite("inner_communicator", &BackendConfig::inner_communicator)
      .def_readwrite("cross_communicator", &BackendConfig::cross_communicator)
      .def_readwrite("intra_compress", &BackendConfig::intra_compress)
      .def_readwrite("data_plane", &BackendConfig::data_plane);

  py::class_<CallOptions>(m, "CallOptions",
                          "A call's settings validated and resolved once (ValueError naming the "
                          "field), the compressor built once and shared by copies.")
      .def(py::init<const BackendConfig&>(), py::arg("config"))
      .def_property_readonly("config", &CallOptions::config)
      .def_property_readonly("compressed", &CallOptions::compressed)
      .def_property_readonly("rotates", &CallOptions::rotates)
      .def_property_readonly("clips", &CallOptions::clips)
      .def_property("stream", &CallOptions::stream, &CallOptions::set_stream)
      .def(
          "with_stream",
          [](const CallOptions& o, int64_t stream) {
            CallOptions copy = o;
            copy.set_stream(stream);
            return copy;
          },
          py::arg("stream"))
      .def("__copy__", [](const CallOptions& o) { return CallOptions(o); });

  m.def("rotation_rule", &rotation_rule, py::arg("rotation"), py::arg("bits"),
        py::arg("bucket_size"), py::arg("compressor"),
        "Whether an allreduce with these settings rotates its buckets (the backend's rule).");
  m.def("clip_rule", &clip_rule, py::arg("clip"), py::arg("rotates"),
        "Whether max-min clips its range, given the clip setting and whether the call rotates.");

  bind_bucket_part(m);

  py::class_<PlanRule>(m, "PlanRule")
      .def(py::init<>())
      .def_readwrite("max_numel", &PlanRule::max_numel)
      .def_readwrite("compressor", &PlanRule::compressor)
      .def_readwrite("params", &PlanRule::params)
      .def_readwrite("bits", &PlanRule::bits)
      .def_readwrite("bucket_size", &PlanRule::bucket_size)
      .def_readwrite("algorithm", &PlanRule::algorithm)
      .def_readwrite("segments", &PlanRule::segments);

  py::class_<Hierarchy>(m, "Hierarchy")
      .def(py::init<>())
      .def_readwrite("intra", &Hierarchy::intra)
      .def_readwrite("cross", &Hierarchy::cross)
      .def_readwrite("local_rank", &Hierarchy::local_rank)
      .def_readwrite("local_size", &Hierarchy::local_size)
      .def_readwrite("nodes", &Hierarchy::nodes)
      .def_readwrite("intra_broadcast", &Hierarchy::intra_broadcast)
      .def_readwrite("shm_name", &Hierarchy::shm_name)
      .def_readwrite("intra_compress", &Hierarchy::intra_compress);

  py::class_<ProcessGroupCGX, c10d::Backend, c10::intrusive_ptr<ProcessGroupCGX>>(m,
                                                                                  "ProcessGroupCGX")
      .def(py::init<int, int, c10::intrusive_ptr<c10d::Backend>, c10::intrusive_ptr<c10d::Backend>,
                    BackendConfig, c10::intrusive_ptr<c10d::Store>, std::chrono::milliseconds>(),
           py::arg("rank"), py::arg("size"), py::arg("inner"), py::arg("wire"), py::arg("config"),
           py::arg("store"), py::arg("timeout"), py::call_guard<py::gil_scoped_release>())
      .def("config", &ProcessGroupCGX::config)
      .def("set_config", &ProcessGroupCGX::set_config)
      .def("set_plan", &ProcessGroupCGX::set_plan, py::arg("rules"))
      .def("plan", &ProcessGroupCGX::plan)
      .def("planned_config", [](const ProcessGroupCGX& pg, const BackendConfig& c,
                                int64_t numel) { return planned(c, pg.plan(), numel); })
      .def("set_hierarchy", &ProcessGroupCGX::set_hierarchy)
      .def("hierarchical", &ProcessGroupCGX::hierarchical)
      .def("unlink_node_segment", &ProcessGroupCGX::unlink_node_segment)
      .def("store", &ProcessGroupCGX::store)
      .def("next_config_version", &ProcessGroupCGX::next_config_version)
      .def("watch_store_host", &ProcessGroupCGX::watch_store_host, py::arg("watch_fd"),
           py::arg("wait_for_host_ms"), py::arg("grace_ms"),
           "Arms the default group's departure in step with rank 0, the store's host "
           "(csrc/torch/host_departure.h); watch_fd (a socket to the store's server, or -1) is "
           "owned by the group from now on.")
      .def("allreduce_with", &ProcessGroupCGX::allreduce_with, py::arg("tensor"), py::arg("config"),
           py::arg("average"), py::arg("residual") = std::nullopt,
           py::call_guard<py::gil_scoped_release>())
      .def("allreduce_call", &ProcessGroupCGX::allreduce_call, py::arg("tensor"),
           py::arg("options"), py::arg("average"), py::arg("residual") = std::nullopt,
           py::call_guard<py::gil_scoped_release>())
      .def("set_device_plane", &ProcessGroupCGX::set_device_plane, py::arg("call"),
           py::arg("backend"), py::arg("every_tensor"), py::arg("token"))
      .def("device_plane_token", &ProcessGroupCGX::device_plane_token)
      .def("reduce_bucket", &reduce_bucket, py::arg("buffer"), py::arg("parts"),
           py::arg("average") = true,
           "Reduces a gradient bucket's parts in one job: stages, reduces and writes back on the "
           "worker (csrc/torch/bucket_call.h); the future's value is [buffer].")
      .def("settings_version", &ProcessGroupCGX::settings_version)
      .def("last_bytes_sent", &ProcessGroupCGX::last_bytes_sent)
      .def("total_bytes_sent", &ProcessGroupCGX::total_bytes_sent)
      .def(
          "stats",
          [](const ProcessGroupCGX& pg) {
            const StatsSnapshot s = pg.stats();
            py::dict d;
            d["bytes_sent"] = s.bytes_sent;
            d["bytes_exact"] = s.bytes_exact;
            d["bytes_saved"] = s.bytes_exact - s.bytes_sent;
            d["calls_compressed"] = s.calls_compressed;
            d["calls_exact"] = s.calls_exact;
            d["reduce_scatter_compressed"] = s.reduce_scatter_compressed;
            d["reduce_scatter_exact"] = s.reduce_scatter_exact;
            d["compute_seconds"] = s.compute_seconds;
            d["wire_seconds"] = s.wire_seconds;
            return d;
          },
          "This rank's counters for the group since creation or reset_stats(): bytes sent and "
          "what exact calls would have sent, calls compressed / exact, seconds of compute "
          "(not hidden by the pipeline) and on the wire (csrc/torch/engine_stats.h).")
      .def("reset_stats", &ProcessGroupCGX::reset_stats)
      .def_static("shutdown_all", &ProcessGroupCGX::shutdown_all);

  m.def("_fault_after", &fault_after, py::arg("ops"), py::arg("signal"),
        "Test hook: the transport operation `ops` from now raises `signal` on this process.");
  m.def("_transport_ops", &transport_ops, "Transport operations begun in this process so far.");
  m.def("_settings_rules", &compiled_rules);
  m.def("parse_env_int", &parse_env_int, py::arg("var"), py::arg("raw"));
  m.def("parse_env_bool", &parse_env_bool, py::arg("var"), py::arg("raw"));
  m.def("bucket_error_bound", &bucket_error_bound, py::arg("range_sum"), py::arg("magnitude_sum"),
        py::arg("bits"), py::arg("world"), py::arg("algorithm"), py::arg("average"),
        py::arg("stochastic"), py::arg("dtype"));
}

}  // namespace cgx::binding
