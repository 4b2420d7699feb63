// The hierarchical allreduce (algorithms/hierarchical.h) with every rank of several nodes as a
// thread: nodes x local ranks over in-memory node and cross-node transports, or over a node's
// shared-memory segment (pieces smaller than the buffer, so the pipeline runs), with and
// without intra_broadcast, fp16 / bf16 on the way to the owner. Every rank ends bit-identical,
// within the flat bound over the node sums (W = nodes), and the residuals sum to what the
// cross-node compression lost.
#include "algorithms/hierarchical.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>

#include "algorithms/allreduce.h"
#include "algorithms/error_bound.h"
#include "core/error.h"
#include "in_memory_transport.h"
#include "ranks.h"
#include "test_values.h"

namespace cgx {
namespace {

struct Case {
  int nodes;
  int local;
  bool intra_broadcast;
  bool shm;
  DType intra_dtype = DType::kFloat32;
  bool average = false;
  int64_t n = 1000;
  int bits = 4;
  int64_t bucket = 64;
};

std::string segment_name(int node) {
  static std::atomic<int> calls{0};
  return "/cgx-test-" + std::to_string(getpid()) + "-hier-" + std::to_string(calls++) + "-" +
         std::to_string(node);
}

struct Result {
  std::vector<std::vector<float>> out, residual;
  std::vector<size_t> sent;
};

Result run(const Case& c, const std::vector<std::vector<float>>& x) {
  const int world = c.nodes * c.local;
  Result res{std::vector<std::vector<float>>(x), {}, std::vector<size_t>(size_t(world))};
  res.residual.assign(size_t(world), std::vector<float>(size_t(c.n), -1.0f));
  std::vector<std::unique_ptr<testing::Hub>> intra_hubs, cross_hubs;
  std::vector<std::string> names;
  for (int k = 0; k < c.nodes; ++k) {
    intra_hubs.push_back(std::make_unique<testing::Hub>());
    names.push_back(segment_name(k));
  }
  for (int l = 0; l < c.local; ++l) cross_hubs.push_back(std::make_unique<testing::Hub>());
  testing::run_ranks_ok(world, [&](int r) {
    const int node = r / c.local, l = r % c.local;
    testing::InMemoryTransport intra(*intra_hubs[size_t(node)], l, c.local);
    // Leaders: one cross group (local ranks 0); slices: one per local rank.
    const bool crosses = !c.intra_broadcast || l == 0;
    testing::InMemoryTransport cross(*cross_hubs[size_t(c.intra_broadcast ? 0 : l)], node, c.nodes);
    // Two buffers of 256 values per slot: a 1000-value call runs in 4 pieces.
    std::unique_ptr<ShmNode> shm;
    if (c.shm) {
      shm = std::make_unique<ShmNode>(names[size_t(node)], l, c.local, 2 * 256 * sizeof(float),
                                      std::chrono::milliseconds(20000));
    }
    SerialExecutor exec;
    CompressedAllreduce algo;
    uint64_t calls = 0;
    AllreduceOptions ao;
    ao.codec.bits = c.bits;
    ao.codec.bucket_size = c.bucket;
    const CrossAllreduce across = [&](Transport& t, float* data, int64_t len, float* residual) {
      AllreduceOptions o = ao;
      o.call_index = calls++;
      o.residual = residual;
      algo.run(t, data, DType::kFloat32, len, o);
      return algo.bytes_sent();
    };
    NodeGroups g{&intra, crosses ? &cross : nullptr, shm.get(), &exec};
    HierarchicalOptions o;
    o.local_rank = l;
    o.local_size = c.local;
    o.intra_broadcast = c.intra_broadcast;
    o.intra_dtype = c.intra_dtype;
    o.alignment = c.bucket;
    o.divisor = c.average ? float(world) : 0.0f;
    o.residual = res.residual[size_t(r)].data();
    res.sent[size_t(r)] = hierarchical_allreduce(g, o, res.out[size_t(r)].data(), c.n, across);
    if (shm && l == 0) shm->unlink();  // every local rank has mapped it by now
  });
  return res;
}

void check_case(const Case& c) {
  SCOPED_TRACE(::testing::Message()
               << c.nodes << " nodes x " << c.local << " broadcast=" << c.intra_broadcast << " shm="
               << c.shm << " intra_dtype=" << int(c.intra_dtype) << " average=" << c.average);
  const int world = c.nodes * c.local;
  std::vector<std::vector<float>> x;
  for (int r = 0; r < world; ++r)
    x.push_back(testing::normal_floats(size_t(c.n), uint32_t(7 + r), 1.0f + 0.5f * float(r)));
  const Result res = run(c, x);
  for (int r = 1; r < world; ++r) ASSERT_EQ(res.out[size_t(r)], res.out[0]) << "rank " << r;
  // The bound: the flat one with W = nodes over the node sums, plus the rounding of the values
  // that travel as fp16 / bf16 to their owner (relative to their magnitudes).
  const double intra_rel = c.intra_dtype == DType::kFloat16    ? 0x1p-11
                           : c.intra_dtype == DType::kBFloat16 ? 0x1p-8
                                                               : 0.0;
  std::vector<double> lost(size_t(c.n), 0.0);
  for (int64_t b0 = 0; b0 < c.n; b0 += c.bucket) {
    const int64_t b1 = std::min(c.n, b0 + c.bucket);
    double range_sum = 0, magnitude_sum = 0;
    for (int k = 0; k < c.nodes; ++k) {
      double mn = INFINITY, mx = -INFINITY;
      for (int64_t i = b0; i < b1; ++i) {
        double s = 0;
        for (int l = 0; l < c.local; ++l) s += x[size_t(k * c.local + l)][size_t(i)];
        mn = std::min(mn, s);
        mx = std::max(mx, s);
      }
      range_sum += mx - mn;
    }
    for (int r = 0; r < world; ++r) {
      for (int64_t i = b0; i < b1; ++i)
        magnitude_sum = std::max(magnitude_sum, double(std::fabs(x[size_t(r)][size_t(i)])));
    }
    magnitude_sum *= world;
    BoundParams bp;
    bp.bits = c.bits;
    bp.world = c.nodes;
    const double bound = (bucket_error_bound(range_sum, magnitude_sum, bp) +
                          intra_rel * (1 + 0x1p-4) * magnitude_sum) /
                         (c.average ? world : 1);
    for (int64_t i = b0; i < b1; ++i) {
      double exact = 0;
      for (int r = 0; r < world; ++r) exact += x[size_t(r)][size_t(i)];
      lost[size_t(i)] = exact - res.out[0][size_t(i)] * (c.average ? world : 1);
      if (c.average) exact /= world;
      ASSERT_LE(std::fabs(res.out[0][size_t(i)] - exact), bound) << "value " << i;
    }
  }
  // Error feedback: only ranks that cross nodes have errors; summed, they are what was lost.
  if (c.intra_dtype != DType::kFloat32) return;  // the 16-bit roundings are not fed back
  for (int64_t i = 0; i < c.n; ++i) {
    double fed = 0, scale = 0;
    for (int r = 0; r < world; ++r) {
      const float e = res.residual[size_t(r)][size_t(i)];
      if (c.intra_broadcast && r % c.local != 0) {
        ASSERT_EQ(e, 0.0f) << "rank " << r;
      }
      fed += e;
      scale += std::fabs(x[size_t(r)][size_t(i)]);
    }
    ASSERT_NEAR(fed, lost[size_t(i)], 1e-5 * scale + 1e-6) << "value " << i;
  }
  // Bytes cross nodes from the leaders only with intra_broadcast (a slice owner may have an
  // empty sub-range of a short piece, so only the total is checked there).
  size_t total = 0;
  for (int r = 0; r < world; ++r) {
    total += res.sent[size_t(r)];
    if (c.intra_broadcast) {
      EXPECT_EQ(res.sent[size_t(r)] > 0, r % c.local == 0) << "rank " << r;
    }
  }
  EXPECT_GT(total, 0u);
}

TEST(Hierarchical, OverTheNodeTransportBothModes) {
  for (bool broadcast : {true, false}) {
    check_case({2, 2, broadcast, false});
    check_case({3, 2, broadcast, false, DType::kFloat32, true, 777});
    check_case({2, 3, broadcast, false, DType::kFloat32, false, 50, 2, 16});
  }
}

TEST(Hierarchical, OverSharedMemoryBothModes) {
  for (bool broadcast : {true, false}) {
    check_case({2, 2, broadcast, true});
    check_case({2, 3, broadcast, true, DType::kFloat32, true, 1100});
  }
}

TEST(Hierarchical, Fp16AndBf16OnTheWayToTheOwner) {
  for (DType d : {DType::kFloat16, DType::kBFloat16}) {
    check_case({2, 2, true, true, d});
    check_case({3, 2, false, true, d, true});
  }
}

TEST(Hierarchical, RefusesInconsistentGroups) {
  testing::Hub hub;
  testing::InMemoryTransport t(hub, 0, 1);
  float v = 1;
  const CrossAllreduce none = [](Transport&, float*, int64_t, float*) { return size_t(0); };
  HierarchicalOptions o;
  o.local_size = 2;
  NodeGroups no_cross{&t, nullptr, nullptr, nullptr};
  EXPECT_THROW(hierarchical_allreduce(no_cross, o, &v, 1, none), InvalidArgument);
  o.intra_dtype = DType::kFloat16;  // 16-bit staging needs the node segment
  NodeGroups groups{&t, &t, nullptr, nullptr};
  EXPECT_THROW(hierarchical_allreduce(groups, o, &v, 1, none), InvalidArgument);
}

}  // namespace
}  // namespace cgx
