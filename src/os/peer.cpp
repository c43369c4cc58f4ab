#include "os/peer.h"

#include <sys/socket.h>
#include <unistd.h>

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
