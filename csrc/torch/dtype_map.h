// Between torch's scalar types and the core's DType.
#pragma once

#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include <string>

#include "core/dtype.h"
#include "core/error.h"

namespace cgx::binding {

inline bool is_codec_dtype(c10::ScalarType t) {
  return t == c10::kFloat || t == c10::kHalf || t == c10::kBFloat16;
}

inline DType to_cgx_dtype(c10::ScalarType t) {
  switch (t) {
    case c10::kFloat:
      return DType::kFloat32;
    case c10::kHalf:
      return DType::kFloat16;
    case c10::kBFloat16:
      return DType::kBFloat16;
    default:
      throw_invalid("the codec takes float32, float16 or bfloat16 tensors, got ", c10::toString(t));
  }
}

inline DType dtype_from_name(const std::string& name) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    if (name == dtype_name(t)) return t;
  }
  throw_invalid("unknown dtype '", name, "' (float32, float16 or bfloat16)");
}

}  // namespace cgx::binding
