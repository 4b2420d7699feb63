// The torch_cgx._C extension module: the codec now, the process group in backend_binding.cc.
#include <pybind11/pybind11.h>

#include "backend_binding.h"
#include "codec_binding.h"

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_cgx native core (max-min codec, cgx process group)";
  cgx::binding::bind_codec(m);
  cgx::binding::bind_backend(m);
}
