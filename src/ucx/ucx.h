// Thin RAII adapters over libucp (UCX): a process-wide context, a worker per connection,
// a listener, and an endpoint with tag-matched messages. Private to the library: the pipe
// system (src/pipe) is written against these, and they know nothing about TensorDicts,
// only "a frame and some payload buffers".
//
// Threading model: every object here is used under its owner's mutex (the pipe's or the
// listener's); UCX workers are created UCS_THREAD_MODE_SERIALIZED: several threads use one,
// never two at once. Waits release that mutex and sleep on the worker's wake-up fd.
//
// Fork: every object remembers the process generation (os/fork.h) it was made in. In a
// forked child the inherited ones are the parent's UCX state (its shared memory, its
// sockets, its async thread that does not exist here): their destructors leave them alone
// (a deliberate leak), and Context::get() gives the child a context of its own.
//
// Quiet by default: unless the user set UCX_LOG_LEVEL, UCX's own messages (warnings about
// a peer that vanished, "bind: Address already in use") are dropped, since every failure
// reaches the caller as an exception; unless the user set UCX_ERROR_SIGNALS, UCX's crash
// handlers are taken off the host program's signals.
#pragma once

#include <sys/types.h>
#include <ucp/api/ucp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "os/listeners.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::ucx {

using Clock = std::chrono::steady_clock;

// Messages up to this size are sent eagerly: UCX copies them and the send completes
// without waiting for the peer to receive (the pipe's frames with their inline payload fit,
// so a send followed by a receive works on both sides), unless sent with Done::Matched.
// Larger ones use rendezvous (zero copy; the send completes when the peer has received).
// UCX_RNDV_THRESH overrides it.
inline constexpr size_t kEagerMax = 80 * 1024;

// Throws the right tensorwire error for a UCX status ("what: Input/output error").
[[noreturn]] void throw_status(const std::string& what, ucs_status_t status);

// The process-wide UCP context (tag matching + wake-up). UCX reads UCX_* environment
// variables (UCX_TLS=sm,tcp or tcp selects transports) when it is first created.
// Whether UCX_TLS lets UCX use shared memory transports.
bool shared_memory_enabled();

// Whether `ip` (an IPv4 or IPv6 address in text) is a loopback address or one of this
// host's interface addresses.
bool is_local_address(const std::string& ip);

class Context {
 public:
  // This process's context (a new one in a forked child).
  static std::shared_ptr<Context> get();
  ucp_context_h handle() const noexcept { return ctx_; }
  ~Context();

 private:
  Context();
  ucp_context_h ctx_ = nullptr;
  uint64_t generation_;
};

// True when an object made in process generation `generation` now lives in a forked child.
bool inherited(uint64_t generation) noexcept;
// The ClosedError for `what` ("this listener on port 80"), made by process `owner` and used
// in its forked child, where its UCX state belongs to the parent.
ClosedError inherited_error(const std::string& what, pid_t owner);

class Worker {
 public:
  Worker();
  ~Worker();
  Worker(const Worker&) = delete;
  Worker& operator=(const Worker&) = delete;

  ucp_worker_h handle() const noexcept { return worker_; }
  int efd() const noexcept { return efd_; }
  unsigned progress() {
    unsigned n = ucp_worker_progress(worker_);
    if (n) events_.fetch_add(1, std::memory_order_relaxed);
    return n;
  }
  // How many progress calls found something to do so far: a waiter that sees it change
  // knows another thread may have taken the event it was sleeping for.
  uint64_t events() const noexcept { return events_.load(std::memory_order_relaxed); }
  // Arms the wake-up fd: true when it is safe to sleep on efd(), false when events are
  // already pending (progress again instead).
  bool arm();
  // Makes efd() readable (from any thread): wakes whoever sleeps on it, e.g. after another
  // thread's progress took the event it was waiting for.
  void signal();
  // Progress, then sleep on efd() for at most `timeout` if nothing happened.
  void wait(std::chrono::milliseconds timeout);
  // wait() in two halves, for a worker other threads use between them (under its owner's
  // mutex): whether to sleep (nothing progressed and the fd is armed), under that mutex;
  // then the sleep on efd(), without it.
  bool ready_to_sleep();
  void sleep(std::chrono::milliseconds timeout) const noexcept;
  // The full tag of the oldest message that arrived with no receive posted for it, if any
  // (it stays queued). O(1): UCX keeps such messages in arrival order.
  std::optional<uint64_t> oldest_unexpected_tag();
  // This worker's address (every transport it can be reached by), for a peer's
  // Endpoint(worker, address).
  std::vector<std::byte> address() const;
  // Keeps `buffer` until the worker is destroyed: a receive given up in flight (its peer
  // stopped in the middle of a message) is released to UCX, which may still write into it
  // if the peer goes on. Called by the thread that holds the worker.
  void keep_until_destroyed(std::shared_ptr<void> buffer) { kept_.push_back(std::move(buffer)); }

 private:
  std::shared_ptr<Context> context_;
  uint64_t generation_;
  ucp_worker_h worker_ = nullptr;
  int efd_ = -1;
  std::atomic<uint64_t> events_{0};
  std::vector<std::shared_ptr<void>> kept_;  // destroyed after the worker (declared last)
};

// An outstanding send or receive. Poll with done(); completed requests are freed.
class Request {
 public:
  Request() = default;
  explicit Request(ucs_status_ptr_t p, bool is_recv);
  Request(Request&& o) noexcept;
  Request& operator=(Request&& o) noexcept;
  ~Request();

  // Throws on a failed operation.
  bool done();
  void cancel(ucp_worker_h worker) noexcept;

 private:
  void* req_ = nullptr;
  uint64_t generation_ = 0;
  bool is_recv_ = false;
  bool done_ = true;
};

// A peer's socket address, numeric, as this host sees it.
struct PeerAddress {
  std::string host = "?";
  uint16_t port = 0;
  std::string str() const { return host + ":" + std::to_string(port); }
};

struct ConnRequest {
  ucp_conn_request_h handle = nullptr;
  PeerAddress address;  // the client's
};

class Listener {
 public:
  // Binds host:port (an IPv4 address or name; 0.0.0.0 = every interface; port 0 = any
  // free port) on its own worker. A connection that sent nothing UCX could read for
  // `silent_for` (junk the guard dropped, ucx/sockcm_guard.h; a peer that never spoke) is
  // shut down by a later poll(), so such peers cannot pile up this process's fds.
  explicit Listener(uint16_t port, const std::string& host = "0.0.0.0",
                    std::chrono::milliseconds silent_for = std::chrono::seconds(10));
  ~Listener();
  uint16_t port() const noexcept { return port_; }
  Worker& worker() noexcept { return worker_; }
  // Pops a pending connection request, progressing the worker; std::nullopt when none.
  // Now and then (every few seconds at most), shuts silent connections down first, and
  // says so: into `warnings` when given (a caller under a lock logs them once it let go of
  // it: a log record may wait for Python's GIL), else in the log.
  std::optional<ConnRequest> poll(std::vector<std::string>* warnings = nullptr);
  // Whether a connection request is already queued (poll() would return it at once).
  bool has_pending() const noexcept { return !pending_.empty(); }
  // Refuses a request poll() returned that no endpoint was made from (request.handle
  // still set): its client's connect fails at once (UCS_ERR_REJECTED), rather than at its
  // timeout. A no-op for one an endpoint consumed.
  void reject(ConnRequest& request) noexcept;

 private:
  static void on_conn(ucp_conn_request_h req, void* arg);
  // Puts the socket filter of ucx/sockcm_guard.h on the listening socket.
  void guard();
  // Before the listener goes: refuses every connection accepted but not yet answered, so
  // that none can reach the freed listener (see ucx.cpp). Its owner has stopped making
  // endpoints from its requests by then: one made but whose answer has not left yet counts
  // as unanswered and is shut down too.
  void refuse_unanswered() noexcept;
  // Refuses the requests on_conn queued that nobody took with poll().
  void reject_pending() noexcept;
  Worker worker_;
  uint64_t generation_;
  ucp_listener_h listener_ = nullptr;
  uint16_t port_ = 0;
  std::string ip_;  // the address bound, numeric ("0.0.0.0": every one)
  std::chrono::milliseconds silent_for_;
  Deadline next_look_;     // of poll() for silent connections
  os::ListenerMark mark_;  // released by runner workers forked meanwhile (os/listeners.h)
  std::deque<ConnRequest> pending_;
};

class Endpoint {
 public:
  // Client side: connects to host:port (name resolution included).
  Endpoint(Worker& worker, const std::string& host, uint16_t port);
  // Server side: accepts a request from a Listener (on any worker).
  Endpoint(Worker& worker, ConnRequest& request);
  // To a worker address received from a peer (Worker::address()); `peer` names it in errors.
  Endpoint(Worker& worker, std::span<const std::byte> address, const Endpoint& same_peer);
  ~Endpoint();
  Endpoint(const Endpoint&) = delete;
  Endpoint& operator=(const Endpoint&) = delete;

  // Non-OK once UCX reported an error on this endpoint (peer gone, connection reset).
  ucs_status_t error() const noexcept { return error_; }
  // For a client's endpoint (host, port) whose wire-up failed: the error to raise, when UCX
  // reported one (else returns). `host` as the user gave it; `listener` names what should
  // listen there, for ConnectionRefused's hint.
  void throw_if_unreached(const std::string& what, const std::string& host, uint16_t port,
                          const std::string& listener) const;
  const std::string& peer() const noexcept { return peer_; }
  const PeerAddress& peer_address() const noexcept { return peer_address_; }
  // The transports of the endpoint's tag lanes ("sysv/memory cma/memory"), read from
  // ucp_ep_print_info (UCX 1.13 has no query for them).
  std::string transports() const;

  // When a send's request completes: once its bytes are out of the caller's buffer
  // (Local), or once the receiver has matched it with a receive (Matched: UCX's synchronous
  // send, an acknowledgement from the peer). Matched is what bounds how much a sender can
  // leave in a slow receiver's unexpected queue (pipe_impl.cpp, post_send).
  enum class Done { Local, Matched };
  Request send(uint64_t tag, std::span<const std::span<const std::byte>> pieces,
               std::vector<ucp_dt_iov_t>& iov_storage, Done done = Done::Local);
  Request send(uint64_t tag, std::span<const std::byte> bytes, Done done = Done::Local);
  // Pops the next message with this tag, if one has arrived: its length and handle.
  std::optional<std::pair<size_t, ucp_tag_message_h>> probe(uint64_t tag);
  // Pops the next message whose tag matches `tag` on the bits of `mask`.
  struct Probed {
    size_t length;
    ucp_tag_message_h message;
    uint64_t tag;  // the sender's full tag
  };
  std::optional<Probed> probe(uint64_t tag, uint64_t mask);
  // Whether a message with this tag (on the bits of `mask`) has arrived (it stays queued).
  bool has_message(uint64_t tag, uint64_t mask = ~uint64_t{0});
  // Receives; the received length is stored in *length (which must outlive the request)
  // on completion, however it completes.
  Request recv(ucp_tag_message_h msg, std::span<std::byte> into, size_t* length);
  Request recv(uint64_t tag, std::span<std::byte> into, size_t* length);
  // Receives a message scattered over `pieces` in order (straight into their memory).
  Request recv(ucp_tag_message_h msg, std::span<const std::span<std::byte>> pieces,
               std::vector<ucp_dt_iov_t>& iov_storage, size_t* length);
  // Posts a receive of the next message with exactly this tag, scattered over `pieces`.
  Request recv(uint64_t tag, std::span<const std::span<std::byte>> pieces,
               std::vector<ucp_dt_iov_t>& iov_storage, size_t* length);

  // Receives and drops every message still waiting on the worker (after close), so UCX
  // does not warn about unmatched descriptors when the worker is destroyed.
  void discard_unexpected();

  // Starts a flush of everything sent so far (wire-up included); poll the request.
  Request flush();

  // Closes: flushes gracefully unless `force` or the endpoint failed; bounded in time.
  // `drain_failed`: first let requests of a failed endpoint fail (UCX 1.13 aborts otherwise);
  // not needed when nothing can be pending on it.
  void close(bool force, std::chrono::milliseconds timeout, bool drain_failed = true);

 private:
  static void on_error(void* arg, ucp_ep_h ep, ucs_status_t status);
  Worker& worker_;
  uint64_t generation_;
  ucp_ep_h ep_ = nullptr;
  ucs_status_t error_ = UCS_OK;
  PeerAddress peer_address_;
  std::string peer_;  // peer_address_.str()
};

}  // namespace tensorwire::ucx
