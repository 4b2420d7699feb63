// The max-min codec on CUDA devices: the same bytes as the CPU codec (core/codec.h,
// docs/FORMAT.md), computed by kernels on raw device pointers in a caller's stream. Torch-free;
// design and validation status in docs/gpu.md.
//
// Every call only enqueues work on `stream` (no host synchronization), except decode() /
// decode_add() without an expected header, which read the payload's header back to the host.
// Pointers are device pointers (or managed / host-mapped memory the device can access). Inputs
// and outputs of fp16 / bf16 must be 2-byte aligned and fp32 ones 4-byte aligned; payloads may
// start at any byte. 16-byte aligned buffers are read and written with vector accesses.
//
// Errors: bad arguments throw cgx::InvalidArgument (core/error.h) before anything is enqueued; a
// failing CUDA call throws cgx::cuda::CudaError. Nothing exits the process. last_error() returns
// the message of the last exception thrown by this API on the calling thread.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "core/codec.h"
#include "core/dtype.h"
#include "header_error.h"

namespace cgx::cuda {

class CudaError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Whether a CUDA device can be used (the driver loads and reports at least one device).
bool available();

// Message of the last error thrown by this API on this thread ("" if none).
const char* last_error();

// Encodes `count` elements of `dtype` at device pointer `in` into device buffer `out` of exactly
// cgx::encoded_size(count, dtype, params) bytes. The payload (header included) is byte for byte
// the one cgx::encode() produces, for nearest and stochastic rounding alike.
void encode(const void* in, DType dtype, int64_t count, const CodecParams& params, uint8_t* out,
            size_t out_size, cudaStream_t stream);

// The header that encode(in, dtype, count, params, ...) writes, as a PayloadInfo: what a
// receiver passes as `expected` to the asynchronous decode below.
PayloadInfo payload_info(DType dtype, int64_t count, const CodecParams& params);

// "bad magic, bits differ" ... for a nonzero error flag; "" for 0.
std::string describe_header_error(uint32_t flags);

// Asynchronous decode: `expected` is what the caller knows the payload must be (dtype, bits,
// bucket size, raw tail, count; the stochastic flag is informational and not compared). On the
// host it is validated, `count == expected.count` and `size == encoded_size(expected)` are
// checked (InvalidArgument otherwise), and the layout is taken from it, so every access stays in
// bounds whatever the payload holds. On the device every block compares the payload's 24 header
// bytes with `expected`; on a mismatch nothing is written to `out` and the kernel ORs the
// HeaderError bits of the differing fields into *error_flag (a device uint32_t that the caller
// zeroes once, e.g. with cudaMemsetAsync, and reads whenever it synchronizes anyway: the flag is
// sticky, so one check can cover many decodes). error_flag may be null: mismatches then only
// leave `out` untouched. Corrupt metadata or codes cannot be detected (as on the CPU): they give
// wrong or non-finite values.
void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
            const PayloadInfo& expected, uint32_t* error_flag, cudaStream_t stream);
void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                const PayloadInfo& expected, uint32_t* error_flag, cudaStream_t stream);

// Synchronous-validation decode with the semantics of cgx::decode / cgx::decode_add: copies the
// payload's header to the host, synchronizes `stream`, validates it exactly as cgx::inspect()
// does (InvalidArgument on a bad payload), then enqueues the decode. For tests and cold paths.
void decode(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
            cudaStream_t stream);
void decode_add(const uint8_t* payload, size_t size, void* out, DType out_dtype, int64_t count,
                cudaStream_t stream);

// For tests: caps the number of blocks per launch (0 restores the default, 2^20) so that the
// kernels' grid-stride loops run several rounds on small inputs. Not thread-safe.
void set_max_blocks(int64_t blocks);

}  // namespace cgx::cuda
