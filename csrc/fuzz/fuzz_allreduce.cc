// libFuzzer target: the allreduce algorithms as receivers of hostile bytes (docs/reliability.md,
// "Fuzzing"). One rank of a group of 2-4 runs CompressedAllreduce::run over FuzzWire: every byte
// it receives from another rank (payloads, the allgather's payload sizes, sum-reduce's headers
// and summed values, the tree's partial sums) is fuzz input. Input: RunSpec::kBytes bytes of
// settings (allreduce_spec.h: case, algorithm, group size, rank, dtype, average, error
// feedback, pipeline, pieces, count), then the received bytes in the order they are received.
// The rank must finish or throw InvalidArgument; anything else is a finding.
// Environment variables: fuzz_cases.h, Env (CGX_FUZZ_STATS=1: executions per case and per
// algorithm asked for at exit; CGX_FUZZ_ONLY=k: case k alone).

#include <cstdint>
#include <cstdlib>
#include <vector>

#include "core/error.h"
#include "fuzz/allreduce_spec.h"
#include "fuzz/fuzz_cases.h"
#include "fuzz/fuzz_transport.h"

namespace {

const std::vector<cgx::fuzz::Case>& cases() {
  static const auto* c = new std::vector<cgx::fuzz::Case>(cgx::fuzz::make_cases());
  return *c;
}

const char* algorithm_label(cgx::Algorithm a) {
  static const char* names[] = {"algorithm sra", "algorithm ring", "algorithm allgather",
                                "algorithm tree"};
  return names[int(a)];
}

cgx::fuzz::Env g_env;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  g_env = cgx::fuzz::Env::read(cases());
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using cgx::fuzz::RunSpec;
  if (size < RunSpec::kBytes) return 0;
  const RunSpec s = RunSpec::parse(data);
  const cgx::fuzz::Case& c = g_env.pick(cases(), s.pick);
  cgx::fuzz::Stats::get().count(c.label);
  cgx::fuzz::Stats::get().count(algorithm_label(s.algorithm));

  std::vector<uint8_t> x = cgx::fuzz::rank_values(s.count, s.rank(), s.dtype);
  std::vector<float> residual(s.feedback ? size_t(s.count) : 0);
  const cgx::AllreduceOptions o = s.options(c, s.feedback ? residual.data() : nullptr);
  cgx::fuzz::FuzzWire wire(s.rank(), s.world, data + RunSpec::kBytes, size - RunSpec::kBytes);
  try {
    cgx::CompressedAllreduce allreduce;
    allreduce.run(wire, x.data(), s.dtype, s.count, o);
  } catch (const cgx::InvalidArgument& e) {
    g_env.rejected(e);  // what a receiver must do with bad bytes
  }
  return 0;
}
