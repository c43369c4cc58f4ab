// The client side of a SharedMemoryTransport: claim a slot, write the request, mark it
// ready, wait for the answer on the slot's wake-up word.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "client_impl.h"
#include "os/process.h"
#include "os/unix_socket.h"
#include "shm_region.h"

namespace tensorwire::inference::detail {

// One client's hold on the transport, valid in the process that made it.
struct ShmConnection {
  std::shared_ptr<ShmRegion> region;
  uint32_t id = 0;
  os::UnixSocket socket;                  // attached clients: open and silent (EOF = death)
  std::optional<os::ProcessWatch> owner;  // attached clients: the serving process
  int owner_pid = 0;
  uint64_t fork_generation = 0;
  os::AdaptiveSpin reply_wait, slot_wait;  // budgets learnt from this client's waits

  bool owner_alive() const { return !owner || owner->alive(); }
  bool stale() const noexcept;  // made in another process (we are a forked copy)
  std::string gone_message() const;
};

// Connects to the transport listening on `name` (the attach handshake), interruptibly.
std::shared_ptr<ShmConnection> attach_by_name(const std::string& name, Deadline deadline);

class ShmClient final : public ClientImpl {
 public:
  // `local`: the owner's region when the client is made in the owner process (it then
  // needs no socket); null to attach by name on first use.
  ShmClient(std::string name, std::shared_ptr<ShmRegion> local);

  std::unique_ptr<Pending> submit(const TensorDict& td, Deadline deadline) override;
  const char* kind() const noexcept override { return "shared_memory"; }
  std::string address() const override { return name_; }
  std::optional<std::vector<RequestLeaf>> request_leaves(Deadline connect_by) override;
  void close() noexcept override;

 private:
  // Attaches within kConnectTimeout, or by `limit` where the calling request must give up
  // sooner.
  std::shared_ptr<ShmConnection> connection(Deadline limit = Deadline::never());
  uint32_t claim(ShmConnection& c, Deadline deadline);

  std::string name_;
  std::shared_ptr<ShmRegion> local_;
  uint64_t local_generation_ = 0;
  std::mutex mu_;
  std::shared_ptr<ShmConnection> conn_;
  // Set under mu_; read without it by a submit waiting for a slot, which close() ends.
  std::atomic<bool> closed_{false};
  std::atomic<uint32_t> hint_{0};
};

}  // namespace tensorwire::inference::detail
