#pragma once

#include <pybind11/pybind11.h>

namespace cgx::binding {

void bind_rotation(pybind11::module& m);

}  // namespace cgx::binding
