#include "tensorwire/dataflow/remote.h"

#include <array>
#include <cstdio>
#include <cstring>

#include <unistd.h>

#include "dataflow/consumer_gate.h"
#include "dataflow/producers.h"
#include "dataflow/raw_datapoint.h"
#include "os/fork.h"
#include "os/listeners.h"
#include "runtime/wait.h"
#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/datapoint.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "zmq/zmq.h"

namespace tensorwire::dataflow {

namespace {

// Frames of one remote datapoint: [frame header][metadata][storage].
constexpr size_t kFrames = 3;

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

// hwm sizes only ZeroMQ's queue on a remote link, so 0 is ZeroMQ's "no limit", as tensorpack
// passes it on (the runners need >= 1: theirs sizes each worker's shared memory).
void check_hwm(int hwm, const char* what) {
  if (hwm < 0)
    throw ValueError(std::string(what) + ": hwm must be >= 0 (0: no limit), got " +
                     std::to_string(hwm));
}

}  // namespace

uint64_t send_dataflow_zmq(DataFlow& df, const std::string& addr, const SendOptions& o) {
  check_hwm(o.hwm, "send_dataflow_zmq");
  if (o.max_datapoints && *o.max_datapoints == 0)
    throw ValueError("send_dataflow_zmq: max_datapoints must be at least 1");
  zmqio::Context ctx;
  // Linger: what was queued for a connected receiver is delivered (for up to 5 s) when we
  // return.
  zmqio::Socket push(ctx, zmq::socket_type::push, {.sndhwm = o.hwm, .linger_ms = 5000});
  // Immediate: datapoints are queued only for a receiver that is connected, so with none a
  // send blocks (instead of filling a queue nobody reads and returning as if delivered).
  push.ref().set(zmq::sockopt::immediate, 1);
  if (o.bind)
    push.bind(addr);
  else
    push.connect(addr);
  df.reset_state();
  wire::Encoder encoder(wire::Mode::Consolidated);
  uint64_t sent = 0;
  while (true) {
    df.start();
    bool any = false;
    while (auto dp = df.next()) {
      any = true;
      // A fresh consolidated storage per datapoint, handed to ZeroMQ without a copy and
      // released when it is sent. Every message carries its schema: a PULL socket cannot
      // tell producers apart, so a receiver could not keep per-producer schemas.
      auto keep = std::make_shared<TensorDict>(consolidate(*dp));
      encoder.reset();
      const wire::OutMessage& m = encoder.encode(*keep);
      std::array<zmq::message_t, kFrames> frames;
      frames[0] = zmqio::frame(m.header_bytes);
      frames[1] = zmqio::frame(std::as_bytes(std::span(m.metadata)));
      if (m.payload.size() == 1)
        frames[2] = zmqio::frame_zero_copy(m.payload[0].data(), m.payload[0].size(), keep);
      else if (!m.payload.empty())
        throw Error("send_dataflow_zmq: a consolidated message of several pieces");
      // Blocks while no receiver is connected, or `hwm` datapoints wait for one.
      runtime::wait_until(Deadline::never(), [&](Deadline slice) {
        return push.send(frames, std::chrono::milliseconds(std::max(slice.poll_ms(), 0)));
      });
      ++sent;
      if (o.max_datapoints && sent >= *o.max_datapoints) return sent;
      if (o.progress && !o.progress(sent)) return sent;
    }
    if (!any) throw ValueError("send_dataflow_zmq: the dataflow yielded no datapoint in a pass");
  }
}

struct RemoteDataZMQ::Impl {
  std::string addr[2];
  std::string bound[2];
  // A bound TCP endpoint's port, released by runner workers forked meanwhile (a worker's
  // copy of the listening socket would keep the port taken after close()).
  os::ListenerMark marks[2];
  RemoteOptions opt;
  bool reset_done = false;
  std::unique_ptr<zmqio::Context> ctx;
  std::unique_ptr<zmqio::Socket> socks[2];
  std::unique_ptr<zmqio::Monitor> monitors[2];  // declared after socks: closed before them
  ProducerTable producers;
  // When next() last returned: a longer pause of the consumer is no producer's silence.
  std::optional<ProducerTable::Clock::time_point> last_return;
  ProducerTable::Clock::time_point next_check;  // of the connection events and silence
  uint64_t counts[2] = {0, 0};
  uint64_t rejected = 0;
  int next_first = 0;  // alternate which socket is read first, for fairness
  wire::Decoder decoder;
  std::vector<zmq::message_t> frames;
  // The layout of the last schema seen (messages of one producer repeat it), and its
  // datapoint structure (null for a TensorDict that is not a datapoint), checked once; the
  // values each message holds are checked against it.
  std::shared_ptr<const Json> last_meta;
  std::shared_ptr<const wire::ConsolidatedLayout> layout;
  std::unique_ptr<const wire::DatapointNode> structure;
  // next() and close() from another thread (an exit hook, a finalizer): the sockets go
  // only once next() has left them.
  detail::ConsumerGate gate;

  Impl(std::string a1, std::string a2, RemoteOptions o)
      : addr{std::move(a1), std::move(a2)}, opt(std::move(o)), decoder(opt.limits) {}
  int num() const { return addr[1].empty() ? 1 : 2; }
  // reset_state(): the context, the sockets bound (or connected) and their monitors;
  // unopen() takes down what a failed open() made and forgets the addresses bound;
  // take_down() (close()) keeps them.
  void open();
  void unopen() noexcept;
  void take_down() noexcept;
  RawDatapoint decode(int which);
  void read_events();
  void check_silence(ProducerTable::Clock::time_point now);
  int owner_pid = -1;  // the process that called reset_state()
  // os::fork_generation() of that process: a load per call, where getpid() is a system call.
  uint64_t owner_generation = 0;
  // A copy inherited by a forked child: its sockets belong to the parent's ZeroMQ threads.
  bool forked_copy() const noexcept {
    return owner_pid != -1 && owner_generation != os::fork_generation();
  }
  void check_usable() const {
    if (gate.closing()) throw ClosedError("RemoteDataZMQ is closed");
    if (forked_copy())
      throw ClosedError("RemoteDataZMQ was started by process " + std::to_string(owner_pid) +
                        "; this forked child cannot use it (make a new one here)");
    if (!reset_done) throw StateError("RemoteDataZMQ: call reset_state() before iterating");
  }
};

RawDatapoint RemoteDataZMQ::Impl::decode(int which) {
  const std::string where = "RemoteDataZMQ: message from " + bound[which] + " rejected: ";
  try {
    if (frames.size() != kFrames)
      throw ProtocolError("expected " + std::to_string(kFrames) +
                          " frames [header][metadata][storage], got " +
                          std::to_string(frames.size()) +
                          (frames.size() == 1 ? " (a tensorpack send_dataflow_zmq's pickle? both "
                                                "ends must be tensorwire's)"
                                              : ""));
    auto bytes = [&](size_t i) {
      return std::span(static_cast<const std::byte*>(frames[i].data()), frames[i].size());
    };
    if (frames[0].size() != wire::kHeaderBytes)
      throw ProtocolError("frame header of " + std::to_string(frames[0].size()) +
                          " bytes, expected " + std::to_string(wire::kHeaderBytes));
    const wire::FrameHeader h = decoder.read_header(bytes(0));
    if (h.kind != wire::MessageKind::SchemaAndStorage &&
        h.kind != wire::MessageKind::NonConsolidated)
      throw ProtocolError(
          std::string("a ") + wire::kind_name(h.kind) +
          " message (remote datapoints carry their schema: SchemaAndStorage or NonConsolidated)");
    if (frames[2].size() != h.payload_bytes)
      throw ProtocolError("storage frame of " + std::to_string(frames[2].size()) +
                          " bytes, the header announced " + std::to_string(h.payload_bytes));
    wire::Incoming in = decoder.prepare(h, bytes(1));
    wire::Decoder::fill(in, bytes(2));
    // A copy sharing the storage: the next message allocates anew.
    TensorDict td = decoder.finish(in);
    if (!is_consolidated_root(td)) {  // a NonConsolidated message
      try {
        td = consolidate(td);
      } catch (const ValueError& e) {  // a key consolidate() reserves, too deep a nesting
        throw ProtocolError(std::string("a NonConsolidated message that cannot be laid out: ") +
                            e.what());
      }
    }
    const auto& c = td.consolidated();
    // Each message carries its schema: compared by value, it is parsed again only when
    // it changes.
    if (c->metadata != last_meta && !(last_meta && *c->metadata == *last_meta)) {
      auto l = std::make_shared<const wire::ConsolidatedLayout>(
          wire::ConsolidatedLayout::parse(*c->metadata, opt.limits, c->storage.nbytes()));
      auto st = wire::DatapointDecoder::structure(*l, opt.allow_pickle);
      layout = std::move(l);
      structure = std::move(st);
      last_meta = c->metadata;
    }
    if (structure) wire::DatapointDecoder::check_values(*structure, c->storage);
    ++counts[which];
    return RawDatapoint{c->storage, layout};
  } catch (const ProtocolError& e) {
    ++rejected;
    throw ProtocolError(where + e.what());
  }
}

void RemoteDataZMQ::Impl::read_events() {
  zmqio::Monitor::Event e{};
  for (int i = 0; i < num(); ++i)
    while (monitors[i]->try_next(e)) {
      if (e.connected)
        producers.connected(i, e.fd, zmqio::peer_address(e.fd));
      else
        producers.disconnected(i, e.fd);
    }
}

void RemoteDataZMQ::Impl::check_silence(ProducerTable::Clock::time_point now) {
  // libzmq takes a connection whose queue had run dry back into the fair queue when it
  // processes its commands, which a stream of receives does only every 100th call: asking
  // for the events processes them now, so a producer with a datapoint waiting is read
  // within a round of the others (ProducerTable::silent() counts on that).
  for (int i = 0; i < num(); ++i) (void)socks[i]->ref().get(zmq::sockopt::events);
  while (auto s = producers.silent(now, opt.liveness_timeout)) {
    char why[200];
    std::snprintf(why, sizeof why, " datapoints, then none for %.1f s (liveness_timeout %.1f s; ",
                  seconds(s->silence), seconds(opt.liveness_timeout));
    TimeoutError e("RemoteDataZMQ: producer " + s->info.address + " on " + bound[s->info.socket] +
                   " sent " + std::to_string(s->info.datapoints) + why +
                   (s->info.connected ? "its connection is open" : "its connection closed") +
                   "): its host or the link to it is down, or it is stopped or has ended");
    if (!opt.on_silent) throw e;
    opt.on_silent(e);
  }
}

RemoteDataZMQ::RemoteDataZMQ(std::string addr1, std::string addr2, RemoteOptions options)
    : impl_(std::make_unique<Impl>(std::move(addr1), std::move(addr2), std::move(options))) {
  if (impl_->addr[0].empty()) throw ValueError("RemoteDataZMQ: no address");
  check_hwm(impl_->opt.hwm, "RemoteDataZMQ");
  checked_duration(impl_->opt.liveness_timeout, "RemoteDataZMQ: liveness_timeout");
  if (impl_->opt.limits.max_message_bytes == 0)
    throw ValueError("RemoteDataZMQ: max_message_bytes must be at least 1");
}

RemoteDataZMQ::~RemoteDataZMQ() = default;

void RemoteDataZMQ::reset_state() {
  Impl& m = *impl_;
  if (m.gate.closing()) throw ClosedError("RemoteDataZMQ is closed");
  if (m.reset_done) throw StateError("RemoteDataZMQ: reset_state() was called twice");
  try {
    m.open();
  } catch (...) {
    m.unopen();  // nothing half-made: a later reset_state() may try again
    throw;
  }
  m.reset_done = true;
}

void RemoteDataZMQ::Impl::take_down() noexcept {
  for (int i = 0; i < 2; ++i) {
    monitors[i].reset();
    socks[i].reset();
    marks[i] = {};
  }
  ctx.reset();
}

void RemoteDataZMQ::Impl::unopen() noexcept {
  take_down();
  bound[0].clear();
  bound[1].clear();
  owner_pid = -1;
}

void RemoteDataZMQ::Impl::open() {
  owner_pid = ::getpid();
  owner_generation = os::fork_generation();
  ctx = std::make_unique<zmqio::Context>();
  // A frame is refused (its connection dropped) before libzmq buffers it, when it is larger
  // than anything decode() accepts: the header, the metadata or the storage frame.
  const uint64_t largest = std::max<uint64_t>(
      {wire::kHeaderBytes, opt.limits.max_metadata_bytes, opt.limits.max_message_bytes});
  const zmqio::SocketOptions options{
      .rcvhwm = opt.hwm,
      .max_frame_bytes = static_cast<int64_t>(std::min<uint64_t>(largest, INT64_MAX))};
  for (int i = 0; i < num(); ++i) {
    socks[i] = std::make_unique<zmqio::Socket>(*ctx, zmq::socket_type::pull, options);
    // Before bind/connect: the first connection's event is not missed.
    monitors[i] = std::make_unique<zmqio::Monitor>(*ctx, *socks[i]);
    if (opt.bind)
      socks[i]->bind(addr[i]);
    else
      socks[i]->connect(addr[i]);
    bound[i] = socks[i]->last_endpoint();
    if (const auto tcp = zmqio::split_tcp(bound[i]); opt.bind && tcp)  // tcp://ip:port
      marks[i] = os::ListenerMark::tcp(tcp->host, static_cast<uint16_t>(std::stoul(tcp->port)));
  }
}

std::optional<RawDatapoint> detail::RawAccess::next(RemoteDataZMQ& remote, Timeout timeout) {
  RemoteDataZMQ::Impl& m = *remote.impl_;
  m.check_usable();
  const Deadline deadline = Deadline::after(timeout);
  detail::ConsumerGate::Call call(m.gate, "RemoteDataZMQ", deadline);
  if (!call.entered()) return std::nullopt;
  using Clock = ProducerTable::Clock;
  const auto live = m.opt.liveness_timeout;
  if (m.last_return && live.count() > 0) {
    const auto gap = Clock::now() - *m.last_return;
    if (gap > live / 4) m.producers.pause(gap);
  }
  struct Returned {  // on every way out, the throws included
    RemoteDataZMQ::Impl& m;
    ~Returned() { m.last_return = Clock::now(); }
  } returned{m};
  // Often enough to report a silent producer within a twentieth of the timeout.
  const auto check_every = live.count() > 0 ? std::max(live / 20, std::chrono::milliseconds(10))
                                            : std::chrono::milliseconds::max();
  std::optional<RawDatapoint> out;
  runtime::wait_until(deadline, [&](Deadline slice) {
    while (true) {
      if (m.gate.closing()) throw ClosedError("RemoteDataZMQ is closed");
      // The events and the silence check on a clock, not per datapoint: each read of the
      // monitors is a ZeroMQ call per socket.
      if (const auto now = Clock::now(); now >= m.next_check) {
        m.read_events();
        m.check_silence(now);
        m.next_check = now + (live.count() > 0 ? check_every : std::chrono::milliseconds(100));
      }
      for (int k = 0; k < m.num(); ++k) {
        const int i = (m.next_first + k) % m.num();
        if (!m.socks[i]->try_recv(m.frames)) continue;
        m.next_first = (i + 1) % m.num();
        const int fd = m.frames.empty() ? -1 : zmqio::source_fd(m.frames[0]);
        try {
          out = m.decode(i);
          // The event of this message's connection came before it, maybe still unread.
          if (!m.producers.knows(i, fd)) m.read_events();
          m.producers.datapoint(i, fd, Clock::now(), [&] {
            // A connection that closed before its event was read has no peer any more:
            // its host, from the message, without the port.
            std::string a = zmqio::peer_address(fd);
            return a.empty() && !m.frames.empty() ? zmqio::peer_host(m.frames[0]) : a;
          });
          return true;
        } catch (const ProtocolError& e) {
          if (!m.opt.on_rejected) throw;
          m.opt.on_rejected(e);
        }
      }
      if (slice.passed()) return false;
      zmqio::PollItem items[2] = {{m.socks[0].get(), -1, false}, {m.socks[1].get(), -1, false}};
      zmqio::poll(std::span(items, static_cast<size_t>(m.num())),
                  std::min(std::chrono::milliseconds(slice.poll_ms()), check_every));
    }
  });
  return out;
}

std::optional<TensorDict> RemoteDataZMQ::next(Timeout timeout) {
  auto raw = detail::RawAccess::next(*this, timeout);
  if (!raw) return std::nullopt;
  return raw->to_tensordict();
}

TensorDict RemoteDataZMQ::next() {
  return *next(Timeout::forever());
}

namespace {
// addr1 (0) or addr2 (1): IndexError naming the call otherwise.
size_t address_index(int which, const char* call) {
  if (which != 0 && which != 1)
    throw IndexError(std::string("RemoteDataZMQ.") + call +
                     ": which must be 0 (addr1) or 1 (addr2), got " + std::to_string(which));
  return static_cast<size_t>(which);
}
}  // namespace

std::string RemoteDataZMQ::endpoint(int which) const {
  return impl_->bound[address_index(which, "endpoint")];
}
uint64_t RemoteDataZMQ::count(int which) const {
  return impl_->counts[address_index(which, "count")];
}
uint64_t RemoteDataZMQ::rejected() const {
  return impl_->rejected;
}
std::chrono::milliseconds RemoteDataZMQ::liveness_timeout() const {
  return impl_->opt.liveness_timeout;
}
std::vector<ProducerInfo> RemoteDataZMQ::producers() const {
  Impl& m = *impl_;
  // Connections made since the last next() are listed too.
  if (m.reset_done && !m.gate.closing() && !m.forked_copy()) m.read_events();
  return m.producers.list();
}

void RemoteDataZMQ::close() {
  // A forked copy: nothing here is ours, and the turn it copied may be held by a parent's
  // thread that does not exist here (close() would wait for it in vain).
  if (impl_->forked_copy()) return;
  // A next() of another thread leaves first (within a poll: at most a twentieth of the
  // liveness timeout, or 100 ms).
  if (impl_->gate.stop(std::chrono::milliseconds(5000), "RemoteDataZMQ")) impl_->take_down();
}

bool RemoteDataZMQ::closed() const noexcept {
  return impl_->gate.closing();
}

}  // namespace tensorwire::dataflow
