// Where each part of a payload lives (docs/FORMAT.md, "Layout"), shared by encoder and decoder.
#pragma once

#include <cstddef>
#include <cstdint>

#include "dtype.h"

namespace cgx {

struct Layout {
  int64_t count = 0;        // n
  int64_t quantized = 0;    // nq
  int64_t buckets = 0;      // nb
  size_t meta_offset = 0;   // nb * (min, unit) f32 pairs
  size_t codes_offset = 0;  // ceil(nq * bits / 8) bytes
  size_t tail_offset = 0;   // (n - nq) raw elements
  size_t total = 0;
};

inline Layout make_layout(int64_t count, DType dtype, int bits, int64_t bucket_size,
                          bool raw_tail) {
  Layout l;
  l.count = count;
  l.quantized = raw_tail ? count - count % bucket_size : count;
  l.buckets = (l.quantized + bucket_size - 1) / bucket_size;
  l.meta_offset = 24;
  l.codes_offset = l.meta_offset + size_t(l.buckets) * 8;
  l.tail_offset = l.codes_offset + size_t((l.quantized * bits + 7) / 8);
  l.total = l.tail_offset + size_t(count - l.quantized) * elem_size(dtype);
  return l;
}

}  // namespace cgx
