#include "host_departure.h"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace cgx::binding {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

const char* const kDepartedKey = "departed";
const milliseconds kListenerLag(5);

int millis_until(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, INT32_MAX));
}

// Waits (up to `deadline`) for `events` on `fd`; the events that came, or 0.
int wait_for(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int n = ::poll(&p, 1, millis_until(deadline));
    if (n > 0) return p.revents;
    if (n == 0 || errno != EINTR) return 0;
  }
}

}  // namespace

StoreHostDeparture::~StoreHostDeparture() { close_watch(); }

void StoreHostDeparture::arm(int rank, int watch_fd, milliseconds wait_for_host,
                             milliseconds grace) {
  close_watch();
  armed_ = true;
  rank_ = rank;
  watch_fd_ = watch_fd;
  wait_for_host_ = wait_for_host;
  grace_ = grace;
}

void StoreHostDeparture::leave(c10d::Store& store) {
  if (!armed_) return;
  armed_ = false;
  if (rank_ == 0) {
    try {
      store.set(kDepartedKey, std::vector<uint8_t>{'1'});
    } catch (const std::exception&) {
      // a store hosted elsewhere that has gone: nobody is left to tell
    }
  } else if (server_closing(store)) {
    // The server's thread closes its connections, the watch among them, then its listening
    // socket: microseconds apart, unless it loses its core in between, to this very thread woken
    // by the watch's closing, say. A connection made meanwhile would still reach the old server:
    // the pause hands the core back first.
    std::this_thread::sleep_for(kListenerLag);
  }
  close_watch();
}

bool StoreHostDeparture::server_closing(c10d::Store& store) const {
  if (watch_closed(milliseconds(0))) return true;  // rank 0 has left already: no store traffic
  const auto start = Clock::now();
  try {
    store.wait({kDepartedKey}, wait_for_host_);
  } catch (const std::exception&) {
    // Rank 0 did not leave in time (its server stays), or the server broke the connection: it
    // is going (the watch closes with it).
    if (Clock::now() - start >= wait_for_host_) return false;
  }
  return watch_closed(grace_);
}

bool StoreHostDeparture::watch_closed(milliseconds timeout) const {
  // Nothing is ever sent on the watch: readable means closed (or broken) by the server.
  return watch_fd_ >= 0 && wait_for(watch_fd_, POLLIN, Clock::now() + timeout) != 0;
}

void StoreHostDeparture::close_watch() {
  if (watch_fd_ >= 0) ::close(watch_fd_);
  watch_fd_ = -1;
}

}  // namespace cgx::binding
