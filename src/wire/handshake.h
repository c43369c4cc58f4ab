// Connection handshake shared by the transports: version and mode agreement, optional
// shared-secret authentication (mutual HMAC-SHA256 challenge-response; the key never
// crosses the wire), and the peer's identity (pid and boot id, so a peer on the same host
// can be watched through a pidfd).
//
//   server -> client  {"tensorwire":1, "role":"server", "protocol", "mode", "auth", "nonce", "pid",
//   "boot_id", "namespaces", ["heartbeat_ms"]} client -> server  {... "role":"client", "nonce",
//   "mac": HMAC(key, "client:" + server nonce) | null} server -> client  {"ok": true, "mac":
//   HMAC(key, "server:" + client nonce) | null}
//                     or {"ok": false, "error": "..."}
//
// Without a key the handshake authenticates nothing: for trusted networks only.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include "tensorwire/core/error.h"
#include "tensorwire/core/json.h"

namespace tensorwire::wire {

struct HandshakeConfig {
  std::string protocol;  // e.g. "pipe"; both sides must agree
  std::string mode;      // e.g. "consolidated"; both sides must agree
  std::string auth_key;  // empty: no authentication
  // How often (ms) this side wants the peer's heartbeats; 0: it checks none (but sends them
  // when the peer asks); -1: this side does not speak heartbeats (not announced).
  int64_t heartbeat_ms = -1;
  // This side takes a payload of any size on its own message (the pipe's split payloads,
  // docs/protocol.md section 9.1): announced as "split_payloads": true.
  bool split_payloads = false;
  // This side sends its verdict on sharing the peer's host with its worker address (the
  // pipe, docs/protocol.md section 9.1): announced as "host_verdict": true.
  bool host_verdict = false;
};

struct PeerIdentity {
  int pid = -1;
  std::string boot_id;          // equal boot ids: the peer runs on this machine
  std::string namespaces;       // its pid and IPC namespaces, as /proc/self/ns names them
  int64_t heartbeat_ms = -1;    // as HandshakeConfig::heartbeat_ms, from the peer's hello
  bool split_payloads = false;  // as HandshakeConfig::split_payloads
  bool host_verdict = false;    // as HandshakeConfig::host_verdict
  bool same_host() const;
  // On this machine and in this process's pid and IPC namespaces (not another container):
  // shared memory and cross-memory attach between the two work.
  bool same_namespaces() const;
};

// Raised when a handshake fails (public: tensorwire/core/error.h).
using tensorwire::HandshakeError;

using SendControl = std::function<void(const Json&)>;
using RecvControl = std::function<Json()>;  // throws on timeout or a closed connection

PeerIdentity handshake_as_server(const HandshakeConfig& config, const SendControl& send,
                                 const RecvControl& recv);
PeerIdentity handshake_as_client(const HandshakeConfig& config, const SendControl& send,
                                 const RecvControl& recv);

// HMAC-SHA256(key, message) as lowercase hex.
std::string hmac_sha256_hex(const std::string& key, const std::string& message);

}  // namespace tensorwire::wire
