// SharedMemoryTransport: batched inference requests through preallocated shared-memory
// slot banks (docs/inference.md has the layout and the protocol).
//
// Three anonymous memfd segments: a small control area (slot states, wake-up words,
// error texts), a request bank and a response bank, each bank holding `num_slots` rows
// of the spec's leaves. A client claims a free slot, writes its request into the slot's
// rows and marks it ready; the server takes ready slots, runs the policy on a batch that
// is a zero-copy view of the bank when the slots are contiguous (one gather per leaf
// into a staging buffer allocated once otherwise), writes each response row and wakes
// its client. Only slot indices and control words change hands: nothing is serialized.
//
// The segments are passed over an abstract Unix socket named name(), so any process can
// attach by name, nothing exists in /dev/shm, and nothing is left behind however the
// processes end. The process that created the transport serves it: it watches every
// attached client (socket EOF, pidfd) and reclaims the slots of one that dies; clients
// watch it and raise ClosedError within a second when it is gone.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

namespace detail {
struct ShmRegion;
class ShmOwner;
struct ShmAccess;
}  // namespace detail

struct SharedMemoryOptions {
  int64_t num_slots = 0;    // 1 to kMaxSlots: the bound on requests in flight across all clients
  bool copy_result = true;  // false: results are views of the response slot (see below)
  std::string name;         // abstract socket name; empty: a unique one
  // Pause iterations a waiter spins before sleeping on a futex (about 50 ns each on the
  // machines this was measured on); see docs/inference.md for the trade-off.
  uint32_t spin = 400;
  // Users admitted besides this process's own (an abstract socket has no file permissions:
  // every attaching process's uid is checked, SO_PEERCRED). A refused client gets a
  // PermissionError naming its uid before any segment fd or byte of a spec travels.
  std::vector<int64_t> allowed_uids;
};

class SharedMemoryTransport : public Transport {
 public:
  // Lays out the banks from single-request specs (keys, shapes, dtypes and batch size
  // of every leaf) and starts accepting attachments on the name.
  //   TypeError: a spec holds a non-tensor value;  ValueError: a spec has no tensor leaf,
  //   a leaf is not on the CPU, or num_slots < 1.
  // With copy_result = false a result is a view into its response slot, valid until a
  // later request reuses the slot: read (or copy) it before submitting again. It is locked
  // (its keys are the bank's), as torchrl's slot views are.
  static std::shared_ptr<SharedMemoryTransport> create(const TensorDict& request_spec,
                                                       const TensorDict& response_spec,
                                                       SharedMemoryOptions options);
  // Connects to a transport created by another process, waiting (interruptibly) up to
  // `timeout` for it to listen and answer (ConnectionRefused, a ClosedError, when nothing
  // listens on the name; ClosedError when its process is gone). The result makes clients;
  // it cannot serve.
  static std::shared_ptr<SharedMemoryTransport> attach(const std::string& name,
                                                       Timeout timeout = std::chrono::seconds(5));
  // A client of the transport with that name, connecting on first use (so it can be
  // made before the transport exists, or sent to another process by name).
  static Client client_for(const std::string& name);

  ~SharedMemoryTransport() override;
  SharedMemoryTransport(const SharedMemoryTransport&) = delete;
  SharedMemoryTransport& operator=(const SharedMemoryTransport&) = delete;

  const std::string& name() const noexcept;
  uint32_t num_slots() const noexcept;
  bool copy_result() const noexcept;
  const TensorDict& request_spec() const noexcept;
  const TensorDict& response_spec() const noexcept;
  std::vector<Key> request_keys() const;
  std::vector<Key> response_keys() const;
  // Bytes of each segment (control area, request bank, response bank).
  struct Sizes {
    size_t control = 0, requests = 0, responses = 0;
    size_t total() const noexcept { return control + requests + responses; }
  };
  Sizes sizes() const noexcept;
  // True in the process that created the transport (the one that can serve it).
  bool is_owner() const noexcept;
  // Slots currently not free (claimed, in flight or holding an unread response).
  uint32_t slots_in_use() const noexcept;
  // Attachments refused (a user not admitted: see allowed_uids), and why the last one was;
  // 0 and "" on an attached transport, which admits nobody itself.
  uint64_t refused() const noexcept;
  std::string last_refusal() const;

  const char* kind() const noexcept override { return "shared_memory"; }
  Client client() override;

  void open_server() override;
  void close_server(const std::string& reason, bool fail_pending) override;
  void release_server() noexcept override;
  void wait_for_work(Deadline deadline) override;
  void interrupt() override;
  bool has_work() override;
  bool notify_work(std::function<void()> on_work) override;
  void drain(size_t max_items, Drained& out) override;
  void collate(const Drained& drained, std::vector<Group>& groups) override;
  void resolve(const Drained& drained, const Group& group, const TensorDict& output,
               const VersionStamp& stamp) override;
  void reject(const Drained& drained, std::span<const size_t> rows,
              const RemoteError& error) override;

 private:
  friend struct detail::ShmAccess;
  SharedMemoryTransport() = default;
  std::string name_;
  std::shared_ptr<detail::ShmRegion> region_;
  std::unique_ptr<detail::ShmOwner> owner_;  // only in the creating process
  std::shared_ptr<void> attachment_;         // attached: the connection to the owner
};

}  // namespace tensorwire::inference
