// libFuzzer target: the allreduce algorithms as receivers of hostile bytes (docs/reliability.md,
// "Fuzzing"). One rank of a group of 2-4 runs CompressedAllreduce::run over FuzzWire: every byte
// it receives from another rank (payloads, the allgather's payload sizes, sum-reduce's headers
// and summed values, the tree's partial sums) is fuzz input; or, by the spec's structure, the
// rotation wrapper around it, the one-shot reduce-scatter (sizes and payloads), or one rank of
// the hierarchical allreduce (node sums, broadcasts and slices, and the cross-node allreduce,
// both groups' bytes from one input). Input: RunSpec::kBytes bytes of settings
// (allreduce_spec.h: case, algorithm, group size, rank, dtype, average, error feedback,
// pipeline, pieces, structure, count), then the received bytes in the order they are received.
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
#include "fuzz/structures.h"

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

const char* structure_label(cgx::fuzz::Structure s) {
  static const char* names[] = {"structure allreduce", "structure rotated",
                                "structure reduce-scatter", "structure hierarchical"};
  return names[int(s)];
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
  cgx::fuzz::Stats::get().count(structure_label(s.structure));
  cgx::fuzz::WireBytes wire{data + RunSpec::kBytes, size - RunSpec::kBytes};
  const bool hierarchical = s.structure == cgx::fuzz::Structure::kHierarchical;
  // Hierarchical: the fuzzed rank is local rank 0 or 1 of node 0 (a group of 2), and node 0 of
  // the cross-node group (a leader's, or its local rank's).
  cgx::fuzz::FuzzWire group(hierarchical ? s.local_rank() : s.rank(), hierarchical ? 2 : s.world,
                            wire);
  cgx::fuzz::FuzzWire cross(0, s.world, wire);
  const bool crosses = hierarchical && (s.small_pieces || s.local_rank() == 0);
  try {
    cgx::fuzz::run_rank(s, c, s.fuzzed_rank(), group, crosses ? &cross : nullptr);
  } catch (const cgx::InvalidArgument& e) {
    g_env.rejected(e);  // what a receiver must do with bad bytes
  }
  return 0;
}
