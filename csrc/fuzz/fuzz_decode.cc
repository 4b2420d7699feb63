// libFuzzer target: every decoder of received bytes (docs/reliability.md, "Fuzzing").
//
// Input: byte 0 picks a case (fuzz_cases.h: a compressor at some setting, or the max-min codec),
// byte 1 the receiver's side, bytes 2-3 a count, then the payload. Side: bits 0-1 the output
// dtype; bit 2 decode-add; bit 3 how the receiver learns the count: as the bindings do (the
// payload's own, validated first by payload_count / inspect) or as the algorithms do (the count
// it expects, bytes 2-3: the decoder must check the payload against it). The output buffer has
// exactly that count, so a write past it is an ASan error. Decoding goes through decode_payload
// (algorithms/payload.h), the algorithms' one entry; sum-reduce's compressors' summable_section
// is read from every payload that decoded. A decoder must decode or throw InvalidArgument;
// anything else (a crash, a sanitizer report, another exception) is a finding.
// Environment variables: fuzz_cases.h, Env (CGX_FUZZ_STATS=1: executions per case at exit;
// CGX_FUZZ_ONLY=k: case k alone, as the long run does).

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "algorithms/payload.h"
#include "core/codec.h"
#include "core/error.h"
#include "fuzz/fuzz_cases.h"

namespace {

const std::vector<cgx::fuzz::Case>& cases() {
  static const auto* c = new std::vector<cgx::fuzz::Case>(cgx::fuzz::make_cases());
  return *c;
}

// The receiver's buffer, at most (an 8 KiB payload, the longest input, holds 64 Ki 1-bit
// values).
constexpr int64_t kMaxOut = int64_t(1) << 16;

void decode_case(const cgx::fuzz::Case& c, const uint8_t* p, size_t n, uint8_t side,
                 int64_t expected) {
  const auto dtype = static_cast<cgx::DType>((side & 3) % cgx::kNumDTypes);
  int64_t count = expected;
  if (side & 8) count = c.compressor ? c.compressor->payload_count(p, n) : cgx::inspect(p, n).count;
  if (count < 0 || count > kMaxOut) return;
  std::vector<uint8_t> out(static_cast<size_t>(count) * cgx::elem_size(dtype));
  cgx::decode_payload(c.options(), p, n, out.data(), dtype, count, (side & 4) != 0);
  if (cgx::sum_in_transit(c.options())) {  // as sum-reduce reads it
    const auto sec = c.compressor->summable_section(p, n);
    if (sec.offset + size_t(sec.count) * cgx::elem_size(sec.dtype) != n) std::abort();
  }
}

cgx::fuzz::Env g_env;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_env = cgx::fuzz::Env::read(cases());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const cgx::fuzz::Case& c = g_env.pick(cases(), data[0]);
  cgx::fuzz::Stats::get().count(c.label);
  const int64_t expected = int64_t(data[2]) | (int64_t(data[3]) << 8);
  try {
    decode_case(c, data + 4, size - 4, data[1], expected);
  } catch (const cgx::InvalidArgument& e) {
    g_env.rejected(e);  // what a decoder must do with bad bytes
  }
  return 0;
}
