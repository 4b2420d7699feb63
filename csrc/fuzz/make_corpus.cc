// Writes the fuzz targets' seed corpus (csrc/fuzz/corpus), valid inputs only:
//   DIR/decode/     real payloads of every case of fuzz_cases.h for a few counts, each behind
//                   cgx_fuzz_decode's 4-byte prefix;
//   DIR/allreduce/  what one rank of an honest group (ranks as threads over a mailbox) received
//                   during a real allreduce, behind cgx_fuzz_allreduce's RunSpec.
//
//   cgx_fuzz_corpus DIR
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/payload.h"
#include "fuzz/allreduce_spec.h"
#include "fuzz/fuzz_cases.h"
#include "fuzz/fuzz_transport.h"
#include "fuzz/mailbox_transport.h"
#include "fuzz/structures.h"

namespace {

using cgx::fuzz::Case;
using cgx::fuzz::RunSpec;

void write(const std::string& path, const std::vector<uint8_t>& prefix,
           const std::vector<uint8_t>& body) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    std::perror(path.c_str());
    std::exit(1);
  }
  std::fwrite(prefix.data(), 1, prefix.size(), f);
  std::fwrite(body.data(), 1, body.size(), f);
  std::fclose(f);
}

std::vector<float> values(int64_t n, uint32_t seed) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.f, 3.f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = d(g);
  if (n > 2) v[1] = 0.f;  // a zero and an outlier: the edges the decoders must handle
  if (n > 5) v[5] = 1e4f;
  return v;
}

// cgx_fuzz_decode: side 8 (the count from the payload itself), dtype and add varied.
int decode_seeds(const std::string& dir, const std::vector<Case>& cases) {
  int files = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (int64_t n : {int64_t(1), int64_t(37), int64_t(600)}) {
      const std::vector<float> v = values(n, uint32_t(i * 100 + size_t(n)));
      const cgx::AllreduceOptions o = cases[i].options();
      std::vector<uint8_t> out(cgx::payload_size(o, n, cgx::DType::kFloat32));
      cgx::Streams streams{1, 2};
      out.resize(cgx::encode_payload(o, v.data(), cgx::DType::kFloat32, n, streams, out.data(),
                                     out.size()));
      const uint8_t side = uint8_t(8 | (n % 3) | (n == 37 ? 4 : 0));
      write(dir + "/" + cgx::fuzz::file_name(cases[i].label) + "-" + std::to_string(n),
            {uint8_t(i), side, uint8_t(n & 0xff), uint8_t(n >> 8)}, out);
      ++files;
    }
  }
  return files;
}

// Runs an honest group of s.ranks() ranks (hierarchical: s.world nodes of 2, over one mailbox
// per node and one per cross-node group); returns what rank s.fuzzed_rank() received from the
// others, both of its groups in one log, in the order it received them.
std::vector<uint8_t> record(const Case& c, const RunSpec& s) {
  const bool hierarchical = s.structure == cgx::fuzz::Structure::kHierarchical;
  const int ranks = s.ranks();
  std::vector<cgx::fuzz::Mailbox> groups(size_t(hierarchical ? s.world : 1));
  std::vector<cgx::fuzz::Mailbox> crosses(2);
  std::vector<uint8_t> log;
  std::vector<std::exception_ptr> errors(static_cast<size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      try {
        const int node = hierarchical ? r / 2 : 0, local = hierarchical ? r % 2 : r;
        cgx::fuzz::MailboxTransport t(groups[size_t(node)], local, hierarchical ? 2 : s.world);
        // Leaders: one cross-node group (local ranks 0); slices: one per local rank.
        cgx::fuzz::MailboxTransport x(crosses[size_t(s.small_pieces ? local : 0)], node, s.world);
        std::vector<uint8_t> mine;
        cgx::fuzz::Recorder rec(t, mine), rec_cross(x, mine);
        const bool crosses_nodes = hierarchical && (s.small_pieces || local == 0);
        cgx::fuzz::run_rank(s, c, r, rec, crosses_nodes ? &rec_cross : nullptr);
        if (r == s.fuzzed_rank()) log = mine;
      } catch (...) {
        errors[size_t(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return log;
}

// cgx_fuzz_allreduce: nine runs of every case (each algorithm, group sizes 2-4, both ranks,
// every dtype, error feedback, the pipeline, several pieces; then each structure of
// allreduce_spec.h: the rotation, the reduce-scatter, the hierarchical allreduce's leaders and
// slices).
int allreduce_seeds(const std::string& dir, const std::vector<Case>& cases) {
  using cgx::Algorithm;
  using cgx::DType;
  struct Run {
    const char* name;
    Algorithm algorithm;
    int world;
    bool last;
    DType dtype;
    int64_t count;
    uint8_t flags;  // bit 0 average, 1 feedback, 2 pipelined, 3 small pieces
    cgx::fuzz::Structure structure = cgx::fuzz::Structure::kAllreduce;
  };
  using cgx::fuzz::Structure;
  const Run runs[] = {
      {"sra", Algorithm::kScatterReduceAllgather, 2, false, DType::kFloat32, 300, 0},
      {"ring", Algorithm::kRing, 3, true, DType::kFloat16, 901, 1 | 8},
      {"tree", Algorithm::kTree, 3, false, DType::kBFloat16, 77, 2},
      {"allgather", Algorithm::kAllgather, 4, true, DType::kFloat32, 150, 0},
      {"sra-pipeline", Algorithm::kScatterReduceAllgather, 3, false, DType::kFloat32, 1100, 4},
      {"rotated", Algorithm::kScatterReduceAllgather, 3, true, DType::kFloat32, 300, 2,
       Structure::kRotated},
      {"reduce-scatter", Algorithm::kScatterReduceAllgather, 3, false, DType::kFloat16, 250, 1,
       Structure::kReduceScatter},
      {"hierarchical", Algorithm::kRing, 2, false, DType::kFloat32, 200, 2,
       Structure::kHierarchical},
      {"hierarchical-slices", Algorithm::kScatterReduceAllgather, 3, true, DType::kFloat32, 130,
       1 | 8, Structure::kHierarchical},
  };
  int files = 0;
  for (size_t i = 0; i < cases.size(); ++i) {
    for (const Run& run : runs) {
      RunSpec s;
      s.pick = uint8_t(i);
      s.algorithm = run.algorithm;
      s.world = run.world;
      s.last_rank = run.last;
      s.dtype = run.dtype;
      s.count = run.count;
      s.average = run.flags & 1;
      s.feedback = run.flags & 2;
      s.pipelined = run.flags & 4;
      s.small_pieces = run.flags & 8;
      s.structure = run.structure;
      std::vector<uint8_t> prefix(RunSpec::kBytes);
      s.write(prefix.data());
      write(dir + "/" + cgx::fuzz::file_name(cases[i].label) + "-" + run.name, prefix,
            record(cases[i], s));
      ++files;
    }
  }
  return files;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s DIR  (writes DIR/decode and DIR/allreduce)\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const auto cases = cgx::fuzz::make_cases();
  std::filesystem::create_directories(dir + "/decode");
  std::filesystem::create_directories(dir + "/allreduce");
  const int a = decode_seeds(dir + "/decode", cases);
  const int b = allreduce_seeds(dir + "/allreduce", cases);
  std::printf("%d decode and %d allreduce seeds in %s\n", a, b, dir.c_str());
  return 0;
}
