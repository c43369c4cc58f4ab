// RemoteTransport: inference requests from other hosts, over UCX (TCP today; InfiniBand or
// RoCE where UCX finds them; UCX_TLS selects, as for the pipe). Fixed request and response
// specs, as SharedMemoryTransport, validated by the same rules with the same errors.
//
// The server keeps a bank of `num_slots` slots (slot_layout: one region per leaf). A remote
// request is one UCX message of the request's leaf bytes, received by UCX straight into a
// free slot's rows (no intermediate buffer of ours); the batch the policy sees is a view of
// the bank when the slots are contiguous; each response goes out from its slot. Only
// fixed-size raw leaf bytes cross the network after the handshake: nothing received is ever
// unpickled or parsed as a structure, and a message of the wrong size (a client built for
// another spec, a malformed frame) is refused before any slot is written: its connection is
// closed with a ProtocolError naming the rule, other clients are unaffected.
//
// Connections: the pipe's handshake (wire/handshake.h): versions agree and, with an
// auth_key, both sides prove the shared key (HMAC challenge-response; a wrong key is refused
// on both sides with a clear error). Without a key, anyone who reaches the port can submit
// requests and read responses: for trusted networks only. Liveness: both sides send
// heartbeats; a peer silent for longer than `liveness_timeout` (default 10 s,
// TENSORWIRE_LIVENESS_TIMEOUT) is gone: a client raises ClosedError, the server drops the
// client's requests and frees its slots.
//
// Threads: a listener thread accepts connections; each connection has a thread of its own
// (its UCX worker and endpoint: handshake, receives into slots, sends responses, heartbeats).
// The InferenceServer's serving thread drains ready slots and hands answers to connection
// threads (a queue and a wake-up of the connection's worker).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "tensorwire/inference/transport.h"
#include "tensorwire/runtime/liveness.h"

namespace tensorwire::inference {

namespace detail {
class RemoteServer;
struct RemoteAccess;
}  // namespace detail

struct RemoteOptions {
  int64_t num_slots = 0;  // 1 to kMaxSlots: the bound on requests in flight across all clients
  std::string host = "0.0.0.0";  // the address to listen on
  int64_t port = 0;              // 0 to 65535; 0: any free port (see port())
  std::string auth_key;          // empty: no authentication (trusted networks only)
  std::chrono::milliseconds liveness_timeout = default_liveness_timeout();  // 0: off
  std::chrono::milliseconds handshake_timeout = std::chrono::seconds(10);
};

struct RemoteClientOptions {
  std::string auth_key;
  std::chrono::milliseconds liveness_timeout = default_liveness_timeout();  // 0: off
  Timeout connect_timeout = std::chrono::seconds(10);  // the handshake's budget
};

class RemoteTransport : public Transport {
 public:
  // Checks the options (ValueError naming num_slots or port), lays out the bank (TypeError /
  // ValueError as SharedMemoryTransport::create) and listens (SystemError when the port is
  // taken).
  static std::shared_ptr<RemoteTransport> create(const TensorDict& request_spec,
                                                 const TensorDict& response_spec,
                                                 RemoteOptions options);
  // A client connected to the transport at host:port: the handshake runs now
  // (ConnectionRefused when nothing listens, ClosedError when the connection breaks,
  // HandshakeError, tensorwire/core/error.h, for a wrong or missing key).
  static Client connect(const std::string& host, uint16_t port, RemoteClientOptions options = {});
  // A client of "host:port" that connects on first use (so it can be sent to another process
  // by address). ValueError for an address that is not "host:port".
  static Client client_for(const std::string& address, RemoteClientOptions options = {});

  ~RemoteTransport() override;
  RemoteTransport(const RemoteTransport&) = delete;
  RemoteTransport& operator=(const RemoteTransport&) = delete;

  uint16_t port() const noexcept;
  const std::string& host() const noexcept;
  uint32_t num_slots() const noexcept;
  const TensorDict& request_spec() const noexcept;
  const TensorDict& response_spec() const noexcept;
  std::vector<Key> request_keys() const;
  std::vector<Key> response_keys() const;
  // Clients connected now (handshake done), slots not free, and connections refused (bad
  // handshake, wrong key, bad frames, a client that stalls or vanishes in its handshake for
  // longer than handshake_timeout) with why the last one was. Closing the transport ends
  // handshakes in progress at once, uncounted.
  size_t connected() const;
  uint32_t slots_in_use() const;
  uint64_t refused() const noexcept;
  std::string last_refusal() const;

  const char* kind() const noexcept override { return "remote"; }
  // A client connecting over UCX to this transport (127.0.0.1 when it listens on every
  // interface), with its auth key, on first use.
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
  friend struct detail::RemoteAccess;
  RemoteTransport() = default;
  std::shared_ptr<detail::RemoteServer> s_;
};

}  // namespace tensorwire::inference
