#pragma once

#include <pybind11/pybind11.h>

namespace cgx::binding {

// _C.mx_encode / _C.mx_decode_into: the MX formats' native CPU path (core/float_formats.h).
void bind_float_formats(pybind11::module& m);

}  // namespace cgx::binding
