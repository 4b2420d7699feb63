// The compressed one-shot reduce-scatter (FSDP2's gradients): chunk j of the input belongs to
// rank j. Each rank encodes the W - 1 chunks it does not own (each value quantized once), one
// alltoall delivers them (their sizes first: data-dependent compressors), and the owner adds
// them, decoded, to its own chunk in fp32. Steps, bytes and bound: docs/algorithms.md
// ("One-shot reduce-scatter").
#pragma once

#include <cstdint>
#include <vector>

#include "allreduce.h"

namespace cgx {

class CompressedReduceScatter {
 public:
  // `input`: size() chunks of `count` values of `dtype`, contiguous. `out` (`count` fp32 values)
  // receives the sum over the ranks of chunk rank() (divided by the group size with
  // o.average); this rank's own chunk is added exactly. Reads o.codec / o.compressor,
  // o.call_index and o.average; every payload received must describe exactly `count` values
  // (InvalidArgument otherwise, before anything is allocated from its header).
  void run(Transport& t, const void* input, DType dtype, int64_t count, const AllreduceOptions& o,
           float* out);

  // Bytes this rank handed to the transport during the last run() (the sizes included).
  size_t bytes_sent() const { return bytes_sent_; }

 private:
  std::vector<uint8_t> send_, recv_;
  size_t bytes_sent_ = 0;
};

}  // namespace cgx
