// The client side of a RemoteTransport (private): one UCX worker and endpoint per client
// (shared by its copies), requests sent from the caller's tensors, each response received
// straight into memory the result then owns.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client_impl.h"
#include "runtime/heartbeat.h"
#include "slot_layout.h"
#include "tensorwire/inference/remote_transport.h"
#include "ucx/control.h"
#include "ucx/heartbeats.h"
#include "ucx/ucx.h"
#include "ucx/worker_wait.h"

namespace tensorwire::inference::detail {

// One connection to the server. Every UCX call under mu.
class RemoteLink : public runtime::Beating {
 public:
  RemoteLink(const std::string& host, uint16_t port, const RemoteClientOptions& options,
             Deadline deadline);
  ~RemoteLink() override;

  // Under mu: progress; throws ClosedError / ProtocolError once the link failed.
  void step();
  // Waits (mu not held) until progress may be possible or `slice` passes.
  void wait(Deadline slice, uint64_t seen);
  void fail(const std::string& why, bool protocol);  // under mu
  void check() const;                                // under mu: throws the failure
  // A forked child's copy, made by its parent (no lock: mu may be held for good by a
  // thread of the parent), and what using it is.
  bool inherited() const noexcept { return ucx::inherited(generation); }
  std::string inherited_error() const;
  // How long the rest of a message that began to arrive may take (ucx::frame_deadline).
  Deadline frame_deadline() const { return ucx::frame_deadline(options_.liveness_timeout); }
  void beat() noexcept override;

  std::mutex mu;
  std::unique_ptr<ucx::Worker> worker;
  std::unique_ptr<ucx::Endpoint> ep;
  SlotLayout request, response;  // one-slot layouts of the specs
  uint32_t num_slots = 0;
  uint64_t next_seq = 1;
  uint32_t in_flight = 0;  // requests sent and not yet answered
  std::string failure;
  bool failure_protocol = false;
  const uint64_t generation;
  std::string address;                            // "host:port"
  std::chrono::milliseconds heartbeat_period{0};  // 0: no heartbeats

  // A request dropped before its answer came: its receive stays posted until the answer
  // (or its failure) arrives, so nothing lands in freed memory or stays queued in UCX.
  struct Orphan {
    uint64_t seq;
    Storage buffer;
    std::vector<ucp_dt_iov_t> iov;
    size_t length = 0;
    std::vector<ucp_dt_iov_t> send_iov;
    ucx::Request recv;
    ucx::Request send;
    // The request's bytes, copied at submit: the caller may reuse its arrays at once, as
    // with every other transport (UCX reads a large send's source only when the server
    // posts its receive, which waits for a free slot). It also means an orphan holds no
    // caller memory, whose release could need the GIL while `mu` is held (a Python
    // thread holding the GIL and waiting for `mu` would then deadlock with it).
    Storage sent;
  };
  std::vector<std::unique_ptr<Orphan>> orphans;

 private:
  void reap_orphans();  // under mu
  ucx::Heartbeats heartbeats_;
  ucx::WorkerWait waiting_;  // the sleep of wait() (the threads of requests share worker)
  RemoteClientOptions options_;
};

class RemoteClient final : public ClientImpl {
 public:
  RemoteClient(std::string host, uint16_t port, RemoteClientOptions options);

  std::unique_ptr<Pending> submit(const TensorDict& td, Deadline deadline) override;
  const char* kind() const noexcept override { return "remote"; }
  std::string address() const override;
  std::optional<std::vector<RequestLeaf>> request_leaves(Deadline connect_by) override;
  void close() noexcept override;
  // Connects now (within connect_timeout) when not connected yet.
  std::shared_ptr<RemoteLink> link(Deadline limit = Deadline::never());

 private:
  [[noreturn]] void throw_closed() const;

  std::string host_;
  uint16_t port_;
  RemoteClientOptions options_;
  std::mutex mu_;
  std::shared_ptr<RemoteLink> link_;
  // Set under mu_; read without it by a submit waiting for room, which close() ends.
  std::atomic<bool> closed_{false};
};

// "host:port" -> (host, port); ValueError naming the address otherwise.
std::pair<std::string, uint16_t> parse_address(const std::string& address);

}  // namespace tensorwire::inference::detail
