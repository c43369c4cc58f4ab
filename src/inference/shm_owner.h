// The creating process's side of a SharedMemoryTransport: the listener that hands the
// segments to attaching clients, the watch over those clients (socket EOF and pidfd:
// either means the client is gone, and its slots are reclaimed), and the serving
// thread's scratch state.
#pragma once

#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bank_batch.h"
#include "os/peer.h"
#include "os/unix_socket.h"
#include "shm_region.h"

namespace tensorwire::inference::detail {

class ShmOwner {
 public:
  ShmOwner(std::shared_ptr<ShmRegion> region, const std::string& name, os::PeerPolicy peers);
  ~ShmOwner();
  ShmOwner(const ShmOwner&) = delete;
  ShmOwner& operator=(const ShmOwner&) = delete;

  // True in the creating process (false in a forked copy, which must not serve).
  bool here() const noexcept;
  // Clients currently attached from other processes.
  size_t attached() const noexcept { return attached_.load(std::memory_order_relaxed); }
  // Attachments refused (a user not admitted, no descriptor left), and why the last one was.
  uint64_t refused() const noexcept { return refused_.load(std::memory_order_relaxed); }
  std::string last_refusal() const;

  // An InferenceServer claimed the transport (open_server) and its serving thread has not
  // ended yet (close_server with fail_pending): the shared server state says kStopped from
  // the start of a shutdown, while that thread may still run (a shutdown that timed out).
  std::atomic<bool> claimed{false};
  uint32_t state_before_open = 0;  // the shared server state open_server() replaced

  // Serving-thread scratch, allocated once.
  uint32_t cursor = 0;
  std::vector<uint32_t> taken;
  std::vector<size_t> order;
  BatchViews batch;
  os::AdaptiveSpin doorbell_wait;

 private:
  void run() noexcept;
  // Tells a client it is not admitted, counted and kept as the last refusal.
  void refuse(os::UnixSocket& s, const std::string& why, int code = EACCES);

  std::shared_ptr<ShmRegion> region_;
  std::string name_;
  os::UnixListener listener_;
  os::PeerPolicy peers_;
  std::atomic<uint64_t> refused_{0};
  mutable std::mutex refusal_mu_;
  std::string last_refusal_;
  os::Fd stop_;  // eventfd: wakes the watcher thread to exit
  std::thread thread_;
  uint64_t fork_generation_;
  std::atomic<size_t> attached_{0};
};

}  // namespace tensorwire::inference::detail
