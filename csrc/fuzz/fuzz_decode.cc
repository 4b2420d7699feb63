// libFuzzer target: every decoder of received bytes (docs/reliability.md, "Fuzzing").
//
// Input: byte 0 picks a decoder (fuzz_cases.h; the last index is the max-min codec's own
// parser, codec::inspect + decode), byte 1 the receiver's side (bits 0-1 the output dtype,
// bit 2 decode-add, bit 3 the count the receiver expects: the payload's own or one from bytes
// 2-3), then the payload. A decoder must accept a valid payload or throw InvalidArgument;
// anything else (a crash, a sanitizer report, a read past the payload) is a finding.
// CGX_FUZZ_STATS=1 prints the executions per decoder at exit; CGX_FUZZ_ONLY=k fuzzes decoder k
// alone (byte 0 is then ignored: the long run gives every decoder the same share).

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <vector>

#include "core/codec.h"
#include "core/error.h"
#include "fuzz/fuzz_cases.h"

namespace {

// Never destroyed: print_counts runs at exit, after static destructors would have run.
const std::vector<cgx::fuzz::Case>& cases() {
  static const auto* c = new std::vector<cgx::fuzz::Case>(cgx::fuzz::make_cases());
  return *c;
}

std::vector<uint64_t>& counts() {
  static auto* n = new std::vector<uint64_t>(cases().size() + 1, 0);
  return *n;
}

void print_counts() {
  if (!std::getenv("CGX_FUZZ_STATS")) return;
  for (size_t i = 0; i < cases().size(); ++i)
    std::fprintf(stderr, "cgx-fuzz %-40s %llu\n", cases()[i].label.c_str(),
                 static_cast<unsigned long long>(counts()[i]));
  std::fprintf(stderr, "cgx-fuzz %-40s %llu\n", "codec::inspect+decode",
               static_cast<unsigned long long>(counts().back()));
}

// The receiver's buffer, at most (a 4 KiB payload holds 32 Ki 1-bit values); allocated to the
// exact size per input, so that ASan sees a write past the count.
constexpr int64_t kMaxOut = int64_t(1) << 15;

void decode_with(const cgx::Compressor& c, const uint8_t* p, size_t n, uint8_t side, int64_t hint) {
  const auto dtype = static_cast<cgx::DType>((side & 3) % cgx::kNumDTypes);
  int64_t count = hint;
  if (side & 8) count = c.payload_count(p, n);  // validates the header first
  if (count < 0 || count > kMaxOut) return;
  std::vector<uint8_t> out(static_cast<size_t>(count) * cgx::elem_size(dtype));
  c.decode(p, n, out.data(), dtype, count, (side & 4) != 0);
  if (c.traits().summable) (void)c.summable_section(p, n);
}

void decode_codec(const uint8_t* p, size_t n, uint8_t side, int64_t hint) {
  const auto dtype = static_cast<cgx::DType>((side & 3) % cgx::kNumDTypes);
  int64_t count = hint;
  if (side & 8) count = cgx::inspect(p, n).count;
  if (count < 0 || count > kMaxOut) return;
  std::vector<uint8_t> out(static_cast<size_t>(count) * cgx::elem_size(dtype));
  if (side & 4) {
    cgx::decode_add(p, n, out.data(), dtype, count);
  } else {
    cgx::decode(p, n, out.data(), dtype, count);
  }
}

}  // namespace

long g_only = -1;

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  std::atexit(print_counts);
  if (const char* only = std::getenv("CGX_FUZZ_ONLY")) g_only = std::strtol(only, nullptr, 10);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 4) return 0;
  const size_t pick =
      g_only >= 0 ? size_t(g_only) % (cases().size() + 1) : data[0] % (cases().size() + 1);
  const uint8_t side = data[1];
  const int64_t hint = int64_t(data[2]) | (int64_t(data[3]) << 8);
  const uint8_t* payload = data + 4;
  const size_t n = size - 4;
  ++counts()[pick];
  try {
    if (pick == cases().size()) {
      decode_codec(payload, n, side, hint);
    } else {
      decode_with(*cases()[pick].compressor, payload, n, side, hint);
    }
  } catch (const cgx::InvalidArgument&) {
    // rejected: what a decoder must do with bad bytes
  }
  return 0;
}
