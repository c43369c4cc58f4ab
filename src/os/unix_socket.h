// Unix stream sockets in the abstract namespace (no file is ever created, so none can be
// left behind), carrying small messages and file descriptors (SCM_RIGHTS).
//
// Messages are length-prefixed (u32 little-endian) so a reader always gets whole
// messages. Every blocking call takes a timeout and a peer that closes (or dies: the
// kernel closes its end) makes it throw ClosedError, never hang.
//
// Thread-safety: one thread may send while another receives; two concurrent senders (or
// receivers) on one socket need external synchronisation.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace tensorwire::os {

using Millis = std::chrono::milliseconds;
inline constexpr Millis kForever{-1};

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) noexcept : fd_(fd) {}
  Fd(Fd&& o) noexcept : fd_(o.release()) {}
  Fd& operator=(Fd&& o) noexcept;
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd();
  int get() const noexcept { return fd_; }
  int release() noexcept {
    int f = fd_;
    fd_ = -1;
    return f;
  }
  explicit operator bool() const noexcept { return fd_ >= 0; }
  void reset() noexcept;

 private:
  int fd_ = -1;
};

struct Message {
  std::string bytes;
  std::vector<Fd> fds;
};

class UnixSocket {
 public:
  UnixSocket() = default;
  explicit UnixSocket(Fd fd) : fd_(std::move(fd)) {}

  // Connects to an abstract address ("@" is not needed: `name` is the whole name).
  static UnixSocket connect(const std::string& name, Millis timeout = Millis{5000});
  // A connected pair (for a parent and the child it is about to fork).
  static std::pair<UnixSocket, UnixSocket> pair();

  void send(const std::string& bytes, const std::vector<int>& fds = {});
  // Waits up to `timeout`: std::nullopt on timeout, ClosedError on EOF.
  std::optional<Message> recv(Millis timeout = kForever);

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return static_cast<bool>(fd_); }
  void close() noexcept { fd_.reset(); }
  // Credentials of the peer (SO_PEERCRED): its pid.
  int peer_pid() const;

 private:
  Fd fd_;
  std::string inbuf_;
  std::vector<Fd> infds_;
};

class UnixListener {
 public:
  // Listens on an abstract address; AddressInUse-style failures throw SystemError.
  explicit UnixListener(const std::string& name);
  // std::nullopt on timeout.
  std::optional<UnixSocket> accept(Millis timeout = kForever);
  int fd() const noexcept { return fd_.get(); }
  const std::string& name() const noexcept { return name_; }
  void close() noexcept { fd_.reset(); }

 private:
  Fd fd_;
  std::string name_;
};

// A name unique to this process and call, for abstract addresses: "tensorwire-<pid>-<n>-<tag>".
std::string unique_name(const std::string& tag);

}  // namespace tensorwire::os
