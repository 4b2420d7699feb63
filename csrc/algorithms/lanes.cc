// CaSync for every algorithm but SRA (which has its own, finer pipeline in allreduce.cc): a piece
// larger than `segment_bytes` is cut into segments (whole buckets), and two *lanes* reduce them,
// lane 0 segments 0, 2, 4, ... on the calling thread and lane 1 segments 1, 3, 5, ... on a helper
// thread, each with the unchanged algorithm and buffers of its own. Their transport calls go to
// one serial communication thread, and a turnstile lets the lanes post in strict alternation, one
// operation each: the communication thread runs segment 0's first operation, segment 1's first,
// segment 0's second, ... While it carries one lane's message, the other lane encodes or decodes.
//
// Why every rank posts in the same order: an algorithm issues the same number of operations for
// every segment of a call (it depends on the rank, W and the algorithm, not on the values or the
// segment's length), so the order above is a fixed function of the rank, and it is the original
// operation sequence with each operation doubled (one per lane, same peer, same kind). A sequence
// that cannot deadlock stays so when every operation is doubled. Once a lane has no segment left
// it retires and the other posts alone.
#include <condition_variable>
#include <functional>
#include <mutex>

#include "allreduce.h"
#include "payload.h"

namespace cgx {
namespace {

// Lanes take turns, one posted operation each, skipping retired lanes.
class Turnstile {
 public:
  explicit Turnstile(int lanes) : active_(size_t(lanes), true) {}

  // Blocks until it is `lane`'s turn, runs `post` (which must not block), passes the turn on.
  template <typename F>
  void post_in_turn(int lane, F&& post) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return turn_ == lane; });
    post();
    turn_ = next_active(lane);
    cv_.notify_all();
  }

  void retire(int lane) {
    std::lock_guard<std::mutex> lk(mu_);
    active_[size_t(lane)] = false;
    if (turn_ == lane) turn_ = next_active(lane);
    cv_.notify_all();
  }

 private:
  int next_active(int lane) const {
    const int n = int(active_.size());
    for (int i = 1; i <= n; ++i) {
      const int j = (lane + i) % n;
      if (active_[size_t(j)]) return j;
    }
    return lane;
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<bool> active_;
  int turn_ = 0;
};

// One lane's view of the transport: each operation is posted to the shared communication
// thread in the lane's turn, then waited for.
class LaneTransport : public Transport {
 public:
  LaneTransport(Transport& inner, SerialExecutor& comm, Turnstile& turns, int lane)
      : inner_(inner), comm_(comm), turns_(turns), lane_(lane) {}
  int rank() const override { return inner_.rank(); }
  int size() const override { return inner_.size(); }

  void alltoallv(const uint8_t* send, const std::vector<size_t>& send_sizes, uint8_t* recv,
                 const std::vector<size_t>& recv_sizes) override {
    run([&] { inner_.alltoallv(send, send_sizes, recv, recv_sizes); });
  }
  void allgather(const uint8_t* send, size_t bytes, uint8_t* recv) override {
    run([&] { inner_.allgather(send, bytes, recv); });
  }
  void sendrecv(int to, const uint8_t* send, size_t send_bytes, int from, uint8_t* recv,
                size_t recv_bytes) override {
    run([&] { inner_.sendrecv(to, send, send_bytes, from, recv, recv_bytes); });
  }
  void send(int to, const uint8_t* data, size_t bytes) override {
    run([&] { inner_.send(to, data, bytes); });
  }
  void recv(int from, uint8_t* data, size_t bytes) override {
    run([&] { inner_.recv(from, data, bytes); });
  }

 private:
  // The operation's arguments live on this lane's stack until wait() returns.
  void run(const std::function<void()>& op) {
    SerialExecutor::Ticket ticket = 0;
    turns_.post_in_turn(lane_, [&] { ticket = comm_.post(op); });
    comm_.wait(ticket);
  }

  Transport& inner_;
  SerialExecutor& comm_;
  Turnstile& turns_;
  int lane_;
};

}  // namespace

bool CompressedAllreduce::lanes_apply(const AllreduceOptions& o, DType dtype, int64_t count) {
  if (o.segment_bytes == 0 || size_t(count) * elem_size(dtype) <= o.segment_bytes) return false;
  if (sum_in_transit(o) || gather_only(o)) return o.pipeline_sparse;
  return o.algorithm != Algorithm::kScatterReduceAllgather;
}

void CompressedAllreduce::pipelined(Transport& t, uint8_t* data, DType dtype, int64_t count,
                                    const AllreduceOptions& o, uint64_t piece) {
  const int64_t bucket = chunk_alignment(o);
  const int64_t seg =
      std::max<int64_t>(1, int64_t(o.segment_bytes / elem_size(dtype)) / bucket) * bucket;
  const int64_t nseg = (count + seg - 1) / seg;
  if (!comm_) comm_ = std::make_unique<SerialExecutor>();
  if (!lane_exec_) lane_exec_ = std::make_unique<SerialExecutor>();
  for (auto& lane : lanes_) {
    if (!lane) lane = std::make_unique<CompressedAllreduce>();
    lane->bytes_sent_ = 0;
  }
  Turnstile turns(2);
  float* residual = residual_;
  auto run_lane = [&, residual](int lane) {
    LaneTransport lt(t, *comm_, turns, lane);
    CompressedAllreduce& a = *lanes_[size_t(lane)];
    try {
      for (int64_t k = lane; k < nseg; k += 2) {
        const int64_t begin = k * seg, n = std::min(seg, count - begin);
        a.residual_ = residual ? residual + begin : nullptr;
        a.reduce_piece(lt, data + begin * int64_t(elem_size(dtype)), dtype, n, o,
                       piece * 1000003u + uint64_t(k));
      }
    } catch (...) {
      turns.retire(lane);
      throw;
    }
    turns.retire(lane);
  };
  const SerialExecutor::Ticket other = lane_exec_->post([&] { run_lane(1); });
  std::exception_ptr error;
  try {
    run_lane(0);
  } catch (...) {
    error = std::current_exception();
  }
  try {
    lane_exec_->wait(other);  // lane 1 uses this frame's turnstile and the caller's buffers
  } catch (...) {
    if (!error) error = std::current_exception();
  }
  lane_exec_->drain();
  comm_->drain();
  bytes_sent_ += lanes_[0]->bytes_sent_ + lanes_[1]->bytes_sent_;
  if (error) std::rethrow_exception(error);
}

}  // namespace cgx
