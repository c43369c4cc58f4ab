// The ZeroMQ transport: a thin adapter over libzmq (through cppzmq). It moves frames and
// waits with timeouts; it knows nothing of TensorDicts or descriptors.
//
// Fork safety: a libzmq context owns threads, and threads do not survive fork(). A Context
// or Socket that finds itself destroyed in a process other than the one that created it
// (a forked child that inherited the memory; see os::fork_generation()) leaks its handle
// instead of closing it:
// closing would talk to I/O threads that do not exist in the child and hang. Create
// contexts after fork, one per process.
//
// Thread-safety: as libzmq: a socket is used by one thread at a time.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>
#include <zmq.hpp>

namespace tensorwire::zmqio {

using Millis = std::chrono::milliseconds;

class Context {
 public:
  Context();  // one I/O thread
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  zmq::context_t& get() noexcept { return *ctx_; }

 private:
  std::unique_ptr<zmq::context_t> ctx_;
  uint64_t generation_;
};

struct SocketOptions {
  int sndhwm = -1;  // -1: libzmq's default
  int rcvhwm = -1;
  int linger_ms = 0;  // pending messages are dropped on close: peers are gone or going
  int reconnect_ivl_ms = 10;
  // The largest frame a peer may send; one larger drops its connection before libzmq
  // allocates it. -1: no limit.
  int64_t max_frame_bytes = -1;
};

class Socket {
 public:
  Socket(Context& ctx, zmq::socket_type type, const SocketOptions& options = {});
  ~Socket();
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  // An ipc:// endpoint admits connections of this user only (ZMQ_IPC_FILTER_UID).
  void bind(const std::string& endpoint);
  // A tcp:// host that does not resolve is logged as a warning (libzmq retries it silently).
  void connect(const std::string& endpoint);
  // The endpoint actually bound (tcp://host:* resolves to a port).
  std::string last_endpoint() const;

  // Sends one message made of `frames` (moved from). Waits up to `timeout` (negative: no
  // limit) for room under the high-water mark; false when it ran out.
  bool send(std::span<zmq::message_t> frames, Millis timeout);
  bool send(zmq::message_t& frame, Millis timeout) { return send(std::span(&frame, 1), timeout); }

  // Receives one whole message (all its frames) without waiting; false when none is queued.
  bool try_recv(std::vector<zmq::message_t>& frames);
  // Receives the first frame only, without waiting; `more` tells whether frames follow.
  bool try_recv_frame(zmq::message_t& frame, bool& more);

  zmq::socket_ref ref() noexcept { return zmq::socket_ref(zmq::from_handle, sock_->handle()); }
  void* handle() noexcept { return sock_->handle(); }

 private:
  std::unique_ptr<zmq::socket_t> sock_;
  uint64_t generation_;
};

// Connection events of a socket (zmq_socket_monitor), read without waiting, so that a
// receiver can tell its peers apart (with source_fd()) and know which are connected.
class Monitor {
 public:
  struct Event {
    bool connected;  // true: a connection accepted or made; false: one closed or dropped
    int fd;          // the connection's fd, as source_fd() reports it for its messages
  };
  Monitor(Context& ctx, Socket& socket);
  ~Monitor();
  Monitor(const Monitor&) = delete;
  Monitor& operator=(const Monitor&) = delete;
  bool try_next(Event& event);

 private:
  Socket* watched_;
  uint64_t generation_;
  std::unique_ptr<Socket> pair_;
};

// A tcp:// endpoint's host (the destination's: after a "source;", without IPv6 brackets)
// and port text; none for another transport.
struct TcpEndpoint {
  std::string host, port;
};
std::optional<TcpEndpoint> split_tcp(const std::string& endpoint);

// The fd of the connection a received frame came in on (ZMQ_SRCFD); -1 when unknown.
int source_fd(zmq::message_t& frame);
// "tcp://host:port" of the peer at the other end of a connected socket fd ("" when
// unknown; for ipc, the path of the socket is not the peer's: "ipc peer").
std::string peer_address(int fd);
// "tcp://host" of the peer a received frame came from (its "Peer-Address" property: no
// port), for a connection already closed when its messages are read; "" when unknown.
std::string peer_host(zmq::message_t& frame);

// One thing to wait on: a socket (readable = a message can be received) or a plain fd.
struct PollItem {
  Socket* socket = nullptr;
  int fd = -1;
  bool ready = false;  // out
};
// Waits until an item is ready or `timeout` passes (negative: no limit). Returns the
// number of ready items (0 on timeout). EINTR counts as a timeout.
int poll(std::span<PollItem> items, Millis timeout);

// A frame that copies `bytes`.
zmq::message_t frame(std::span<const std::byte> bytes);
// A frame that references `data` without copying; `keepalive` is destroyed (from libzmq's
// I/O thread, possibly) when libzmq no longer needs the bytes.
template <class KeepAlive>
zmq::message_t frame_zero_copy(const void* data, size_t size, KeepAlive keepalive) {
  auto* hint = new KeepAlive(std::move(keepalive));
  return zmq::message_t(
      const_cast<void*>(data), size, [](void*, void* h) { delete static_cast<KeepAlive*>(h); },
      hint);
}

}  // namespace tensorwire::zmqio
