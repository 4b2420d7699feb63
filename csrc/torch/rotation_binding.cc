// torch tensors in, csrc/core/rotation.h's seeded block rotation out (fp32, CPU, contiguous).
#include "rotation_binding.h"

#include <pybind11/stl.h>
#include <torch/csrc/utils/pybind.h>

#include "core/rotation.h"

namespace cgx::binding {
namespace {

void rotate(at::Tensor x, int64_t block, uint64_t seed, bool forward) {
  TORCH_CHECK_VALUE(x.scalar_type() == at::kFloat && x.device().is_cpu() && x.is_contiguous(),
                    "rotate_: x must be a contiguous CPU float32 tensor, got ", x.scalar_type(),
                    " on ", x.device(), x.is_contiguous() ? "" : " (not contiguous)");
  rotation::rotate(x.data_ptr<float>(), x.numel(), block, seed, forward);
}

}  // namespace

void bind_rotation(pybind11::module& m) {
  namespace py = pybind11;
  m.def(
      "rotate_", &rotate, py::arg("x"), py::arg("block"), py::arg("seed"), py::arg("forward"),
      "In place: y = H D x / sqrt(block) per block (forward) or its inverse (csrc/core/rotation.h)",
      py::call_guard<py::gil_scoped_release>());
}

}  // namespace cgx::binding
