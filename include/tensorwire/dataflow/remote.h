// Remote dataflows: producers on other machines feed a trainer over tcp://, as
// tensorpack's send_dataflow_zmq / RemoteDataZMQ do. Datapoints travel in tensorwire's
// wire format (docs/protocol.md), one self-contained SchemaAndStorage message per
// datapoint, as three ZeroMQ frames [frame header][metadata][storage]; tensors are never
// pickled. The receiver validates every message (and the structure of datapoints made by
// wire::DatapointEncoder); a malformed one is dropped, counted, and reported (ProtocolError,
// or the on_rejected callback) and the stream goes on.
//
// The receiver knows its producers (producers()): each connection, whether it is still
// open, how many datapoints came from it and when the last one came. A producer that sent
// and then stays silent for longer than liveness_timeout is reported once (TimeoutError,
// or the on_silent callback) while the others go on. The connection itself is kept: when a
// cut link comes back, TCP delivers what was in flight and nothing is lost (ZMTP heartbeats
// would drop it, and the datapoints queued in it with it).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/runtime/liveness.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire::dataflow {

struct SendOptions {
  int hwm = 50;                            // ZeroMQ's send queue; 0: no limit
  bool bind = false;                       // bind `addr` instead of connecting to it
  std::optional<uint64_t> max_datapoints;  // stop after this many (default: run for ever)
  // Called after each datapoint with the running count; returning false stops the loop.
  std::function<bool(uint64_t sent)> progress;
};

// Resets `df` and sends its datapoints, pass after pass, to `addr`. Datapoints are queued
// only for a connected receiver: a send blocks while there is none, or while `hwm`
// datapoints wait for it (interruptible, runtime/interrupt.h). Runs for ever unless
// max_datapoints or progress stop it; then returns the number sent, after handing what is
// queued to the receiver (for up to 5 s; ZeroMQ cannot tell whether it was read: a
// receiver that disconnects loses what was queued for it). ValueError for a pass with no
// datapoint.
uint64_t send_dataflow_zmq(DataFlow& df, const std::string& addr, const SendOptions& options = {});

struct RemoteOptions {
  int hwm = 50;      // ZeroMQ's receive queue per address; 0: no limit
  bool bind = true;  // bind the addresses (false: connect to them)
  wire::Limits limits;
  // false: a datapoint holding a Pickle element (wire/datapoint.h) is rejected like a
  // malformed message (unpickling runs code chosen by whoever reaches the socket).
  bool allow_pickle = true;
  // Called with each rejected message's error; when set, next() goes on with the stream
  // instead of throwing.
  std::function<void(const ProtocolError&)> on_rejected;
  // A producer that sent datapoints and then sent none for longer than this is reported
  // once (until it sends again). 0: no checks.
  std::chrono::milliseconds liveness_timeout = default_liveness_timeout();
  // Called with each silent producer's error; when set, next() goes on instead of throwing.
  std::function<void(const TimeoutError&)> on_silent;
};

// One producer connection of a RemoteDataZMQ.
struct ProducerInfo {
  // The producer's end, "tcp://host:port" as the receiver sees it ("tcp://host" for a
  // connection that closed before the receiver read its first message).
  std::string address;
  int socket = 0;  // 0: addr1, 1: addr2
  bool connected = false;
  uint64_t datapoints = 0;
  // When the last datapoint came; std::nullopt before the first.
  std::optional<std::chrono::steady_clock::time_point> last_datapoint;
};

// Receives datapoints from one or two PULL sockets (tensorpack: addr1 and addr2).
// Thread-safety: one thread at a time.
class RemoteDataZMQ {
 public:
  explicit RemoteDataZMQ(std::string addr1, std::string addr2 = {}, RemoteOptions options = {});
  ~RemoteDataZMQ();
  RemoteDataZMQ(const RemoteDataZMQ&) = delete;
  RemoteDataZMQ& operator=(const RemoteDataZMQ&) = delete;

  // Creates and binds (or connects) the sockets; once (StateError on a second call).
  void reset_state();
  // The next datapoint, std::nullopt after `timeout`. A malformed message throws
  // ProtocolError naming the socket and the rule it broke (unless on_rejected is set); it
  // is consumed, so the next call goes on with the stream. A producer silent for longer
  // than liveness_timeout throws TimeoutError naming it and its silence (unless on_silent
  // is set), once; the next call goes on. Only time spent waiting in next(), and pauses
  // between calls shorter than a quarter of the timeout, count as silence: a consumer that
  // stops reading for longer does not make the producers it kept waiting look silent.
  // Interruptible; ClosedError after close().
  std::optional<TensorDict> next(Timeout timeout);
  TensorDict next();

  // Endpoints actually bound or connected (tcp://host:* resolved to the port).
  std::string endpoint(int which) const;
  uint64_t count(int which) const;  // datapoints received from addr1 (0) / addr2 (1)
  uint64_t rejected() const;        // malformed messages dropped
  // The producers seen, the connected ones and those that sent datapoints (up to 64 closed
  // connections are kept), in the order they connected.
  std::vector<ProducerInfo> producers() const;
  std::chrono::milliseconds liveness_timeout() const;
  void close();
  bool closed() const noexcept;

  struct Impl;

 private:
  friend struct detail::RawAccess;
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorwire::dataflow
