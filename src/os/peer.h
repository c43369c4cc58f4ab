// Who may connect to a local endpoint. Abstract Unix sockets carry no file permissions: any
// process of any user in the same network namespace can connect to one. So every local
// endpoint reads its peer's credentials (SO_PEERCRED: set by the kernel at connect, they
// cannot be forged) and refuses a peer it does not admit before it hands over any byte or
// fd, and a client checks its server the same way (a name can be squatted).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace tensorwire::os {

struct PeerCredentials {
  int pid = 0;
  uid_t uid = 0;
  gid_t gid = 0;
};

// The credentials of the peer of a connected Unix socket.
PeerCredentials peer_credentials(int fd);

// The owner of a TCP socket of this network namespace, from /proc/net/tcp and tcp6 (the
// kernel's record: it cannot be forged by the peer): the socket bound to `ip`:`port`,
// listening (`listening`: bound to that address or to every address) or not, then
// connected to `remote_port` when given. std::nullopt when there is none. Sockets in
// TIME_WAIT or half-open (a pending SYN) are not sockets of a process, and the kernel shows
// them as uid 0: they never count (one left by an earlier connection from the same port
// made a peer of another user look like root's). For connections whose other end is a
// library's socket (UCX's), where SO_PEERCRED cannot be asked.
std::optional<uid_t> tcp_socket_owner(const std::string& ip, uint16_t port, bool listening,
                                      std::optional<uint16_t> remote_port = std::nullopt);

// The users an endpoint admits: the effective uid of this process, and the uids of
// `allowed_uids` (an explicit allow-list: nobody else, not even root unless listed).
class PeerPolicy {
 public:
  PeerPolicy() = default;
  // ValueError naming the entry when one is not a uid (0 to 4294967294).
  explicit PeerPolicy(const std::vector<int64_t>& allowed_uids);

  bool admits(uid_t uid) const noexcept;
  // Why `peer` is refused by the endpoint named `endpoint` ("" when it is admitted): names
  // the peer's pid and uid, who is admitted, and the option that admits more.
  std::string refusal(const PeerCredentials& peer, const std::string& endpoint) const;
  const std::vector<uint32_t>& allowed_uids() const noexcept { return allowed_; }

 private:
  std::vector<uint32_t> allowed_;
};

// What a client admits as its server: a process of its own user, or of root (which can
// read any process's memory anyway: refusing it would protect nothing). Throws
// SystemError(EACCES) (Python: PermissionError) naming both uids otherwise.
void check_server(const PeerCredentials& server, const std::string& endpoint);

}  // namespace tensorwire::os
