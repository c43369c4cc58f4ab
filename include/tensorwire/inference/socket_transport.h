// SocketTransport: requests of any structure from any process, as wire-codec messages
// over an abstract Unix socket (the role of torchrl's MPTransport, without pickling).
//
// Each request and response is one tensorwire message (docs/protocol.md) prefixed with a
// kind byte and a request id. Requests of different structures are batched separately.
// The owner watches each client (EOF, pidfd) and drops the requests of one that died;
// clients watch the owner (EOF, pidfd) and raise ClosedError when it is gone. Slower
// than SharedMemoryTransport (every byte crosses the kernel twice, and is decoded), but
// needs no spec.
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

struct SocketOptions {
  std::string name;  // abstract socket name; empty: a unique one
  // Users admitted besides this process's own (an abstract socket has no file
  // permissions: every connection's uid is checked, SO_PEERCRED). A refused client gets a
  // PermissionError naming its uid before any byte of a request or answer travels.
  std::vector<int64_t> allowed_uids;
};

class SocketTransport : public Transport {
 public:
  static std::shared_ptr<SocketTransport> create(SocketOptions options = {});
  // A client of the transport listening on `name`, connecting on first use.
  static Client client_for(const std::string& name);
  ~SocketTransport() override;

  const std::string& name() const noexcept;
  const char* kind() const noexcept override { return "socket"; }
  // Connections refused (a user not admitted), and why the last one was.
  uint64_t refused() const noexcept;
  std::string last_refusal() const;
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

  struct Owner;

 private:
  SocketTransport() = default;
  std::unique_ptr<Owner> o_;
};

}  // namespace tensorwire::inference
