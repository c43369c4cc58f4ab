#include "wire/handshake.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>
#include <unistd.h>

#include <fstream>
#include <limits>
#include <span>

#include "wire/hex.h"

namespace tensorwire::wire {

namespace {

constexpr int kVersion = 1;
// A peer may ask for heartbeats at most this rarely (1 h); 0 asks for none.
constexpr int64_t kMaxHeartbeatMs = 3600 * 1000;

std::string nonce() {
  unsigned char buf[16];
  if (::getrandom(buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf))
    throw SystemError("getrandom", errno);
  return to_hex(std::as_bytes(std::span(buf)));
}

// Both read when the library is loaded, not at first use: a fork() while another thread
// initialized a function-local static leaves the child waiting for ever on the copied guard.
std::string read_boot_id() {
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::string s;
  std::getline(f, s);
  return s;
}
const std::string g_boot_id = read_boot_id();

const std::string& boot_id() {
  return g_boot_id;
}

// The pid and IPC namespaces ("pid:[4026531836] ipc:[4026531839]"): two processes of one
// host (equal boot ids) can share memory and read each other's memory only in the same
// ones; containers share the boot id but not these.
std::string read_namespaces() {
  std::string out;
  for (const char* n : {"pid", "ipc"}) {
    char buf[64] = {};
    const std::string path = std::string("/proc/self/ns/") + n;
    ssize_t len = ::readlink(path.c_str(), buf, sizeof buf - 1);
    if (len <= 0) return std::string();  // unknown: never "the same"
    if (!out.empty()) out += ' ';
    out.append(buf, static_cast<size_t>(len));
  }
  return out;
}
const std::string g_namespaces = read_namespaces();

const std::string& namespaces() {
  return g_namespaces;
}

bool same_secret(const std::string& a, const std::string& b) {
  return a.size() == b.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

// The fields of a peer's message, read without trusting their types: Json::value() throws
// a JSON type_error (not a HandshakeError) when the peer sent another type.
std::string str_field(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool is_true(const Json& j, const char* name) {
  auto it = j.find(name);
  return it != j.end() && it->is_boolean() && it->get<bool>();
}

PeerIdentity identity_of(const Json& hello) {
  PeerIdentity p;
  // Only a valid pid: a larger number would be cut to another process's (or 0) by get<int>.
  if (auto it = hello.find("pid"); it != hello.end() && it->is_number_integer() &&
                                   it->get<int64_t>() > 0 &&
                                   it->get<int64_t>() <= std::numeric_limits<int>::max())
    p.pid = static_cast<int>(it->get<int64_t>());
  p.boot_id = str_field(hello, "boot_id");
  p.namespaces = str_field(hello, "namespaces");
  if (auto it = hello.find("heartbeat_ms"); it != hello.end() && it->is_number_integer())
    p.heartbeat_ms = it->get<int64_t>();  // its range is checked by check_hello
  p.split_payloads = is_true(hello, "split_payloads");
  p.host_verdict = is_true(hello, "host_verdict");
  return p;
}

Json hello(const HandshakeConfig& c, const char* role, const std::string& my_nonce) {
  Json h = {{"tensorwire", kVersion},
            {"role", role},
            {"protocol", c.protocol},
            {"mode", c.mode},
            {"auth", !c.auth_key.empty()},
            {"nonce", my_nonce},
            {"pid", static_cast<int>(::getpid())},
            {"boot_id", boot_id()},
            {"namespaces", namespaces()}};
  if (c.heartbeat_ms >= 0) h["heartbeat_ms"] = c.heartbeat_ms;
  if (c.split_payloads) h["split_payloads"] = true;
  if (c.host_verdict) h["host_verdict"] = true;
  return h;
}

// What is wrong with the peer's hello, or "" when nothing is.
std::string check_hello(const HandshakeConfig& c, const Json& h, const char* expected_role) {
  const auto version = h.is_object() ? h.find("tensorwire") : h.end();
  if (!h.is_object() || version == h.end() || !version->is_number_integer() ||
      version->get<int64_t>() != kVersion)
    return "peer does not speak tensorwire handshake version " + std::to_string(kVersion);
  if (str_field(h, "role") != expected_role) return std::string("peer is not a ") + expected_role;
  // Named by role, not "this side": a server's reason is relayed to the client as it is.
  const std::string me = std::string(expected_role) == "server" ? "client" : "server";
  if (str_field(h, "protocol") != c.protocol)
    return "protocol mismatch: the " + me + " is a '" + c.protocol + "', the " + expected_role +
           " a '" + str_field(h, "protocol") + "'";
  if (auto it = h.find("heartbeat_ms");
      it != h.end() &&
      (!it->is_number_integer() || it->get<int64_t>() < 0 || it->get<int64_t>() > kMaxHeartbeatMs))
    return "heartbeat_ms must be an integer from 0 to " + std::to_string(kMaxHeartbeatMs) +
           ", got " + it->dump();
  for (const char* flag : {"split_payloads", "host_verdict"})
    if (auto it = h.find(flag); it != h.end() && !it->is_boolean())
      return std::string(flag) + " must be a boolean, got " + it->dump();
  if (str_field(h, "mode") != c.mode)
    return "mode mismatch: the " + me +
           " uses consolidated=" + std::string(c.mode == "consolidated" ? "True" : "False") +
           ", the " + expected_role + " consolidated=" +
           std::string(str_field(h, "mode") == "consolidated" ? "True" : "False");
  return "";
}

}  // namespace

bool PeerIdentity::same_host() const {
  return !boot_id.empty() && boot_id == wire::boot_id();
}

bool PeerIdentity::same_namespaces() const {
  return same_host() && !namespaces.empty() && namespaces == wire::namespaces();
}

std::string hmac_sha256_hex(const std::string& key, const std::string& message) {
  unsigned char out[EVP_MAX_MD_SIZE];
  unsigned int len = 0;
  if (!HMAC(EVP_sha256(), key.data(), static_cast<int>(key.size()),
            reinterpret_cast<const unsigned char*>(message.data()), message.size(), out, &len))
    throw Error("HMAC-SHA256 failed");
  return to_hex(std::as_bytes(std::span(out, len)));
}

PeerIdentity handshake_as_server(const HandshakeConfig& c, const SendControl& send,
                                 const RecvControl& recv) {
  const std::string my_nonce = nonce();
  send(hello(c, "server", my_nonce));
  Json h = recv();
  std::string problem = check_hello(c, h, "client");
  const bool peer_auth = h.is_object() && is_true(h, "auth");
  if (problem.empty() && !c.auth_key.empty() && !peer_auth)
    problem = "authentication required: the server has an auth_key and the client gave none";
  if (problem.empty() && c.auth_key.empty() && peer_auth)
    problem =
        "the client gave an auth_key but the server has none (both sides must use the same key)";
  if (problem.empty() && !c.auth_key.empty() &&
      !same_secret(str_field(h, "mac"), hmac_sha256_hex(c.auth_key, "client:" + my_nonce)))
    problem = "authentication failed: the client's auth_key does not match the server's";
  if (!problem.empty()) {
    send({{"ok", false}, {"error", problem}});
    throw HandshakeError("connection refused: " + problem);
  }
  Json verdict = {{"ok", true}, {"mac", nullptr}};
  if (!c.auth_key.empty())
    verdict["mac"] = hmac_sha256_hex(c.auth_key, "server:" + str_field(h, "nonce"));
  send(verdict);
  return identity_of(h);
}

PeerIdentity handshake_as_client(const HandshakeConfig& c, const SendControl& send,
                                 const RecvControl& recv) {
  Json server = recv();
  const std::string my_nonce = nonce();
  Json mine = hello(c, "client", my_nonce);
  mine["mac"] = c.auth_key.empty()
                    ? Json(nullptr)
                    : Json(hmac_sha256_hex(c.auth_key, "client:" + str_field(server, "nonce")));
  send(mine);
  Json verdict = recv();
  if (!verdict.is_object() || !is_true(verdict, "ok")) {
    std::string why = verdict.is_object() ? str_field(verdict, "error") : "";
    throw HandshakeError("connection refused by the server: " +
                         (why.empty() ? check_hello(c, server, "server") : why));
  }
  // A server that says yes to a hello it should have refused, or whose own hello breaks
  // the rules (a heartbeat period out of range), is not believed.
  if (std::string problem = check_hello(c, server, "server"); !problem.empty())
    throw HandshakeError("the server accepted the connection but its hello is invalid: " + problem);
  if (!c.auth_key.empty() &&
      !same_secret(str_field(verdict, "mac"), hmac_sha256_hex(c.auth_key, "server:" + my_nonce)))
    throw HandshakeError("authentication failed: the server does not know the auth_key");
  return identity_of(server);
}

}  // namespace tensorwire::wire
