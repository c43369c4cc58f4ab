#include "zmq/zmq.h"

#include <unistd.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <optional>

#include "os/fork.h"
#include "os/port.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::zmqio {

namespace {

[[noreturn]] void fail(const std::string& what, const zmq::error_t& e) {
  throw SystemError("zmq " + what + " (" + e.what() + ")", e.num());
}

// What an endpoint ZeroMQ refused may be missing: its transport ("127.0.0.1:5555").
std::string endpoint_hint(const std::string& endpoint) {
  if (endpoint.find("://") != std::string::npos) return "";
  return ": an endpoint names its transport, as in 'tcp://host:port' or 'ipc://name'";
}

// libzmq takes a TCP port modulo 65536 (99999 binds 34463) and connects to port 0 for
// ever: a typo in a port must be an error, not another port.
void check_tcp_port(const std::string& endpoint, bool binding) {
  const std::optional<TcpEndpoint> tcp = split_tcp(endpoint);
  if (!tcp) return;
  const std::string& port = tcp->port;
  if (binding && port == "*") return;
  const std::optional<uint16_t> value = os::parse_port(port);
  if (!value || (!binding && *value == 0))
    throw ValueError(std::string(binding ? "zmq bind to " : "zmq connect to ") + endpoint +
                     ": the port must be " + (binding ? "0 to 65535 or *" : "1 to 65535") +
                     ", got '" + port + "'");
}

// libzmq resolves a host when it connects, and retries one that does not resolve for ever,
// silently: a sender would block with no word of why. A name that does not resolve now is
// logged as a warning naming it, and left to libzmq's retries: it may be a typo, or a name
// that appears later (a cluster's service record made once its pod is up).
void warn_unresolved_tcp_host(const std::string& endpoint) {
  const std::optional<TcpEndpoint> tcp = split_tcp(endpoint);
  if (!tcp) return;
  const std::string& host = tcp->host;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  const int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
  if (rc == 0) {
    ::freeaddrinfo(res);
    return;
  }
  log_message(LogLevel::Warning, "zmq connect to " + endpoint + ": cannot resolve host '" + host +
                                     "' (" + gai_strerror(rc) +
                                     "); ZeroMQ keeps trying, and sends wait for it meanwhile");
}

}  // namespace

Context::Context() : generation_(os::fork_generation()) {
  try {
    ctx_ = std::make_unique<zmq::context_t>(1);
    // Blocking calls on our sockets never hang on a dead peer: every wait has a timeout
    // and a liveness check above this layer; linger 0 makes close() immediate too.
    ctx_->set(zmq::ctxopt::blocky, 0);
  } catch (const zmq::error_t& e) {
    fail("context", e);
  }
}

Context::~Context() {
  // Inherited across fork(): the I/O thread is not here. Leak the handle.
  if (os::fork_generation() != generation_) (void)ctx_.release();
}

Socket::Socket(Context& ctx, zmq::socket_type type, const SocketOptions& o)
    : generation_(os::fork_generation()) {
  try {
    sock_ = std::make_unique<zmq::socket_t>(ctx.get(), type);
    sock_->set(zmq::sockopt::linger, o.linger_ms);
    if (o.sndhwm >= 0) sock_->set(zmq::sockopt::sndhwm, o.sndhwm);
    if (o.rcvhwm >= 0) sock_->set(zmq::sockopt::rcvhwm, o.rcvhwm);
    sock_->set(zmq::sockopt::reconnect_ivl, o.reconnect_ivl_ms);
    if (o.max_frame_bytes >= 0) sock_->set(zmq::sockopt::maxmsgsize, o.max_frame_bytes);
  } catch (const zmq::error_t& e) {
    fail("socket", e);
  }
}

Socket::~Socket() {
  if (os::fork_generation() != generation_) (void)sock_.release();
}

void Socket::bind(const std::string& endpoint) {
  check_tcp_port(endpoint, true);
  try {
    // A local (ipc) endpoint admits only this user: the runners bind abstract ipc names,
    // which carry no file permissions. libzmq checks each connection's SO_PEERCRED and
    // closes one of another uid before it reads a byte from it.
    if (endpoint.rfind("ipc://", 0) == 0) {
      const int uid = static_cast<int>(::geteuid());
      if (zmq_setsockopt(sock_->handle(), ZMQ_IPC_FILTER_UID, &uid, sizeof uid) != 0)
        throw SystemError("zmq bind to " + endpoint + ": cannot restrict it to this user",
                          zmq_errno());
    }
    sock_->bind(endpoint);
  } catch (const zmq::error_t& e) {
    fail("bind to " + endpoint + endpoint_hint(endpoint), e);
  }
}

void Socket::connect(const std::string& endpoint) {
  check_tcp_port(endpoint, false);
  warn_unresolved_tcp_host(endpoint);
  try {
    sock_->connect(endpoint);
  } catch (const zmq::error_t& e) {
    fail("connect to " + endpoint + endpoint_hint(endpoint), e);
  }
}

std::string Socket::last_endpoint() const {
  return sock_->get(zmq::sockopt::last_endpoint);
}

bool Socket::send(std::span<zmq::message_t> frames, Millis timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (size_t i = 0; i < frames.size(); ++i) {
    const bool more = i + 1 < frames.size();
    while (true) {
      try {
        auto flags =
            zmq::send_flags::dontwait | (more ? zmq::send_flags::sndmore : zmq::send_flags::none);
        if (sock_->send(frames[i], flags)) break;
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) fail("send", e);
        continue;
      }
      // Only the first frame can meet the high-water mark: the rest of a message is
      // always accepted once its first frame is.
      Millis left = timeout;
      if (timeout.count() >= 0) {
        left = std::chrono::duration_cast<Millis>(deadline - std::chrono::steady_clock::now());
        if (left.count() <= 0) return false;
      }
      zmq_pollitem_t item{sock_->handle(), 0, ZMQ_POLLOUT, 0};
      try {
        zmq::poll(&item, 1, left);
      } catch (const zmq::error_t& e) {
        if (e.num() != EINTR) fail("poll", e);
      }
    }
  }
  return true;
}

bool Socket::try_recv_frame(zmq::message_t& frame, bool& more) {
  while (true) {
    try {
      if (!sock_->recv(frame, zmq::recv_flags::dontwait)) return false;
      more = frame.more();
      return true;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) fail("recv", e);
    }
  }
}

bool Socket::try_recv(std::vector<zmq::message_t>& frames) {
  frames.clear();
  zmq::message_t first;
  bool more = false;
  if (!try_recv_frame(first, more)) return false;
  frames.push_back(std::move(first));
  // The rest of a multipart message is delivered atomically with its first frame.
  while (more) {
    zmq::message_t part;
    try {
      if (!sock_->recv(part, zmq::recv_flags::none)) break;
    } catch (const zmq::error_t& e) {
      if (e.num() == EINTR) continue;
      fail("recv", e);
    }
    more = part.more();
    frames.push_back(std::move(part));
  }
  return true;
}

int poll(std::span<PollItem> items, Millis timeout) {
  std::vector<zmq_pollitem_t> raw(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    raw[i] = zmq_pollitem_t{items[i].socket ? items[i].socket->handle() : nullptr,
                            items[i].socket ? 0 : items[i].fd, ZMQ_POLLIN, 0};
    items[i].ready = false;
  }
  int n = zmq_poll(raw.data(), static_cast<int>(raw.size()), static_cast<long>(timeout.count()));
  if (n < 0) {
    if (zmq_errno() == EINTR) return 0;
    throw SystemError("zmq poll", zmq_errno());
  }
  for (size_t i = 0; i < items.size(); ++i)
    items[i].ready = (raw[i].revents & (ZMQ_POLLIN | ZMQ_POLLERR)) != 0;
  return n;
}

zmq::message_t frame(std::span<const std::byte> bytes) {
  return zmq::message_t(bytes.data(), bytes.size());
}

Monitor::Monitor(Context& ctx, Socket& socket)
    : watched_(&socket), generation_(os::fork_generation()) {
  static std::atomic<uint64_t> next_id{0};
  const std::string endpoint = "inproc://tensorwire-monitor-" + std::to_string(::getpid()) + "-" +
                               std::to_string(next_id.fetch_add(1));
  if (zmq_socket_monitor(socket.handle(), endpoint.c_str(),
                         ZMQ_EVENT_ACCEPTED | ZMQ_EVENT_CONNECTED | ZMQ_EVENT_DISCONNECTED) != 0)
    throw SystemError("zmq_socket_monitor", zmq_errno());
  pair_ = std::make_unique<Socket>(ctx, zmq::socket_type::pair);
  pair_->connect(endpoint);
}

Monitor::~Monitor() {
  // Stop the monitor before its PAIR closes (a fork child leaks both, see Socket).
  if (pair_ && os::fork_generation() == generation_)
    (void)zmq_socket_monitor(watched_->handle(), nullptr, 0);
}

bool Monitor::try_next(Event& event) {
  while (true) {
    std::vector<zmq::message_t> frames;
    if (!pair_->try_recv(frames)) return false;
    // libzmq's event: [uint16 event, uint32 value][endpoint]; the value of these events is
    // the connection's fd.
    if (frames.empty() || frames[0].size() < 6) continue;
    uint16_t kind = 0;
    uint32_t value = 0;
    std::memcpy(&kind, frames[0].data(), sizeof kind);
    std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, sizeof value);
    if (kind == ZMQ_EVENT_ACCEPTED || kind == ZMQ_EVENT_CONNECTED)
      event = {true, static_cast<int>(value)};
    else if (kind == ZMQ_EVENT_DISCONNECTED)
      event = {false, static_cast<int>(value)};
    else
      continue;
    return true;
  }
}

int source_fd(zmq::message_t& frame) {
  // ZMQ_SRCFD is deprecated in favour of the "Peer-Address" property, which names the host
  // only: two producers on one host would be one.
  return zmq_msg_get(frame.handle(), ZMQ_SRCFD);
}

std::string peer_host(zmq::message_t& frame) {
  const char* host = zmq_msg_gets(frame.handle(), "Peer-Address");
  return host == nullptr ? "" : "tcp://" + std::string(host);
}

std::string peer_address(int fd) {
  sockaddr_storage sa{};
  socklen_t len = sizeof sa;
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "";
  char host[INET6_ADDRSTRLEN] = {};
  if (sa.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&sa);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof host);
    return "tcp://" + std::string(host) + ":" + std::to_string(ntohs(in->sin_port));
  }
  if (sa.ss_family == AF_INET6) {
    const auto* in6 = reinterpret_cast<const sockaddr_in6*>(&sa);
    ::inet_ntop(AF_INET6, &in6->sin6_addr, host, sizeof host);
    return "tcp://[" + std::string(host) + "]:" + std::to_string(ntohs(in6->sin6_port));
  }
  return "ipc peer";
}

std::optional<TcpEndpoint> split_tcp(const std::string& endpoint) {
  if (endpoint.rfind("tcp://", 0) != 0) return std::nullopt;
  const size_t colon = endpoint.rfind(':');
  TcpEndpoint out;
  out.host = colon > 5 ? endpoint.substr(6, colon - 6) : endpoint.substr(6);
  out.port = colon > 5 ? endpoint.substr(colon + 1) : "";
  if (const size_t semi = out.host.find(';'); semi != std::string::npos)
    out.host = out.host.substr(semi + 1);
  if (out.host.size() >= 2 && out.host.front() == '[' && out.host.back() == ']')
    out.host = out.host.substr(1, out.host.size() - 2);
  return out;
}

}  // namespace tensorwire::zmqio
