// Unix stream sockets in the abstract namespace (no file is ever created, so none can be
// left behind), carrying small messages and file descriptors (SCM_RIGHTS).
//
// Messages are length-prefixed (u32 little-endian) so a reader always gets whole
// messages. A peer that closes (or dies: the kernel closes its end) makes a call throw
// ClosedError. Sockets are non-blocking: every wait is a poll, and a wait that can last
// (a full peer buffer, a peer that sends nothing, a listener that does not accept) takes a
// Deadline and runs through runtime::wait_until, so Ctrl-C (check_interrupt) and the
// deadline end it, even while the peer is stopped (SIGSTOP) and never reads.
//
// Thread-safety: one thread may send while another receives; two concurrent senders (or
// receivers) on one socket need external synchronisation.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "os/listeners.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/timeout.h"

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

  // Connects to an abstract address ("@" is not needed: `name` is the whole name), trying
  // again while nothing listens yet or the listener's backlog is full (a client may be made
  // before its server), interruptibly, until `deadline`: then ConnectionRefused when nothing
  // listened, or SystemError (EAGAIN) for a listener that accepts nobody (a stopped one).
  static UnixSocket connect(const std::string& name, Deadline deadline);
  // A connected pair (for a parent and the child it is about to fork).
  static std::pair<UnixSocket, UnixSocket> pair();

  // Sends one message, waiting while the peer's buffer is full, interruptibly, until
  // `deadline`. True when the whole message was written. False when the deadline passed
  // first (an interrupt throws, with the same state): if none of it was written, it is not
  // sent at all; if part was, the rest is kept and written first by the next send() or
  // flush(), so the stream is never cut inside a message (queued_bytes() says so).
  bool send(const std::string& bytes, const std::vector<int>& fds = {},
            Deadline deadline = Deadline::never());
  // Never blocks: queues `bytes` as one message behind what is already queued and writes
  // what the peer's buffer takes now (a server answering a client that may be stopped; it
  // calls flush() when fd() is writable and drops a client whose queue grows too long).
  void post(const std::string& bytes);
  // Writes queued bytes until none are left (true) or `deadline` passes (false).
  bool flush(Deadline deadline = Deadline::never());
  size_t queued_bytes() const noexcept { return out_.size() - out_sent_; }

  // One message, waiting interruptibly until `deadline`: std::nullopt on timeout.
  std::optional<Message> recv(Deadline deadline);
  // One step of a wait that the caller loops itself (polling: Millis{0}); not interruptible
  // by itself, so callers keep `timeout` to one slice.
  std::optional<Message> recv(Millis timeout);

  int fd() const noexcept { return fd_.get(); }
  bool valid() const noexcept { return static_cast<bool>(fd_); }
  void close() noexcept { fd_.reset(); }
  // Credentials of the peer (SO_PEERCRED): its pid.
  int peer_pid() const;

 private:
  // Writes from the queue without blocking; true when it is empty.
  bool write_queued();

  Fd fd_;
  std::string inbuf_;
  std::vector<Fd> infds_;
  std::string out_;      // queued bytes (whole messages, the first maybe partly written)
  size_t out_sent_ = 0;  // bytes of out_ already written
};

class UnixListener {
 public:
  // Listens on an abstract address; AddressInUse-style failures throw SystemError.
  explicit UnixListener(const std::string& name);
  // std::nullopt on timeout. When the process has no descriptor left (EMFILE, ENFILE), the
  // waiting connection is taken with a descriptor the listener keeps in reserve, and
  // returned: the caller's next step that needs a descriptor fails (out_of_descriptors())
  // and it can tell the client why before it closes the connection. Left waiting, the
  // connection kept the listener readable and a poll loop around it spun a core. With no
  // reserve left either: SystemError, and accepting pauses for kShortagePause.
  std::optional<UnixSocket> accept(Millis timeout = kForever);
  int fd() const noexcept { return fd_.get(); }
  // For a poll loop that serves other sockets beside the listener: the fd to poll (-1 while
  // accepting is paused: the connection left waiting keeps the fd readable, and a loop
  // polling it would spin) and the longest wait in ms (-1: none) so the pause ends on time.
  int poll_fd() const noexcept;
  int poll_timeout_ms() const noexcept;
  // Whether a shortage of descriptors is news: the first since a connection was accepted
  // with a descriptor of its own (a server logs a paused listener once, not at each look).
  bool shortage_is_news() noexcept { return !std::exchange(shortage_reported_, true); }
  static constexpr Millis kShortagePause{100};
  const std::string& name() const noexcept { return name_; }
  void close() noexcept {
    mark_ = {};
    fd_.reset();
    reserve_.reset();
  }

 private:
  Fd fd_;
  Fd reserve_;  // /dev/null, spent on a connection that came when no descriptor was left
  std::chrono::steady_clock::time_point paused_until_{};
  bool shortage_reported_ = false;
  std::string name_;
  ListenerMark mark_;  // released by runner workers forked meanwhile (listeners.h)
};

// A server's look at an error admitting a connection on `listener` (`server` names it): when
// the process (or the system) has no file descriptor left, it logs that (once while the
// listener is paused without a socket to refuse) and returns what to tell the client,
// naming the limit. std::nullopt for any other error.
std::optional<std::string> descriptor_refusal(const SystemError& e, const std::string& server,
                                              UnixListener& listener, bool have_socket);

// A name unique to this process and call, for abstract addresses: "tensorwire-<pid>-<n>-<tag>".
std::string unique_name(const std::string& tag);

}  // namespace tensorwire::os
