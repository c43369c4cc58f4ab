// Listening sockets of tensorwire objects, marked so that a worker forked from the process
// can let go of its copies.
//
// fork() copies every fd. A runner's worker forked while a TensorDictServer, a remote
// inference transport, a shared-memory transport or a RemoteDataZMQ listens holds a copy of
// the listening socket for as long as it lives, and the port (or abstract name) stays taken
// after the object closed it: binding it again fails with "Address already in use". The
// objects mark what they listen on while they do; the dataflow's fork_process() calls
// release_inherited_listeners() in each worker and fork server. Sockets not marked (the
// user's) are left alone.
//
// Thread-safety: marks may be made and dropped from any thread; the registry's lock is held
// across fork() (pthread_atfork), so a child never inherits it locked.
#pragma once

#include <cstdint>
#include <string>

namespace tensorwire::os {

class ListenerMark {
 public:
  ListenerMark() = default;
  // A TCP listener bound to `ip` (IPv4 or IPv6, as bound: "0.0.0.0" for every address) and
  // `port` (UCX's, ZeroMQ's: their fds are not ours). An unparsable `ip` marks nothing.
  static ListenerMark tcp(const std::string& ip, uint16_t port);
  // The listening socket `fd`, by the address it is bound to (read now).
  static ListenerMark socket(int fd);
  ListenerMark(ListenerMark&& o) noexcept : id_(o.id_) { o.id_ = 0; }
  ListenerMark& operator=(ListenerMark&& o) noexcept;
  ListenerMark(const ListenerMark&) = delete;
  ListenerMark& operator=(const ListenerMark&) = delete;
  ~ListenerMark();

 private:
  explicit ListenerMark(uint64_t id) noexcept : id_(id) {}
  uint64_t id_ = 0;
};

// In a forked child: each listening socket among its fds bound to a marked address is
// replaced by /dev/null at the same fd number (dup2). The socket goes, so the parent alone
// holds it; the number stays taken, so that a copy of its owner that closes it later (a
// Python object collected in the worker) closes nothing the child opened since. Returns
// how many were released.
int release_inherited_listeners() noexcept;

}  // namespace tensorwire::os
