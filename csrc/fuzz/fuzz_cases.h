// What the fuzz targets exercise: every registered compressor, at its defaults and (those with
// parameters: all but fp16, bf16, signsgd, signum) at another setting, and the max-min codec
// that the algorithms use without a compressor (at three settings). The first byte of a fuzz
// input picks one; adding a case shifts the indices: regenerate the corpus (make fuzz-corpus).
// Shared by the targets and by the seed-corpus generator; also the per-case execution counts
// the targets print.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "algorithms/allreduce.h"
#include "compressors/registry.h"

namespace cgx::fuzz {

struct Case {
  std::string label;                       // e.g. "maxmin:bits=1:bucket_size=7"
  std::unique_ptr<Compressor> compressor;  // null: the max-min codec with `codec`
  CodecParams codec;

  // How the algorithms are told to use it (payload.h reads nothing else).
  AllreduceOptions options() const {
    AllreduceOptions o;
    o.compressor = compressor.get();
    o.codec = codec;
    o.codec.seed = 7;
    return o;
  }
};

inline std::string with_params(std::string label, const std::map<std::string, double>& params) {
  for (const auto& [k, v] : params) {
    char value[32];
    std::snprintf(value, sizeof(value), "%g", v);
    label += ":" + k + "=" + value;
  }
  return label;
}

// A label as a file name: ':' -> '_', '=' dropped ("maxmin_bits1_bucket_size7").
inline std::string file_name(const std::string& label) {
  std::string out;
  for (char ch : label) {
    if (ch == ':') out += '_';
    if (ch != ':' && ch != '=') out += ch;
  }
  return out;
}

// Every registry entry at its defaults, then the non-default settings, then the codec.
inline std::vector<Case> make_cases() {
  std::vector<Case> out;
  for (const std::string& name : compressor_names())
    out.push_back({name, make_compressor(name), CodecParams{}});
  const std::vector<std::pair<std::string, std::map<std::string, double>>> more = {
      {"maxmin", {{"bits", 1}, {"bucket_size", 7}}},
      {"maxmin", {{"bits", 8}, {"bucket_size", 4096}, {"skip_incomplete_buckets", 1}}},
      {"maxmin", {{"bits", 3}, {"bucket_size", 64}, {"stochastic", 1}}},
      {"qsgd", {{"bits", 2}, {"bucket_size", 0}}},
      {"topk", {{"ratio", 0.5}}},
      {"randomk", {{"ratio", 0.3}, {"scale", 1}}},
      {"threshold", {{"tau", 0.5}}},
      {"tbq", {{"tau", 0.1}}},
      {"terngrad", {{"bucket_size", 0}, {"clip", 2.5}}},
      {"dgc", {{"ratio", 0.05}}},
      {"graddrop", {{"drop", 0.5}}},
      {"onebit", {{"bucket_size", 16}}},
      {"efsignsgd", {{"bucket_size", 8}}},
      {"sparseloco", {{"ratio", 0.3}, {"chunk", 7}, {"bits", 1}}},
      {"sparseloco", {{"ratio", 0.5}, {"chunk", 70000}, {"bits", 8}}},  // u32 indices
  };
  for (const auto& [name, params] : more)
    out.push_back({with_params(name, params), make_compressor(name, params), CodecParams{}});
  CodecParams one_bit;
  one_bit.bits = 1;
  one_bit.bucket_size = 7;
  CodecParams raw_tail;
  raw_tail.bits = 8;
  raw_tail.bucket_size = 64;
  raw_tail.skip_incomplete_buckets = true;
  raw_tail.rounding = Rounding::kStochastic;
  out.push_back({"codec", nullptr, CodecParams{}});
  out.push_back({"codec:bits=1:bucket_size=7", nullptr, one_bit});
  out.push_back({"codec:bits=8:bucket_size=64:raw_tail=1:stochastic=1", nullptr, raw_tail});
  CodecParams clipped;  // the clipped range (FORMAT.md): codes beyond it clamp to 0 or L
  clipped.bits = 2;
  clipped.bucket_size = 16;
  clipped.clip = true;
  out.push_back({"codec:bits=2:bucket_size=16:clip=1", nullptr, clipped});
  return out;
}

// Executions per case, printed at exit when CGX_FUZZ_STATS is set ("cgx-fuzz LABEL COUNT").
// Never destroyed: the at-exit print runs after static destructors would have.
class Stats {
 public:
  static Stats& get() {
    static auto* s = new Stats();
    return *s;
  }
  void count(const std::string& label) { ++n_[label]; }
  void print() const {
    for (const auto& [label, n] : n_)
      std::fprintf(stderr, "cgx-fuzz %-60s %llu\n", label.c_str(), (unsigned long long)n);
  }

 private:
  std::map<std::string, uint64_t> n_;
};

// The targets' environment: CGX_FUZZ_LIST=1 prints "INDEX LABEL" per case and exits;
// CGX_FUZZ_STATS=1 prints the executions per case at exit; CGX_FUZZ_ONLY=k fuzzes case k alone
// (the first input byte is then ignored); CGX_FUZZ_STRICT=1 makes a rejected input a crash
// (checks that the seed corpus is valid).
struct Env {
  long only = -1;
  bool strict = false;

  static Env read(const std::vector<Case>& cases) {
    if (std::getenv("CGX_FUZZ_LIST")) {
      for (size_t i = 0; i < cases.size(); ++i) std::printf("%zu %s\n", i, cases[i].label.c_str());
      std::exit(0);
    }
    if (std::getenv("CGX_FUZZ_STATS")) std::atexit([] { Stats::get().print(); });
    Env e;
    if (const char* only = std::getenv("CGX_FUZZ_ONLY")) e.only = std::strtol(only, nullptr, 10);
    e.strict = std::getenv("CGX_FUZZ_STRICT") != nullptr;
    return e;
  }
  const Case& pick(const std::vector<Case>& cases, uint8_t byte) const {
    return cases[(only >= 0 ? size_t(only) : size_t(byte)) % cases.size()];
  }
  // A rejected input: expected, but for the seed corpus under CGX_FUZZ_STRICT.
  void rejected(const std::exception& e) const {
    if (!strict) return;
    std::fprintf(stderr, "rejected (CGX_FUZZ_STRICT): %s\n", e.what());
    std::abort();
  }
};

}  // namespace cgx::fuzz
