// Python bindings of the cgx process group (torch_cgx/backend.py registers it with c10d).
#include "backend_binding.h"

#include <torch/csrc/utils/pybind.h>

#include "process_group_cgx.h"

namespace cgx::binding {

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
      .def_readwrite("seed", &BackendConfig::seed);

  py::class_<ProcessGroupCGX, c10d::Backend, c10::intrusive_ptr<ProcessGroupCGX>>(m,
                                                                                  "ProcessGroupCGX")
      .def(py::init<int, int, c10::intrusive_ptr<c10d::Backend>, c10::intrusive_ptr<c10d::Backend>,
                    BackendConfig>(),
           py::arg("rank"), py::arg("size"), py::arg("inner"), py::arg("wire"), py::arg("config"),
           py::call_guard<py::gil_scoped_release>())
      .def("config", &ProcessGroupCGX::config)
      .def("set_config", &ProcessGroupCGX::set_config)
      .def("allreduce_with", &ProcessGroupCGX::allreduce_with, py::arg("tensor"), py::arg("config"),
           py::arg("average"), py::call_guard<py::gil_scoped_release>())
      .def("last_bytes_sent", &ProcessGroupCGX::last_bytes_sent)
      .def("total_bytes_sent", &ProcessGroupCGX::total_bytes_sent)
      // Identifies the C++ object: Python wrappers of it come and go (torch_cgx/backend.py).
      .def("uid", [](const ProcessGroupCGX& pg) { return reinterpret_cast<intptr_t>(&pg); });
}

}  // namespace cgx::binding
