// The torch_cgx._C extension module: the codec now, the process group in backend_binding.cc.
#include <pybind11/pybind11.h>

#include "backend_binding.h"
#include "codec_binding.h"
#include "compressor_binding.h"
#include "float_formats_binding.h"
#include "lowrank_binding.h"
#include "rotation_binding.h"

#ifndef CGX_BUILT_WITH_TORCH
#define CGX_BUILT_WITH_TORCH "unknown"
#endif

PYBIND11_MODULE(_C, m) {
  m.doc() = "torch_cgx native core (max-min codec, cgx process group)";
  // torch_cgx/__init__.py compares it with the running torch: the C++ ABI is per version.
  m.attr("built_with_torch") = CGX_BUILT_WITH_TORCH;
  cgx::binding::bind_codec(m);
  cgx::binding::bind_backend(m);
  cgx::binding::bind_compressors(m);
  cgx::binding::bind_float_formats(m);
  cgx::binding::bind_lowrank(m);
  cgx::binding::bind_rotation(m);
}
