// SocketTransport. Frames on the socket, one UnixSocket message each (request, response,
// failure, welcome), are built and read back by src/wire/socket_frame.h.
// The owner checks a new client's uid (SO_PEERCRED) before anything else: a client it does
// not admit gets a kind 2 frame with id 0, type "PermissionError" and closed true, in place
// of the welcome, and the connection is closed. A client waits for the welcome before it
// sends, and checks the owner's uid too (its own user or root).
// A frame is at most kMaxMessageBytes (64 MiB, the Unix-socket layer's limit): a larger
// request is refused at submit, a larger response fails its request, both with a
// ValueError naming the limit.
#include "tensorwire/inference/socket_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "attach.h"
#include "client_impl.h"
#include "os/fork.h"
#include "os/peer.h"
#include "os/process.h"
#include "os/unix_socket.h"
#include "request_queue.h"
#include "runtime/timed_lock.h"
#include "runtime/wait.h"
#include "shm_region.h"
#include "tensorwire/core/json.h"
#include "wire/message_bytes.h"
#include "wire/socket_frame.h"

namespace tensorwire::inference {

namespace {

using Kind = wire::SocketFrameKind;
// The largest message os::UnixSocket carries (src/os/unix_socket.cpp).
constexpr size_t kMaxMessageBytes = size_t{64} << 20;

// ValueError when a frame of `bytes` cannot travel.
void check_size(const std::string& bytes, const char* what) {
  if (bytes.size() <= kMaxMessageBytes) return;
  throw ValueError(std::string(what) + " of " + std::to_string(bytes.size()) +
                   " bytes (encoded) is over the socket transport's message limit of 64 MiB; "
                   "use a SharedMemoryTransport for large fixed-layout requests, or send "
                   "smaller ones");
}

// --- owner side ----------------------------------------------------------------------

// What the owner keeps queued for one client that does not read (stopped, or submitting
// without ever reading) before it drops that client.
constexpr size_t kMaxQueuedBytes = size_t{1} << 30;

// Wakes a thread blocked in poll(): one eventfd, written to, drained by the poller.
void kick(int fd) noexcept {
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(fd, &one, sizeof one);
}

struct Conn {
  os::UnixSocket socket;
  std::optional<os::ProcessWatch> watch;
  int wake_fd = -1;                                    // the I/O thread's eventfd
  wire::Decoder decoder;                               // I/O thread only
  wire::Encoder encoder{wire::Mode::NonConsolidated};  // under send_mu
  std::mutex send_mu;
  std::atomic<bool> backlog{false};  // bytes queued: the I/O thread writes them when it can
  std::atomic<bool> dead{false};

  // Never blocks (the serving thread answers every client): what the client's socket does
  // not take now is queued and written by the I/O thread once the client reads again.
  void send(const std::string& bytes) noexcept {
    if (dead.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(send_mu);
    try {
      socket.post(bytes);
      after_write();
    } catch (const Error&) {
      dead = true;
    }
  }
  // I/O thread, when the socket is writable.
  void flush() noexcept {
    std::lock_guard<std::mutex> lock(send_mu);
    try {
      socket.flush(Deadline::after(Timeout::poll()));
      after_write();
    } catch (const Error&) {
      dead = true;
    }
  }
  // Under send_mu.
  void after_write() {
    const size_t queued = socket.queued_bytes();
    if (queued > kMaxQueuedBytes) {
      dead = true;  // it reads nothing: its answers would only pile up
      kick(wake_fd);
      return;
    }
    if ((queued > 0) != backlog.exchange(queued > 0)) kick(wake_fd);
  }
  void kill() noexcept {
    dead = true;
    ::shutdown(socket.fd(), SHUT_RDWR);  // unblocks a sender; the fd stays valid
  }
};

// A decoded request and the connection its answer goes back on.
class SocketRequest final : public detail::QueuedRequest {
 public:
  SocketRequest(std::shared_ptr<Conn> conn, uint64_t id) : conn_(std::move(conn)), id_(id) {}
  bool gone() const noexcept override { return conn_->dead.load(std::memory_order_acquire); }
  void answer(TensorDict response) override {
    if (gone()) return;
    std::string bytes = wire::socket_frame(Kind::Response, id_);
    {
      std::lock_guard<std::mutex> lock(conn_->send_mu);
      wire::append_encoded(conn_->encoder.encode(response), bytes);
    }
    try {
      check_size(bytes, "the response");
    } catch (const ValueError& e) {
      return conn_->send(wire::socket_failure_frame(id_, {"ValueError", e.what(), false}));
    }
    conn_->send(bytes);
  }
  void fail(const RemoteError& error) override {
    conn_->send(wire::socket_failure_frame(id_, {error.type_name(), error.message(), false}));
  }
  void fail_closed(const std::string& reason) override {
    conn_->send(wire::socket_failure_frame(id_, {"RuntimeError", reason, true}));
  }

 private:
  std::shared_ptr<Conn> conn_;
  uint64_t id_;
};

}  // namespace

struct SocketTransport::Owner {
  std::string name;
  uint64_t generation = os::fork_generation();
  os::UnixListener listener;
  os::Fd stop;
  os::Fd wake;  // a connection's queued answers changed: poll for POLLOUT or stop
  std::thread io;

  detail::RequestQueue queue;

  os::PeerPolicy peers;
  std::atomic<uint64_t> refused{0};
  std::mutex refusal_mu;
  std::string last_refusal;

  Owner(std::string n, os::PeerPolicy policy)
      : name(std::move(n)), listener(name), peers(std::move(policy)) {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw SystemError("eventfd", errno);
    stop = os::Fd(fd);
    fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw SystemError("eventfd", errno);
    wake = os::Fd(fd);
    io = std::thread([this] { run(); });
  }

  ~Owner() {
    if (generation != os::fork_generation()) {
      new std::thread(std::move(io));  // a forked copy: the thread is the parent's
      return;
    }
    kick(stop.get());
    io.join();
  }

  void handle(const std::shared_ptr<Conn>& c, const std::string& m) {
    const std::optional<wire::SocketFrame> f = wire::parse_socket_frame(m);
    if (!f || f->kind != Kind::Request) {
      c->kill();
      return;
    }
    const uint64_t id = f->id;
    auto r = std::make_shared<SocketRequest>(c, id);
    try {
      r->td = wire::decode_owned(c->decoder, f->body);
    } catch (const Error& e) {
      c->send(wire::socket_failure_frame(
          id, {"RuntimeError", std::string("bad request: ") + e.what(), false}));
      return;
    }
    r->submitted_ns = detail::now_ns();
    if (auto why = queue.push(r)) r->fail_closed(*why);
  }

  // Tells a client it is not admitted, and closes the connection (it is not kept: its
  // requests are never read).
  // `type`: PermissionError (a user not admitted, a PermissionError there too) or OSError
  // (the server cannot admit anyone now: a ClosedError naming why).
  void refuse(os::UnixSocket& s, const std::string& why,
              const std::string& type = "PermissionError") {
    refused.fetch_add(1, std::memory_order_relaxed);
    {
      std::lock_guard<std::mutex> lock(refusal_mu);
      last_refusal = why;
    }
    try {
      s.post(wire::socket_failure_frame(0, {type, why, true}));
    } catch (const Error&) {
    }
  }

  void run() noexcept {
    std::vector<std::shared_ptr<Conn>> conns;
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({stop.get(), POLLIN, 0});
      fds.push_back({listener.poll_fd(), POLLIN, 0});
      fds.push_back({wake.get(), POLLIN, 0});
      for (const auto& c : conns) {
        const short out = c->backlog.load(std::memory_order_acquire) ? POLLOUT : 0;
        fds.push_back({c->socket.fd(), static_cast<short>(POLLIN | out), 0});
        fds.push_back({c->watch ? c->watch->fd() : -1, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), listener.poll_timeout_ms()) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents) break;
      if (fds[2].revents) {
        uint64_t n;
        [[maybe_unused]] ssize_t r = ::read(wake.get(), &n, sizeof n);
      }
      for (size_t i = conns.size(); i-- > 0;) {
        const auto& c = conns[i];
        bool gone = fds[4 + 2 * i].revents != 0;
        if (fds[3 + 2 * i].revents & POLLOUT) c->flush();
        if (fds[3 + 2 * i].revents & ~POLLOUT) {
          try {
            while (auto m = c->socket.recv(os::Millis{0})) handle(c, m->bytes);
          } catch (const Error&) {
            gone = true;
          }
        }
        if (gone || c->dead) {
          c->kill();
          conns.erase(conns.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      if (fds[1].revents) {
        std::optional<os::UnixSocket> s;
        try {
          s = listener.accept(os::Millis{0});
          if (s) {
            // Who it is, before anything is read from or written to it.
            const os::PeerCredentials who = os::peer_credentials(s->fd());
            if (std::string why = peers.refusal(who, name); !why.empty()) {
              refuse(*s, why);
              continue;
            }
            auto c = std::make_shared<Conn>();
            c->watch.emplace(s->peer_pid());  // a descriptor: the step that may lack one
            s->post(wire::socket_frame(Kind::Welcome, 0));
            c->socket = std::move(*s);
            c->wake_fd = wake.get();
            conns.push_back(std::move(c));
          }
        } catch (const SystemError& e) {
          auto why = os::descriptor_refusal(e, "socket transport '" + name + "'", listener, !!s);
          if (why && s) refuse(*s, *why, "OSError");
        } catch (const Error&) {
        }
      }
    }
    for (const auto& c : conns) c->kill();
  }
};

// --- client side ---------------------------------------------------------------------

namespace {

struct Outcome {
  std::optional<TensorDict> td;
  std::exception_ptr error;
};

struct SockConn {
  os::UnixSocket socket;
  std::optional<os::ProcessWatch> owner;
  int owner_pid = 0;
  uint64_t generation = 0;

  runtime::TimedLock send_mu;  // taken in slices: a waiting thread can give up
  wire::Encoder encoder{wire::Mode::NonConsolidated};
  uint64_t next_id = 1;

  std::mutex mu;
  std::condition_variable cv;
  bool reading = false;
  std::string closed;  // non-empty: the connection is gone
  std::unordered_map<uint64_t, Outcome> arrived;
  std::unordered_set<uint64_t> dropped;
  wire::Decoder decoder;  // whoever holds `reading`

  // Reads at most one message (waiting up to `slice`) and files it. Called with
  // reading = true and mu unlocked.
  void read_one(Deadline slice) {
    std::optional<os::Message> m;
    std::string gone;
    try {
      m = socket.recv(os::Millis{slice.poll_ms()});
      if (!m && owner && !owner->alive())
        gone = "the inference server process (pid " + std::to_string(owner_pid) + ") exited";
    } catch (const Error&) {
      gone = owner && !owner->alive()
                 ? "the inference server process (pid " + std::to_string(owner_pid) + ") exited"
                 : "the inference server closed the connection";
    }
    uint64_t id = 0;
    Outcome out;
    bool have = false;
    const std::optional<wire::SocketFrame> f =
        m ? wire::parse_socket_frame(m->bytes) : std::nullopt;
    if (f) {
      have = true;
      id = f->id;
      try {
        if (f->kind == Kind::Response) {
          out.td = wire::decode_owned(decoder, f->body);
        } else if (f->kind == Kind::Failure) {
          const wire::SocketFailure failure = wire::parse_socket_failure(f->body, "failure");
          if (failure.closed)
            out.error = std::make_exception_ptr(ClosedError(failure.message));
          else
            out.error = std::make_exception_ptr(RemoteError(failure.type, failure.message));
        } else {
          throw ProtocolError("unexpected frame kind " +
                              std::to_string(static_cast<unsigned>(f->kind)));
        }
      } catch (const Error&) {
        out.error = std::current_exception();
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    if (!gone.empty() && closed.empty()) closed = gone;
    if (have && !dropped.erase(id)) arrived[id] = std::move(out);
  }
};

// Connects within kConnectTimeout, or sooner where the call that needs the connection
// must give up sooner (a timeout means the same for the connect as for the request).
std::shared_ptr<SockConn> connect_socket(const std::string& name, Deadline limit) {
  auto c = std::make_shared<SockConn>();
  const Deadline own = Deadline::after(detail::kConnectTimeout);
  const Deadline deadline = own.min(limit);
  const std::string bound = limit.when() < own.when() ? "the call's timeout" : "3 s";
  c->socket = os::UnixSocket::connect(name, deadline);
  const os::PeerCredentials owner = os::peer_credentials(c->socket.fd());
  os::check_server(owner, name);
  // The owner's first frame: the welcome, or why this process is refused.
  std::optional<os::Message> m = c->socket.recv(deadline);
  if (!m)
    throw TimeoutError("the inference server at '" + name + "' sent no welcome within " + bound);
  const std::optional<wire::SocketFrame> f = wire::parse_socket_frame(m->bytes);
  if (!f || (f->kind != Kind::Welcome && f->kind != Kind::Failure))
    throw ProtocolError("the inference server at '" + name + "' did not start with a welcome");
  if (f->kind == Kind::Failure) {
    const wire::SocketFailure refusal = wire::parse_socket_failure(f->body, "refusal");
    if (refusal.type == "PermissionError") throw SystemError(refusal.message, EACCES);
    throw ClosedError("the inference server at '" + name +
                      "' refused the connection: " + refusal.message);
  }
  c->owner_pid = owner.pid;
  try {
    c->owner.emplace(c->owner_pid);
  } catch (const SystemError&) {
    throw ClosedError("the inference server process (pid " + std::to_string(c->owner_pid) +
                      ") exited");
  }
  c->generation = os::fork_generation();
  return c;
}

class SocketPending final : public detail::Pending {
 public:
  SocketPending(std::shared_ptr<SockConn> c, uint64_t id) : c_(std::move(c)), id_(id) {}
  ~SocketPending() override {
    if (taken_ || stale()) return;
    std::lock_guard<std::mutex> lock(c_->mu);
    if (!c_->arrived.erase(id_) && c_->closed.empty()) c_->dropped.insert(id_);
  }
  // A forked child's copy is done at once, and take() says why, without the connection's
  // mutex: a thread of the parent (a reader filing a response) may have held it at the fork.
  bool ready() override {
    if (stale()) return true;
    std::lock_guard<std::mutex> lock(c_->mu);
    return c_->arrived.count(id_) || !c_->closed.empty();
  }
  // One thread at a time reads the connection and files what arrives for whoever waits
  // for it; the others wait for the reader's notification.
  bool wait(Deadline slice) override {
    if (stale()) return true;
    std::unique_lock<std::mutex> lock(c_->mu);
    auto ready = [&] { return c_->arrived.count(id_) || !c_->closed.empty(); };
    if (ready()) return true;
    if (!c_->reading) {
      c_->reading = true;
      lock.unlock();
      try {
        c_->read_one(slice);
      } catch (...) {
        lock.lock();
        c_->reading = false;
        c_->cv.notify_all();
        throw;
      }
      lock.lock();
      c_->reading = false;
      c_->cv.notify_all();
    } else {
      c_->cv.wait_until(lock, slice.when());
    }
    return ready();
  }
  TensorDict take() override {
    if (stale()) throw detail::made_before_fork("it belongs to the parent process");
    std::unique_lock<std::mutex> lock(c_->mu);
    taken_ = true;
    auto it = c_->arrived.find(id_);
    if (it == c_->arrived.end()) throw ClosedError(c_->closed);
    Outcome out = std::move(it->second);
    c_->arrived.erase(it);
    lock.unlock();
    if (out.error) std::rethrow_exception(out.error);
    return std::move(*out.td);
  }

 private:
  bool stale() const noexcept { return c_->generation != os::fork_generation(); }
  std::shared_ptr<SockConn> c_;
  uint64_t id_;
  bool taken_ = false;
};

class SocketClient final : public detail::ClientImpl {
 public:
  explicit SocketClient(std::string name) : name_(std::move(name)) {}
  // Waits while the server's socket is full (a stopped or overloaded server), at most
  // until `deadline` and interruptibly; so does a second thread waiting for its turn.
  std::unique_ptr<detail::Pending> submit(const TensorDict& td, Deadline deadline) override {
    std::shared_ptr<SockConn> c = connection(deadline);
    std::unique_lock<runtime::TimedLock> lock(c->send_mu, std::defer_lock);
    if (!runtime::wait_until(deadline,
                             [&](Deadline slice) { return lock.try_lock_until(slice.when()); }))
      throw TimeoutError(not_taken("another thread's request is still being sent", false));
    std::string bytes = wire::socket_frame(Kind::Request, 0);
    wire::append_encoded(c->encoder.encode(td), bytes);
    check_size(bytes, "the request");
    const uint64_t id = c->next_id++;
    bytes.replace(0, wire::kSocketFramePrefix, wire::socket_frame(Kind::Request, id));
    // A request given up half-written stays queued (the stream is never cut): it reaches
    // the server with the next one, and its answer is discarded.
    auto given_up = [&] {
      if (c->socket.queued_bytes() == 0) return false;
      std::lock_guard<std::mutex> l(c->mu);
      c->dropped.insert(id);
      return true;
    };
    bool sent = false;
    try {
      // The rest of an earlier request given up half-written goes first; until it has,
      // this one is not started (then it was not sent, and it is not taken for a dropped one).
      if (!c->socket.flush(deadline))
        throw TimeoutError(
            not_taken("the rest of an earlier request is still being written", false));
    } catch (const ClosedError&) {
      throw ClosedError("the inference server closed the connection");
    }
    try {
      sent = c->socket.send(bytes, {}, deadline);
    } catch (const ClosedError&) {
      throw ClosedError("the inference server closed the connection");
    } catch (...) {
      given_up();  // interrupted
      throw;
    }
    if (!sent) throw TimeoutError(not_taken("its socket is full", given_up()));
    return std::make_unique<SocketPending>(std::move(c), id);
  }
  const char* kind() const noexcept override { return "socket"; }
  std::string address() const override { return name_; }
  void close() noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
    conn_.reset();  // pending requests keep the connection until they are read
  }

 private:
  std::shared_ptr<SockConn> connection(Deadline limit = Deadline::never()) {
    auto current = [&]() -> std::shared_ptr<SockConn> {
      if (closed_) throw ClosedError("the inference client was closed");
      return conn_ && conn_->generation == os::fork_generation() ? conn_ : nullptr;
    };
    return detail::connect_once(
        mu_, current, [&] { return connect_socket(name_, limit); },
        [&](std::shared_ptr<SockConn> c) {
          conn_ = std::move(c);
          return conn_;
        });
  }
  std::string not_taken(const char* why, bool partly) const {
    return "the inference server at '" + name_ + "' did not take the request in time (" + why +
           ": is the server process stopped or overloaded?); " +
           (partly ? "part of it was written: the rest goes first with the next request, and "
                     "its answer is discarded"
                   : "it was not sent");
  }
  std::string name_;
  std::mutex mu_;
  std::shared_ptr<SockConn> conn_;
  bool closed_ = false;
};

}  // namespace

std::shared_ptr<SocketTransport> SocketTransport::create(SocketOptions options) {
  // The owner first: when its name is taken, no transport exists whose destructor would
  // find no owner.
  auto owner =
      std::make_unique<Owner>(options.name.empty() ? os::unique_name("infer-socket") : options.name,
                              os::PeerPolicy(options.allowed_uids));
  std::shared_ptr<SocketTransport> t(new SocketTransport());
  t->o_ = std::move(owner);
  return t;
}

Client SocketTransport::client_for(const std::string& name) {
  return Client(std::make_shared<SocketClient>(name));
}

SocketTransport::~SocketTransport() {
  if (o_->generation != os::fork_generation()) {  // the parent's server, not ours
    os::leak(std::move(o_));
    return;
  }
  close_server("the socket transport was closed", true);
}

const std::string& SocketTransport::name() const noexcept {
  return o_->name;
}
uint64_t SocketTransport::refused() const noexcept {
  return o_->refused.load(std::memory_order_relaxed);
}
std::string SocketTransport::last_refusal() const {
  if (o_->generation != os::fork_generation()) return "";  // the parent's, under its lock
  std::lock_guard<std::mutex> lock(o_->refusal_mu);
  return o_->last_refusal;
}
Client SocketTransport::client() {
  check_open();
  return client_for(o_->name);
}

void SocketTransport::open_server() {
  if (o_->generation != os::fork_generation())
    throw ClosedError(
        "this SocketTransport was made before a fork: only the process that "
        "created it can serve it");
  o_->queue.open_server();
}
void SocketTransport::release_server() noexcept {
  if (o_->generation == os::fork_generation()) o_->queue.release_server();
}
void SocketTransport::close_server(const std::string& reason, bool fail_pending) {
  if (o_->generation != os::fork_generation()) return;  // a forked copy: the queue is the parent's
  o_->queue.close_server(reason, fail_pending);
}
void SocketTransport::wait_for_work(Deadline deadline) {
  o_->queue.wait_for_work(deadline);
}
void SocketTransport::interrupt() {
  o_->queue.interrupt();
}
bool SocketTransport::has_work() {
  return o_->queue.has_work();
}
bool SocketTransport::notify_work(std::function<void()> on_work) {
  o_->queue.notify_work(std::move(on_work));
  return true;
}
void SocketTransport::drain(size_t max_items, Drained& out) {
  o_->queue.drain(max_items, out);
}
void SocketTransport::collate(const Drained& d, std::vector<Group>& groups) {
  o_->queue.collate(d, groups);
}
void SocketTransport::resolve(const Drained& d, const Group& g, const TensorDict& output,
                              const VersionStamp& stamp) {
  o_->queue.resolve(d, g, output, stamp);
}
void SocketTransport::reject(const Drained& d, std::span<const size_t> rows,
                             const RemoteError& error) {
  o_->queue.reject(d, rows, error);
}

}  // namespace tensorwire::inference
