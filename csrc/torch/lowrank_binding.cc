// torch tensors in, csrc/core/lowrank.h's fused PowerSGD passes out (fp32, CPU, contiguous).
#include "lowrank_binding.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include <optional>

#include "core/lowrank.h"

namespace cgx::binding {
namespace {

void check(const at::Tensor& t, const char* name, int64_t rows, int64_t cols) {
  TORCH_CHECK_VALUE(t.scalar_type() == at::kFloat && t.device().is_cpu() && t.is_contiguous(), name,
                    " must be a contiguous CPU float32 tensor");
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == rows && t.size(1) == cols, name,
                    " must have shape [", rows, ", ", cols, "], got ", t.sizes());
}

// Checks m (rows x cols), the optional same-shape `extra`, qt (rank x cols), p (rows x rank).
void check_all(const at::Tensor& m, const std::optional<at::Tensor>& extra, const char* name,
               const at::Tensor& qt, const at::Tensor& p) {
  TORCH_CHECK_VALUE(m.dim() == 2 && qt.dim() == 2, "m and qt must be matrices");
  const int64_t rows = m.size(0), cols = m.size(1), rank = qt.size(0);
  TORCH_CHECK_VALUE(rank >= 1, "the rank must be >= 1");
  check(m, "m", rows, cols);
  if (extra) check(*extra, name, rows, cols);
  check(qt, "qt", rank, cols);
  check(p, "p", rows, rank);
}

void add_and_project(at::Tensor m, std::optional<at::Tensor> e, const at::Tensor& qt,
                     at::Tensor p) {
  check_all(m, e, "e", qt, p);
  const int64_t rows = m.size(0), cols = m.size(1), rank = qt.size(0);
  lowrank::add_and_project(m.data_ptr<float>(), e ? e->data_ptr<float>() : nullptr,
                           qt.data_ptr<float>(), p.data_ptr<float>(), rows, cols, int(rank));
}

void transpose_project(const at::Tensor& m, const at::Tensor& p, at::Tensor qt) {
  TORCH_CHECK_VALUE(m.dim() == 2 && p.dim() == 2, "m and p must be matrices");
  const int64_t rows = m.size(0), cols = m.size(1), rank = p.size(1);
  check(m, "m", rows, cols);
  check(p, "p", rows, rank);
  check(qt, "qt", rank, cols);
  TORCH_CHECK_VALUE(rank >= 1, "the rank must be >= 1");
  lowrank::transpose_project(m.data_ptr<float>(), p.data_ptr<float>(), qt.data_ptr<float>(), rows,
                             cols, int(rank));
}

void decompress(at::Tensor m, std::optional<at::Tensor> err, const at::Tensor& p,
                const at::Tensor& qt) {
  check_all(m, err, "err", qt, p);
  const int64_t rows = m.size(0), cols = m.size(1), rank = qt.size(0);
  lowrank::decompress(m.data_ptr<float>(), err ? err->data_ptr<float>() : nullptr,
                      p.data_ptr<float>(), qt.data_ptr<float>(), rows, cols, int(rank));
}

}  // namespace

void bind_lowrank(pybind11::module& m) {
  namespace py = pybind11;
  m.def("lowrank_add_and_project", &add_and_project, py::arg("m"), py::arg("e"), py::arg("qt"),
        py::arg("p"), py::call_guard<py::gil_scoped_release>());
  m.def("lowrank_transpose_project", &transpose_project, py::arg("m"), py::arg("p"), py::arg("qt"),
        py::call_guard<py::gil_scoped_release>());
  m.def("lowrank_decompress", &decompress, py::arg("m"), py::arg("err"), py::arg("p"),
        py::arg("qt"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace cgx::binding
