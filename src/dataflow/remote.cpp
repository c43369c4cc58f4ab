#include "tensorwire/dataflow/remote.h"

#include <cstring>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "zmq/zmq.h"

namespace tensorwire::dataflow {

namespace {

using Millis = std::chrono::milliseconds;

// Frames of one remote datapoint: [frame header][metadata][storage].
constexpr size_t kFrames = 3;

}  // namespace

uint64_t send_dataflow_zmq(DataFlow& df, const std::string& addr, const SendOptions& o) {
  if (o.hwm < 1) throw ValueError("send_dataflow_zmq: hwm must be at least 1");
  zmqio::Context ctx;
  // Linger: what was sent before returning is delivered (for up to 5 s) when we close.
  zmqio::Socket push(ctx, zmq::socket_type::push, {.sndhwm = o.hwm, .linger_ms = 5000});
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
      push.send(frames, Millis(-1));
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
  int hwm;
  bool bind;
  wire::Limits limits;
  bool reset_done = false;
  std::unique_ptr<zmqio::Context> ctx;
  std::unique_ptr<zmqio::Socket> socks[2];
  uint64_t counts[2] = {0, 0};
  uint64_t rejected = 0;
  int next_first = 0;  // alternate which socket is read first, for fairness
  wire::Decoder decoder;
  std::vector<zmq::message_t> frames;

  Impl(std::string a1, std::string a2, int h, bool b, wire::Limits l)
      : addr{std::move(a1), std::move(a2)}, hwm(h), bind(b), limits(l), decoder(l) {}
  int num() const { return addr[1].empty() ? 1 : 2; }
  TensorDict decode(int which);
};

TensorDict RemoteDataZMQ::Impl::decode(int which) {
  const std::string where = "RemoteDataZMQ: message from " + bound[which] + " rejected: ";
  try {
    if (frames.size() != kFrames)
      throw ProtocolError("expected " + std::to_string(kFrames) +
                          " frames [header][metadata][storage], got " +
                          std::to_string(frames.size()));
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
    TensorDict td =
        decoder.finish(in);  // a copy sharing the storage: the next message allocates anew
    ++counts[which];
    return td;
  } catch (const ProtocolError& e) {
    ++rejected;
    throw ProtocolError(where + e.what());
  }
}

RemoteDataZMQ::RemoteDataZMQ(std::string addr1, std::string addr2, int hwm, bool bind,
                             wire::Limits limits)
    : impl_(std::make_unique<Impl>(std::move(addr1), std::move(addr2), hwm, bind, limits)) {
  if (impl_->addr[0].empty()) throw ValueError("RemoteDataZMQ: no address");
  if (hwm < 1) throw ValueError("RemoteDataZMQ: hwm must be at least 1");
}

RemoteDataZMQ::~RemoteDataZMQ() = default;

void RemoteDataZMQ::reset_state() {
  Impl& m = *impl_;
  if (m.reset_done) throw StateError("RemoteDataZMQ: reset_state() was called twice");
  m.reset_done = true;
  m.ctx = std::make_unique<zmqio::Context>();
  for (int i = 0; i < m.num(); ++i) {
    m.socks[i] = std::make_unique<zmqio::Socket>(*m.ctx, zmq::socket_type::pull,
                                                 zmqio::SocketOptions{.rcvhwm = m.hwm});
    if (m.bind)
      m.socks[i]->bind(m.addr[i]);
    else
      m.socks[i]->connect(m.addr[i]);
    m.bound[i] = m.socks[i]->last_endpoint();
  }
}

std::optional<TensorDict> RemoteDataZMQ::next(Millis timeout) {
  Impl& m = *impl_;
  if (!m.reset_done) throw StateError("RemoteDataZMQ: call reset_state() before iterating");
  if (!m.ctx) throw ClosedError("RemoteDataZMQ is closed");
  using clock = std::chrono::steady_clock;
  const auto deadline = timeout.count() < 0 ? clock::time_point::max() : clock::now() + timeout;
  while (true) {
    for (int k = 0; k < m.num(); ++k) {
      const int i = (m.next_first + k) % m.num();
      if (m.socks[i]->try_recv(m.frames)) {
        m.next_first = (i + 1) % m.num();
        return m.decode(i);
      }
    }
    const auto now = clock::now();
    if (now >= deadline) return std::nullopt;
    zmqio::PollItem items[2] = {{m.socks[0].get(), -1, false}, {m.socks[1].get(), -1, false}};
    auto wait = deadline == clock::time_point::max()
                    ? Millis(-1)
                    : std::chrono::duration_cast<Millis>(deadline - now) + Millis(1);
    zmqio::poll(std::span(items, static_cast<size_t>(m.num())), wait);
  }
}

TensorDict RemoteDataZMQ::next() {
  return *next(Millis(-1));
}

std::string RemoteDataZMQ::endpoint(int which) const {
  return impl_->bound[which];
}
uint64_t RemoteDataZMQ::count(int which) const {
  return impl_->counts[which];
}
uint64_t RemoteDataZMQ::rejected() const {
  return impl_->rejected;
}

void RemoteDataZMQ::close() {
  impl_->socks[0].reset();
  impl_->socks[1].reset();
  impl_->ctx.reset();
}

}  // namespace tensorwire::dataflow
