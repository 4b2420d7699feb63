// The exact collectives' defaults (transport.h), each one alltoallv: what the in-memory and fuzz
// transports use, so that every byte they move goes through the one exchange they implement.
// Sums run in rank order, so every rank that sums gets the same bits.
#include "transport.h"

#include <cstring>

#include "core/error.h"

namespace cgx {

void Transport::broadcast(uint8_t* data, size_t bytes, int root) {
  const int world = size(), me = rank();
  CGX_CHECK_ARG(root >= 0 && root < world, "broadcast: root ", root, " outside the group");
  std::vector<size_t> send_sizes(size_t(world), me == root ? bytes : 0);
  std::vector<size_t> recv_sizes(size_t(world), 0);
  recv_sizes[size_t(root)] = bytes;
  // The root sends the same bytes to every rank, itself included (then copied in place).
  std::vector<uint8_t> send(me == root ? bytes * size_t(world) : 0);
  for (int j = 0; me == root && j < world; ++j) {
    if (bytes > 0) std::memcpy(send.data() + size_t(j) * bytes, data, bytes);
  }
  alltoallv(send.data(), send_sizes, data, recv_sizes);
}

void Transport::reduce_sum(float* data, size_t count, int root) {
  const int world = size(), me = rank();
  CGX_CHECK_ARG(root >= 0 && root < world, "reduce: root ", root, " outside the group");
  const size_t bytes = count * sizeof(float);
  std::vector<size_t> send_sizes(size_t(world), 0);
  send_sizes[size_t(root)] = bytes;
  std::vector<size_t> recv_sizes(size_t(world), me == root ? bytes : 0);
  std::vector<float> got(me == root ? count * size_t(world) : 0);
  alltoallv(reinterpret_cast<const uint8_t*>(data), send_sizes,
            reinterpret_cast<uint8_t*>(got.data()), recv_sizes);
  if (me != root) return;
  for (size_t i = 0; i < count; ++i) {
    float sum = got[i];
    for (int j = 1; j < world; ++j) sum += got[size_t(j) * count + i];
    data[i] = sum;
  }
}

void Transport::reduce_scatter_sum(const float* in, float* out, size_t count) {
  const int world = size();
  const std::vector<size_t> sizes(size_t(world), count * sizeof(float));
  std::vector<float> got(count * size_t(world));
  alltoallv(reinterpret_cast<const uint8_t*>(in), sizes, reinterpret_cast<uint8_t*>(got.data()),
            sizes);
  for (size_t i = 0; i < count; ++i) {
    float sum = got[i];
    for (int j = 1; j < world; ++j) sum += got[size_t(j) * count + i];
    out[i] = sum;
  }
}

}  // namespace cgx
