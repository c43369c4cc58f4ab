#include "os/unix_socket.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "tensorwire/core/error.h"

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

UnixSocket UnixSocket::connect(const std::string& name, Millis timeout) {
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  auto deadline = std::chrono::steady_clock::now() + timeout;
  while (true) {
    Fd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) throw SystemError("socket", errno);
    if (::connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) == 0)
      return UnixSocket(std::move(fd));
    int err = errno;
    // The listener may not be up yet (ECONNREFUSED) or its backlog is full (EAGAIN).
    if ((err != ECONNREFUSED && err != EAGAIN && err != ENOENT) ||
        std::chrono::steady_clock::now() >= deadline)
      throw SystemError("connect to '" + name + "'", err);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::pair<UnixSocket, UnixSocket> UnixSocket::pair() {
  int sv[2];
  if (::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
    throw SystemError("socketpair", errno);
  return {UnixSocket(Fd(sv[0])), UnixSocket(Fd(sv[1]))};
}

void UnixSocket::send(const std::string& bytes, const std::vector<int>& fds) {
  if (!fd_) throw ClosedError("send on a closed socket");
  if (bytes.size() > kMaxMessage) throw ValueError("unix socket message too large");
  if (fds.size() > kMaxFds) throw ValueError("too many fds in one message");
  uint32_t len = static_cast<uint32_t>(bytes.size());
  unsigned char hdr[4] = {static_cast<unsigned char>(len), static_cast<unsigned char>(len >> 8),
                          static_cast<unsigned char>(len >> 16),
                          static_cast<unsigned char>(len >> 24)};
  iovec iov[2] = {{hdr, 4}, {const_cast<char*>(bytes.data()), bytes.size()}};
  alignas(cmsghdr) char ctrl[CMSG_SPACE(sizeof(int) * kMaxFds)];
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  if (!fds.empty()) {
    msg.msg_control = ctrl;
    msg.msg_controllen = CMSG_SPACE(sizeof(int) * fds.size());
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  size_t total = 4 + bytes.size();
  size_t sent = 0;
  while (sent < total) {
    ssize_t n = ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) throw ClosedError("peer closed the socket");
      throw SystemError("sendmsg", errno);
    }
    sent += static_cast<size_t>(n);
    if (sent == total) break;
    // Partial write: fds went with the first chunk; send the rest plainly.
    msg.msg_control = nullptr;
    msg.msg_controllen = 0;
    size_t skip = static_cast<size_t>(n);
    for (auto& v : iov) {
      size_t d = std::min(skip, v.iov_len);
      v.iov_base = static_cast<char*>(v.iov_base) + d;
      v.iov_len -= d;
      skip -= d;
    }
  }
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
        throw ProtocolError("unix socket message of " + std::to_string(len) + " bytes");
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
    ssize_t n = ::recvmsg(fd_.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n < 0) {
      if (errno == EINTR || errno == EAGAIN) continue;
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
    if (n == 0) throw ClosedError("peer closed the socket");
    inbuf_.append(buf, static_cast<size_t>(n));
  }
}

int UnixSocket::peer_pid() const {
  ucred cred{};
  socklen_t len = sizeof cred;
  if (::getsockopt(fd_.get(), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0)
    throw SystemError("SO_PEERCRED", errno);
  return cred.pid;
}

UnixListener::UnixListener(const std::string& name) : name_(name) {
  socklen_t len;
  sockaddr_un addr = abstract_address(name, len);
  fd_ = Fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd_) throw SystemError("socket", errno);
  if (::bind(fd_.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0)
    throw SystemError("bind to abstract address '" + name + "'", errno);
  if (::listen(fd_.get(), 128) != 0) throw SystemError("listen", errno);
}

std::optional<UnixSocket> UnixListener::accept(Millis timeout) {
  if (!fd_) throw ClosedError("accept on a closed listener");
  if (!wait_fd(fd_.get(), POLLIN, timeout)) return std::nullopt;
  int c = ::accept4(fd_.get(), nullptr, nullptr, SOCK_CLOEXEC);
  if (c < 0) {
    if (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) return std::nullopt;
    throw SystemError("accept", errno);
  }
  return UnixSocket(Fd(c));
}

}  // namespace tensorwire::os
