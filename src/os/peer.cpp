#include "os/peer.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include <algorithm>
#include <cerrno>

#include "tensorwire/core/error.h"

namespace tensorwire::os {

PeerCredentials peer_credentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    throw SystemError("SO_PEERCRED", errno);
  return {cred.pid, cred.uid, cred.gid};
}

namespace {

// One address of /proc/net/tcp{,6}: the kernel prints each 32-bit word of the address as
// it lies in memory, read as a host-order number ("%08X"), then ":" and the port in hex.
bool parse_proc_address(const std::string& field, in6_addr& addr, uint16_t& port, bool v6) {
  const auto colon = field.find(':');
  const size_t words = v6 ? 4 : 1;
  if (colon != 8 * words) return false;
  addr = in6_addr{};
  for (size_t i = 0; i < words; ++i) {
    const uint32_t w = static_cast<uint32_t>(std::stoul(field.substr(8 * i, 8), nullptr, 16));
    std::memcpy(reinterpret_cast<char*>(&addr) + 4 * i, &w, 4);
  }
  port = static_cast<uint16_t>(std::stoul(field.substr(colon + 1), nullptr, 16));
  return true;
}

}  // namespace

std::optional<uid_t> tcp_socket_owner(const std::string& ip, uint16_t port, bool listening,
                                      std::optional<uint16_t> remote_port) {
  in_addr v4{};
  in6_addr want{};
  const bool is4 = ::inet_pton(AF_INET, ip.c_str(), &v4) == 1;
  if (!is4 && ::inet_pton(AF_INET6, ip.c_str(), &want) != 1) return std::nullopt;
  for (const bool v6 : {false, true}) {
    // An IPv4 address on an IPv6 socket reads as ::ffff:a.b.c.d.
    in6_addr target{};
    if (is4 && !v6) {
      std::memcpy(&target, &v4, 4);
    } else if (is4) {
      reinterpret_cast<uint8_t*>(&target)[10] = 0xff;
      reinterpret_cast<uint8_t*>(&target)[11] = 0xff;
      std::memcpy(reinterpret_cast<char*>(&target) + 12, &v4, 4);
    } else if (v6) {
      target = want;
    } else {
      continue;
    }
    std::ifstream table(v6 ? "/proc/net/tcp6" : "/proc/net/tcp");
    std::string line;
    std::getline(table, line);  // the header
    while (std::getline(table, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state, queues, timer, retransmits;
      uint64_t uid = 0;
      if (!(fields >> slot >> local >> remote >> state >> queues >> timer >> retransmits >> uid))
        continue;
      // TIME_WAIT (06) and NEW_SYN_RECV (0C): no process's socket, printed as uid 0.
      if (state == "06" || state == "0C") continue;
      in6_addr addr{}, raddr{};
      uint16_t p = 0, rp = 0;
      try {
        if (!parse_proc_address(local, addr, p, v6)) continue;
        if (!parse_proc_address(remote, raddr, rp, v6)) continue;
      } catch (const std::exception&) {
        continue;
      }
      const bool is_listening = state == "0A";
      if (p != port || is_listening != listening) continue;
      if (remote_port && rp != *remote_port) continue;
      const in6_addr any{};
      if (std::memcmp(&addr, &target, sizeof addr) == 0 ||
          (listening && std::memcmp(&addr, &any, sizeof addr) == 0))
        return static_cast<uid_t>(uid);
    }
  }
  return std::nullopt;
}

PeerPolicy::PeerPolicy(const std::vector<int64_t>& allowed_uids) {
  for (int64_t uid : allowed_uids) {
    // (uid_t)-1 is no user: chown() and setreuid() read it as "leave unchanged".
    if (uid < 0 || uid >= UINT32_MAX)
      throw ValueError("allowed_uids entry must be a uid from 0 to " +
                       std::to_string(UINT32_MAX - 1) + ", got " + std::to_string(uid));
    allowed_.push_back(static_cast<uint32_t>(uid));
  }
}

bool PeerPolicy::admits(uid_t uid) const noexcept {
  return uid == ::geteuid() || std::find(allowed_.begin(), allowed_.end(), uid) != allowed_.end();
}

std::string PeerPolicy::refusal(const PeerCredentials& peer, const std::string& endpoint) const {
  if (admits(peer.uid)) return {};
  std::string who = "uid " + std::to_string(::geteuid());
  for (uint32_t u : allowed_) who += ", " + std::to_string(u);
  return "'" + endpoint + "' refused a connection from pid " + std::to_string(peer.pid) +
         " of uid " + std::to_string(peer.uid) + ": it admits " + who +
         " only (its own user; list more in its allowed_uids option)";
}

void check_server(const PeerCredentials& server, const std::string& endpoint) {
  if (server.uid == ::geteuid() || server.uid == 0) return;
  throw SystemError("refusing to talk to '" + endpoint + "': it is served by pid " +
                        std::to_string(server.pid) + " of uid " + std::to_string(server.uid) +
                        ", not by this user (uid " + std::to_string(::geteuid()) + ") or root",
                    EACCES);
}

}  // namespace tensorwire::os
