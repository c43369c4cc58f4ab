// SocketTransport. Frames on the socket (one UnixSocket message each):
//   [u8 kind][u64 request id, little-endian][body]
//   kind 0, client -> owner: a request, body = one wire-codec message
//   kind 1, owner -> client: its response, body = one wire-codec message
//   kind 2, owner -> client: its failure, body = JSON {"type", "message", "closed"}
#include "tensorwire/inference/socket_transport.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "os/fork.h"
#include "os/process.h"
#include "os/unix_socket.h"
#include "shm_region.h"
#include "stacking.h"
#include "tensorwire/core/json.h"
#include "wire_message.h"

namespace tensorwire::inference {

namespace {

enum Kind : uint8_t { kRequest = 0, kResponse = 1, kFailure = 2 };
constexpr size_t kPrefix = 9;

std::string frame(Kind kind, uint64_t id) {
  std::string s(kPrefix, '\0');
  s[0] = static_cast<char>(kind);
  for (int i = 0; i < 8; ++i) s[1 + i] = static_cast<char>((id >> (8 * i)) & 0xff);
  return s;
}

bool parse_frame(const std::string& m, Kind& kind, uint64_t& id) {
  if (m.size() < kPrefix) return false;
  kind = static_cast<Kind>(static_cast<uint8_t>(m[0]));
  id = 0;
  for (int i = 0; i < 8; ++i)
    id |= static_cast<uint64_t>(static_cast<uint8_t>(m[1 + i])) << (8 * i);
  return true;
}

std::span<const std::byte> body_of(const std::string& m) {
  return std::as_bytes(std::span<const char>(m.data() + kPrefix, m.size() - kPrefix));
}

std::string failure_frame(uint64_t id, const std::string& type, const std::string& message,
                          bool closed) {
  std::string s = frame(kFailure, id);
  s += Json{{"type", type}, {"message", message}, {"closed", closed}}.dump();
  return s;
}

// --- owner side ----------------------------------------------------------------------

struct Conn {
  os::UnixSocket socket;
  std::optional<os::ProcessWatch> watch;
  wire::Decoder decoder;                               // watcher thread only
  wire::Encoder encoder{wire::Mode::NonConsolidated};  // under send_mu
  std::mutex send_mu;
  std::atomic<bool> dead{false};

  void send(const std::string& bytes) noexcept {
    if (dead.load(std::memory_order_acquire)) return;
    std::lock_guard<std::mutex> lock(send_mu);
    try {
      socket.send(bytes);
    } catch (const Error&) {
      dead = true;
    }
  }
  void kill() noexcept {
    dead = true;
    ::shutdown(socket.fd(), SHUT_RDWR);  // unblocks a sender; the fd stays valid
  }
};

struct Item {
  std::shared_ptr<Conn> conn;
  uint64_t id = 0;
  TensorDict td;
  int64_t submitted_ns = 0;
};

}  // namespace

struct SocketTransport::Owner {
  std::string name;
  uint64_t generation = os::fork_generation();
  os::UnixListener listener;
  os::Fd stop;
  std::thread io;

  std::mutex mu;
  std::condition_variable work;
  std::deque<Item> queue;
  bool serving = false, stopped = false;
  std::string stop_reason = "the inference server was shut down";
  uint64_t wakeups = 0;
  std::vector<Item> inflight;  // serving thread only

  explicit Owner(std::string n) : name(std::move(n)), listener(name) {
    int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (fd < 0) throw SystemError("eventfd", errno);
    stop = os::Fd(fd);
    io = std::thread([this] { run(); });
  }

  ~Owner() {
    if (generation != os::fork_generation()) {
      new std::thread(std::move(io));  // a forked copy: the thread is the parent's
      return;
    }
    uint64_t one = 1;
    [[maybe_unused]] ssize_t n = ::write(stop.get(), &one, sizeof one);
    io.join();
  }

  void handle(const std::shared_ptr<Conn>& c, const std::string& m) {
    Kind kind;
    uint64_t id;
    if (!parse_frame(m, kind, id) || kind != kRequest) {
      c->kill();
      return;
    }
    Item item;
    try {
      item.td = detail::decode_owned(c->decoder, body_of(m));
    } catch (const Error& e) {
      c->send(failure_frame(id, "RuntimeError", std::string("bad request: ") + e.what(), false));
      return;
    }
    item.conn = c;
    item.id = id;
    item.submitted_ns = detail::now_ns();
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!stopped) {
        queue.push_back(std::move(item));
        work.notify_one();
        return;
      }
    }
    c->send(failure_frame(id, "RuntimeError", stop_reason, true));
  }

  void run() noexcept {
    std::vector<std::shared_ptr<Conn>> conns;
    std::vector<pollfd> fds;
    while (true) {
      fds.clear();
      fds.push_back({stop.get(), POLLIN, 0});
      fds.push_back({listener.fd(), POLLIN, 0});
      for (const auto& c : conns) {
        fds.push_back({c->socket.fd(), POLLIN, 0});
        fds.push_back({c->watch ? c->watch->fd() : -1, POLLIN, 0});
      }
      if (::poll(fds.data(), fds.size(), -1) < 0) {
        if (errno == EINTR) continue;
        return;
      }
      if (fds[0].revents) break;
      for (size_t i = conns.size(); i-- > 0;) {
        const auto& c = conns[i];
        bool gone = fds[3 + 2 * i].revents != 0;
        if (fds[2 + 2 * i].revents) {
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
        try {
          if (auto s = listener.accept(os::Millis{0})) {
            auto c = std::make_shared<Conn>();
            c->socket = std::move(*s);
            c->watch.emplace(c->socket.peer_pid());
            conns.push_back(std::move(c));
          }
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

  std::mutex send_mu;
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
  void read_one(os::Millis slice) {
    std::optional<os::Message> m;
    std::string gone;
    try {
      m = socket.recv(slice);
      if (!m && owner && !owner->alive())
        gone = "the inference server process (pid " + std::to_string(owner_pid) + ") exited";
    } catch (const Error&) {
      gone = owner && !owner->alive()
                 ? "the inference server process (pid " + std::to_string(owner_pid) + ") exited"
                 : "the inference server closed the connection";
    }
    Kind kind;
    uint64_t id = 0;
    Outcome out;
    bool have = false;
    if (m && parse_frame(m->bytes, kind, id)) {
      have = true;
      try {
        if (kind == kResponse) {
          out.td = detail::decode_owned(decoder, body_of(m->bytes));
        } else if (kind == kFailure) {
          wire::Limits limits;
          Json j = wire::parse_untrusted_json(body_of(m->bytes), limits, "failure");
          std::string type = j.value("type", std::string("RuntimeError"));
          std::string message = j.value("message", std::string());
          if (j.value("closed", false))
            out.error = std::make_exception_ptr(ClosedError(message));
          else
            out.error = std::make_exception_ptr(RemoteError(type, message));
        } else {
          throw ProtocolError("unexpected frame kind " + std::to_string(kind));
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

std::shared_ptr<SockConn> connect_socket(const std::string& name) {
  auto c = std::make_shared<SockConn>();
  c->socket = os::UnixSocket::connect(name, os::Millis{3000});
  c->owner_pid = c->socket.peer_pid();
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
    if (taken_ || c_->generation != os::fork_generation()) return;
    std::lock_guard<std::mutex> lock(c_->mu);
    if (!c_->arrived.erase(id_) && c_->closed.empty()) c_->dropped.insert(id_);
  }
  bool ready() override {
    std::lock_guard<std::mutex> lock(c_->mu);
    return c_->arrived.count(id_) || !c_->closed.empty();
  }
  bool wait(Clock::time_point deadline) override {
    if (c_->generation != os::fork_generation())
      throw Error("a Future cannot be used in a process forked after it was made");
    std::unique_lock<std::mutex> lock(c_->mu);
    while (true) {
      if (c_->arrived.count(id_) || !c_->closed.empty()) return true;
      const auto now = Clock::now();
      if (now >= deadline) return false;
      const auto slice = std::min<Clock::duration>(deadline - now, std::chrono::milliseconds(100));
      if (!c_->reading) {
        c_->reading = true;
        lock.unlock();
        c_->read_one(std::chrono::duration_cast<os::Millis>(slice) + os::Millis{1});
        lock.lock();
        c_->reading = false;
        c_->cv.notify_all();
      } else {
        c_->cv.wait_for(lock, slice);
      }
    }
  }
  TensorDict take() override {
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
  std::shared_ptr<SockConn> c_;
  uint64_t id_;
  bool taken_ = false;
};

class SocketClient final : public detail::ClientImpl {
 public:
  explicit SocketClient(std::string name) : name_(std::move(name)) {}
  std::unique_ptr<detail::Pending> submit(const TensorDict& td, Clock::time_point) override {
    std::shared_ptr<SockConn> c = connection();
    uint64_t id;
    {
      std::lock_guard<std::mutex> lock(c->send_mu);
      id = c->next_id++;
      std::string bytes = frame(kRequest, id);
      detail::append_encoded(c->encoder.encode(td), bytes);
      try {
        c->socket.send(bytes);
      } catch (const ClosedError&) {
        throw ClosedError("the inference server closed the connection");
      }
    }
    return std::make_unique<SocketPending>(std::move(c), id);
  }
  const char* kind() const noexcept override { return "socket"; }
  std::string address() const override { return name_; }

 private:
  std::shared_ptr<SockConn> connection() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!conn_ || conn_->generation != os::fork_generation()) conn_ = connect_socket(name_);
    return conn_;
  }
  std::string name_;
  std::mutex mu_;
  std::shared_ptr<SockConn> conn_;
};

}  // namespace

std::shared_ptr<SocketTransport> SocketTransport::create(SocketOptions options) {
  std::shared_ptr<SocketTransport> t(new SocketTransport());
  t->o_ = std::make_unique<Owner>(options.name.empty() ? os::unique_name("infer-socket")
                                                       : options.name);
  return t;
}

Client SocketTransport::client_for(const std::string& name) {
  return Client(std::make_shared<SocketClient>(name));
}

SocketTransport::~SocketTransport() {
  if (o_->generation == os::fork_generation())
    close_server("the socket transport was closed", true);
}

const std::string& SocketTransport::name() const noexcept {
  return o_->name;
}
Client SocketTransport::client() {
  return client_for(o_->name);
}

void SocketTransport::open_server() {
  if (o_->generation != os::fork_generation())
    throw Error("a SocketTransport can only be served by the process that created it");
  std::lock_guard<std::mutex> lock(o_->mu);
  if (o_->serving) throw Error("another InferenceServer already serves this transport");
  o_->serving = true;
  o_->stopped = false;
}

void SocketTransport::close_server(const std::string& reason, bool fail_pending) {
  std::deque<Item> pending;
  {
    std::lock_guard<std::mutex> lock(o_->mu);
    o_->stopped = true;
    o_->stop_reason = reason;
    if (fail_pending) {
      o_->serving = false;
      pending.swap(o_->queue);
    }
  }
  for (Item& it : pending) it.conn->send(failure_frame(it.id, "RuntimeError", reason, true));
}

void SocketTransport::wait_for_work(Clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(o_->mu);
  const uint64_t seen = o_->wakeups;
  auto ready = [&] { return !o_->queue.empty() || o_->wakeups != seen; };
  if (deadline == Clock::time_point::max())
    o_->work.wait(lock, ready);
  else
    o_->work.wait_until(lock, deadline, ready);
}

void SocketTransport::interrupt() {
  {
    std::lock_guard<std::mutex> lock(o_->mu);
    ++o_->wakeups;
  }
  o_->work.notify_all();
}

void SocketTransport::drain(size_t max_items, Drained& out) {
  if (out.empty()) o_->inflight.clear();
  std::lock_guard<std::mutex> lock(o_->mu);
  while (max_items > 0 && !o_->queue.empty()) {
    Item it = std::move(o_->queue.front());
    o_->queue.pop_front();
    if (it.conn->dead) continue;  // its client is gone: nobody to answer
    out.ids.push_back(o_->inflight.size());
    out.submitted_ns.push_back(it.submitted_ns);
    o_->inflight.push_back(std::move(it));
    --max_items;
  }
}

void SocketTransport::collate(const Drained& d, std::vector<Group>& groups) {
  std::vector<const TensorDict*> requests;
  requests.reserve(d.size());
  for (uint64_t id : d.ids) requests.push_back(&o_->inflight[id].td);
  detail::group_and_stack(requests, groups);
}

void SocketTransport::resolve(const Drained& d, const Group& g, const TensorDict& output,
                              const VersionStamp& stamp) {
  std::vector<TensorDict> rows = detail::split_output(output, g.rows.size(), stamp);
  for (size_t j = 0; j < rows.size(); ++j) {
    Item& it = o_->inflight[d.ids[g.rows[j]]];
    if (it.conn->dead) continue;
    std::string bytes = frame(kResponse, it.id);
    {
      std::lock_guard<std::mutex> lock(it.conn->send_mu);
      detail::append_encoded(it.conn->encoder.encode(rows[j]), bytes);
    }
    it.conn->send(bytes);
  }
}

void SocketTransport::reject(const Drained& d, std::span<const size_t> rows,
                             const RemoteError& error) {
  for (size_t row : rows) {
    Item& it = o_->inflight[d.ids[row]];
    it.conn->send(failure_frame(it.id, error.type_name(), error.message(), false));
  }
}

}  // namespace tensorwire::inference
