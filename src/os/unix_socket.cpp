#include "os/unix_socket.h"

#include "os/peer.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "runtime/wait.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::os {

namespace {

constexpr size_t kMaxFds = 64;
constexpr uint32_t kMaxMessage = 64u << 20;

sockaddr_un abstract_address(const std::string& name, socklen_t& len) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (name.size() + 1 > sizeof(addr.sun_path))
    throw ValueError("abstract socket name too long: '" + name + "'");
  addr.sun_path[0] = '\0';  // abstract namespace: no file system entry
  std::memcpy(addr.sun_path + 1, name.data(), name.size());
  len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  return addr;
}

// Returns false on timeout.
bool wait_fd(int fd, short events, Millis timeout) {
  struct pollfd p {
    fd, events, 0
  };
  while (true) {
    int r = ::poll(&p, 1, static_cast<int>(timeout.count()));
    if (r > 0) return true;
    if (r == 0) return false;
    if (errno != EINTR) throw SystemError("poll", errno);
  }
}

}  // namespace

Fd& Fd::operator=(Fd&& o) noexcept {
  if (this != &o) {
    reset();
    fd_ = o.release();
  }
  return *this;
}

Fd::~Fd() {
  reset();
}

void Fd::reset() noexcept {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

std::string unique_name(const std::string& tag) {
  static std::atomic<uint64_t> counter{0};
  return "tensorwire-" + std::to_string(::getpid()) + "-" + std::to_string(counter++) + "-" + tag;
}

UnixSocket UnixSocket::connect(const std::string& name, Deadline deadline) {
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  UnixSocket out;
  int last = ECONNREFUSED;
  const bool connected = runtime::wait_until(deadline, [&](Deadline slice) {
    // Non-blocking: a blocking connect() waits, uninterruptibly, while the listener's
    // backlog is full (a stopped server); this one says EAGAIN and is tried again.
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd) throw SystemError("socket", errno);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0) {
      out = UnixSocket(std::move(fd));
      return true;
    }
    last = errno;
    // The listener may not be up yet (ECONNREFUSED) or its backlog is full (EAGAIN).
    if (last != ECONNREFUSED && last != EAGAIN && last != ENOENT && last != EINTR)
      throw SystemError("connect to '" + name + "'", last);
    std::this_thread::sleep_until(slice.min(Deadline::after(Millis{10})).when());
    return false;
  });
  if (!connected && (last == ECONNREFUSED || last == ENOENT))
    // A ClosedError in C++ (what a client's calls throw for a transport that is gone),
    // ConnectionRefusedError in Python, as the errno's OSError was.
    throw ConnectionRefused(
        "connect to '" + name + "' (nothing listened under that name until " +
        "the timeout: not created yet, closed, or a mistyped name): " + std::strerror(last));
  if (!connected) throw SystemError("connect to '" + name + "'", last);
  return out;
}

std::pair<UnixSocket, UnixSocket> UnixSocket::pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw SystemError("socketpair", errno);
  return {UnixSocket(Fd(sv[0])), UnixSocket(Fd(sv[1]))};
}

namespace {

void append_message(std::string& out, const std::string& bytes) {
  if (bytes.size() > kMaxMessage)
    throw ValueError("unix socket message of " + std::to_string(bytes.size()) +
                     " bytes is over the limit of " + std::to_string(kMaxMessage));
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  for (int i = 0; i < 4; ++i) out.push_back(static_cast<char>((len >> (8 * i)) & 0xff));
  out += bytes;
}

// A write that failed with `err`: returns when it is worth waiting and trying again (the
// peer's buffer is full), else throws.
void check_write_error(int err) {
  if (err == EAGAIN || err == EWOULDBLOCK || err == EINTR) return;
  if (err == EPIPE || err == ECONNRESET) throw ClosedError("peer closed the socket");
  throw SystemError("sendmsg", err);
}

}  // namespace

bool UnixSocket::write_queued() {
  while (out_sent_ < out_.size()) {
    ssize_t n = ::send(fd_.get(), out_.data() + out_sent_, out_.size() - out_sent_,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR) continue;
      check_write_error(errno);
      return false;
    }
    out_sent_ += static_cast<size_t>(n);
  }
  out_.clear();
  out_sent_ = 0;
  return true;
}

bool UnixSocket::flush(Deadline deadline) {
  if (!fd_) throw ClosedError("send on a closed socket");
  if (write_queued()) return true;  // also empties a queue written whole by the fds' write
  return runtime::wait_until(deadline, [&](Deadline slice) {
    if (write_queued()) return true;
    wait_fd(fd_.get(), POLLOUT, Millis{slice.poll_ms()});
    return write_queued();
  });
}

void UnixSocket::post(const std::string& bytes) {
  if (!fd_) throw ClosedError("send on a closed socket");
  append_message(out_, bytes);
  write_queued();
}

bool UnixSocket::send(const std::string& bytes, const std::vector<int>& fds, Deadline deadline) {
  if (!fd_) throw ClosedError("send on a closed socket");
  if (fds.size() > kMaxFds) throw ValueError("too many fds in one message");
  // What an earlier send left half-written goes first; until it has, this one waits.
  if (!flush(deadline)) return false;
  append_message(out_, bytes);  // the queue was empty: this message starts it
  // Nothing of this message written yet: it is dropped rather than kept, so a caller that
  // gives up (timeout, interrupt) has not sent it.
  auto drop_unstarted = [&] {
    if (out_sent_ == 0) out_.clear();
  };
  try {
    if (!fds.empty()) {
      // The first write carries the fds (SCM_RIGHTS); the rest is plain bytes.
      alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
      auto first = [&] {
        iovec iov{out_.data(), out_.size()};
        msghdr msg{};
        msg.msg_iov = &iov;
        msg.msg_iovlen = 1;
        msg.msg_control = ctrl;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
        std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
        ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
          check_write_error(errno);
          return false;
        }
        out_sent_ = static_cast<size_t>(n);
        return true;
      };
      const bool started = runtime::wait_until(deadline, [&](Deadline slice) {
        if (first()) return true;
        wait_fd(fd_.get(), POLLOUT, Millis{slice.poll_ms()});
        return first();
      });
      if (!started) {
        drop_unstarted();
        return false;
      }
    }
    if (flush(deadline)) return true;
  } catch (...) {
    drop_unstarted();
    throw;
  }
  drop_unstarted();
  return false;
}

std::optional<Message> UnixSocket::recv(Deadline deadline) {
  std::optional<Message> m;
  runtime::wait_until(deadline, [&](Deadline slice) {
    m = recv(Millis{slice.poll_ms()});
    return m.has_value();
  });
  return m;
}

std::optional<Message> UnixSocket::recv(Millis timeout) {
  if (!fd_) throw ClosedError("recv on a closed socket");
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    if (inbuf_.size() >= 4) {
      uint32_t len = static_cast<uint8_t>(inbuf_[0]) | static_cast<uint8_t>(inbuf_[1]) << 8 |
                     static_cast<uint8_t>(inbuf_[2]) << 16 |
                     static_cast<uint32_t>(static_cast<uint8_t>(inbuf_[3])) << 24;
      if (len > kMaxMessage)
        throw ProtocolError("unix socket message of " + std::to_string(len) +
                            " bytes is over the limit of " + std::to_string(kMaxMessage));
      if (inbuf_.size() >= 4 + len) {
        Message m;
        m.bytes = inbuf_.substr(4, len);
        inbuf_.erase(0, 4 + len);
        m.fds = std::move(infds_);
        infds_.clear();
        return m;
      }
    }
    Millis left = timeout.count() < 0
                      ? kForever
                      : std::max(Millis{0}, std::chrono::duration_cast<Millis>(
                                                deadline - std::chrono::steady_clock::now()));
    if (!wait_fd(fd_.get(), POLLIN, left)) return std::nullopt;
    char buf[65536];
    alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = ctrl;
    msg.msg_controllen = sizeof ctrl;
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK) {
        if (timeout.count() == 0) return std::nullopt;
        continue;
      }
      if (errno == ECONNRESET) throw ClosedError("peer closed the socket");
      throw SystemError("recvmsg", errno);
    }
    for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
      if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < k; ++i) {
          int f;
          std::memcpy(&f, CMSG_DATA(c) + i * sizeof(int), sizeof f);
          infds_.emplace_back(f);
        }
      }
    }
    if (msg.msg_flags & MSG_CTRUNC)  // the kernel could not install them all
      throw SystemError(
          "recvmsg: file descriptors sent with a message were dropped (this process has no "
          "descriptor left, or more than " +
              std::to_string(kMaxFds) + " were sent)",
          EMFILE);
    if (n == 0) throw ClosedError("peer closed the socket");
    inbuf_.append(buf, static_cast<size_t>(n));
  }
}

int UnixSocket::peer_pid() const {
  return peer_credentials(fd_.get()).pid;
}

std::optional<std::string> descriptor_refusal(const SystemError& e, const std::string& server,
                                              UnixListener& listener, bool have_socket) {
  if (e.code() != EMFILE && e.code() != ENFILE) return std::nullopt;
  std::string why = "the server's system has no file descriptor left (ENFILE)";
  if (e.code() == EMFILE) {
    rlimit limit{};
    ::getrlimit(RLIMIT_NOFILE, &limit);
    why =
        "the server process has no file descriptor left (EMFILE: its limit, RLIMIT_NOFILE, "
        "is " +
        std::to_string(limit.rlim_cur) + "; raise it with ulimit -n or resource.setrlimit)";
  }
  if (have_socket)
    log_message(LogLevel::Error, server + ": refused a client: " + why);
  else if (listener.shortage_is_news())
    log_message(LogLevel::Error, server + ": a client waits, and " + why);
  return why;
}

UnixListener::UnixListener(const std::string& name) : name_(name) {
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  fd_ = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd_) throw SystemError("socket", errno);
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    throw SystemError("bind to abstract address '" + name + "'", errno);
  if (::listen(fd_.get(), 128) != 0) throw SystemError("listen", errno);
  mark_ = ListenerMark::socket(fd_.get());
  reserve_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
}

std::optional<UnixSocket> UnixListener::accept(Millis timeout) {
  if (!fd_) throw ClosedError("accept on a closed listener");
  if (!wait_fd(fd_.get(), POLLIN, timeout)) return std::nullopt;
  if (!reserve_) reserve_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));  // spent before
  int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  const bool own = c >= 0;
  if (c < 0 && (errno == EMFILE || errno == ENFILE) && reserve_) {
    reserve_.reset();
    c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  }
  if (c < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return std::nullopt;
    const int err = errno;
    if (err == EMFILE || err == ENFILE)
      paused_until_ = std::chrono::steady_clock::now() + kShortagePause;
    throw SystemError("accept", err);
  }
  if (own) shortage_reported_ = false;
  return UnixSocket(Fd(c));
}

int UnixListener::poll_fd() const noexcept {
  return std::chrono::steady_clock::now() < paused_until_ ? -1 : fd_.get();
}

int UnixListener::poll_timeout_ms() const noexcept {
  const auto left = paused_until_ - std::chrono::steady_clock::now();
  if (left <= std::chrono::steady_clock::duration::zero()) return -1;
  return static_cast<int>(std::chrono::ceil<Millis>(left).count());
}

}  // namespace tensorwire::os
