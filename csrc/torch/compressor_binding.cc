// torch.Tensor front of the registered compressors (csrc/compressors/registry.h). Python callers
// go through torch_cgx/compressors.py, which checks devices and layouts and documents the API.
#include "compressor_binding.h"

#include <ATen/ops/empty.h>
#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "compressors/registry.h"
#include "core/error.h"
#include "dtype_map.h"
#include "external_compressors.h"

namespace cgx::binding {
namespace {

void check_cpu_contiguous(const at::Tensor& t, const char* what) {
  CGX_CHECK_ARG(t.device().is_cpu() && t.is_contiguous(), what, " must be a contiguous CPU tensor");
}

// Into `out` (a 1-D uint8 buffer of at least max_encoded_size bytes, checked by the Python front)
// when given, else into a new tensor; returns the payload (a view of `out`).
at::Tensor encode(const Compressor& c, const at::Tensor& input, uint64_t seed, uint64_t stream,
                  uint64_t shared, std::optional<at::Tensor> out) {
  check_cpu_contiguous(input, "input");
  const DType dtype = to_cgx_dtype(input.scalar_type());
  const size_t cap = c.max_encoded_size(input.numel(), dtype);
  at::Tensor buf = out ? *out : at::empty({int64_t(cap)}, input.options().dtype(at::kByte));
  check_cpu_contiguous(buf, "out");
  CGX_CHECK_ARG(buf.scalar_type() == at::kByte && buf.dim() == 1 && size_t(buf.numel()) >= cap,
                "out must be a 1-D uint8 tensor of at least ", cap, " bytes");
  size_t used;
  {
    pybind11::gil_scoped_release no_gil;
    used = c.encode(input.data_ptr(), dtype, input.numel(), EncodeContext{seed, stream, shared},
                    buf.data_ptr<uint8_t>(), size_t(buf.numel()));
  }
  if (used == size_t(buf.numel())) return buf;
  return out ? buf.narrow(0, 0, int64_t(used)) : buf.narrow(0, 0, int64_t(used)).clone();
}

void decode_into(const Compressor& c, const at::Tensor& payload, at::Tensor& out, bool add) {
  check_cpu_contiguous(payload, "payload");
  CGX_CHECK_ARG(payload.scalar_type() == at::kByte && payload.dim() == 1,
                "payload must be a 1-D uint8 tensor");
  check_cpu_contiguous(out, "out");
  const DType dtype = to_cgx_dtype(out.scalar_type());
  pybind11::gil_scoped_release no_gil;
  c.decode(payload.data_ptr<uint8_t>(), size_t(payload.numel()), out.data_ptr(), dtype, out.numel(),
           add);
}

pybind11::dict traits(const Compressor& c) {
  const CompressorTraits t = c.traits();
  pybind11::dict d;
  d["biased"] = t.biased;
  d["fixed_size"] = t.fixed_size;
  d["summable"] = t.summable;
  d["sparse"] = t.sparse;
  return d;
}

pybind11::list specs(const std::string& name) {
  pybind11::list out;
  for (const ParamSpec& s : compressor_entry(name).specs()) {
    pybind11::dict d;
    d["name"] = s.name;
    d["default"] = s.default_value;
    d["min"] = s.min;
    d["max"] = s.max;
    d["integer"] = s.integer;
    d["help"] = s.help;
    out.append(d);
  }
  return out;
}

}  // namespace

void bind_compressors(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<Compressor, std::shared_ptr<Compressor>>(m, "Compressor")
      .def_property_readonly("name", [](const Compressor& c) { return std::string(c.name()); })
      .def("traits", &traits)
      .def("max_encoded_size",
           [](const Compressor& c, int64_t count, const std::string& dtype) {
             return c.max_encoded_size(count, dtype_from_name(dtype));
           })
      .def("encode", &encode, py::arg("input"), py::arg("seed"), py::arg("stream"),
           py::arg("shared"), py::arg("out") = py::none())
      .def("decode_into", &decode_into)
      .def("payload_count", [](const Compressor& c, const at::Tensor& payload) {
        check_cpu_contiguous(payload, "payload");
        CGX_CHECK_ARG(payload.scalar_type() == at::kByte, "payload must be a uint8 tensor");
        return c.payload_count(payload.data_ptr<uint8_t>(), size_t(payload.numel()));
      });
  m.def("compressor_names", &compressor_names);
  m.def("declare_external_compressor", &declare_external_compressor, py::arg("name"));
  m.def("is_external_compressor", &is_external_compressor, py::arg("name"));
  m.def("compressor_specs", &specs);
  m.def("make_compressor",
        [](const std::string& name, const std::map<std::string, double>& params) {
          return std::shared_ptr<Compressor>(make_compressor(name, params));
        });
}

}  // namespace cgx::binding
