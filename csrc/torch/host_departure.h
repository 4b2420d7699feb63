// Leaving the default group when its rank 0 may host the store (env://, tcp://): rank 0's store
// server goes when rank 0 destroys the group, and a group created next on the same port must not
// reach that old server from another rank (it connects, then fails when the server goes: torch's
// race, which Gloo loses too; docs/reliability.md, section 7).
//
// So on destroy (ProcessGroupCGX::shutdown, once the group's threads have stopped) rank 0
// announces that it has left, and every other rank waits for that announcement, then for the
// server to close the watch (a connection this rank opened to it at creation and never writes
// to), and a moment more for it to close its listening socket. Only then does
// destroy_process_group return, so this rank's next init_process_group can only meet the next
// server. The waits are bounded: a rank 0 that does not destroy the group holds the others for at
// most `wait_for_host` (+ `grace`); a server that outlives the group (a store the script keeps)
// holds them for at most `grace` after the announcement. A watch closed already (rank 0 left
// first, or died) skips the store.
#pragma once

#include <chrono>
#include <torch/csrc/distributed/c10d/Store.hpp>

namespace cgx::binding {

class StoreHostDeparture {
 public:
  StoreHostDeparture() = default;
  ~StoreHostDeparture();
  StoreHostDeparture(const StoreHostDeparture&) = delete;
  StoreHostDeparture& operator=(const StoreHostDeparture&) = delete;

  // Rank 0 will announce; any other rank will wait, watching `watch_fd` (a socket connected to
  // the store's server, owned from now on; -1: none, then only the announcement is waited for).
  void arm(int rank, int watch_fd, std::chrono::milliseconds wait_for_host,
           std::chrono::milliseconds grace);
  bool armed() const { return armed_; }
  // The announcement (rank 0) or the waits (the others), once; never throws. `store` holds the
  // group instance's keys. Blocks: the caller releases the GIL.
  void leave(c10d::Store& store);

 private:
  // Whether the server is going: the watch closed, at once or within `grace` of rank 0's
  // announcement.
  bool server_closing(c10d::Store& store) const;
  // Whether the server closes the watch within `timeout` (zero: has closed it already).
  bool watch_closed(std::chrono::milliseconds timeout) const;
  void close_watch();

  bool armed_ = false;
  int rank_ = 0;
  int watch_fd_ = -1;
  std::chrono::milliseconds wait_for_host_{0};
  std::chrono::milliseconds grace_{0};
};

}  // namespace cgx::binding
