// Remote dataflows: producers on other machines feed a trainer over tcp://, as
// tensorpack's send_dataflow_zmq / RemoteDataZMQ do. Datapoints travel in tensorwire's
// wire format (docs/protocol.md), one self-contained SchemaAndStorage message per
// datapoint, as three ZeroMQ frames [frame header][metadata][storage]; tensors are never
// pickled. The receiver validates every message; a malformed one is dropped with a
// ProtocolError and the stream goes on.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "tensorwire/dataflow/dataflow.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire::dataflow {

struct SendOptions {
  int hwm = 50;
  bool bind = false;                       // bind `addr` instead of connecting to it
  std::optional<uint64_t> max_datapoints;  // stop after this many (default: run for ever)
  // Called after each datapoint with the running count; returning false stops the loop.
  std::function<bool(uint64_t sent)> progress;
};

// Resets `df` and sends its datapoints, pass after pass, to `addr`. Returns the number
// sent (only when max_datapoints or progress stopped it).
uint64_t send_dataflow_zmq(DataFlow& df, const std::string& addr, const SendOptions& options = {});

// Receives datapoints from one or two PULL sockets (tensorpack: addr1 and addr2).
// Thread-safety: one thread at a time.
class RemoteDataZMQ {
 public:
  explicit RemoteDataZMQ(std::string addr1, std::string addr2 = {}, int hwm = 50, bool bind = true,
                         wire::Limits limits = {});
  ~RemoteDataZMQ();
  RemoteDataZMQ(const RemoteDataZMQ&) = delete;
  RemoteDataZMQ& operator=(const RemoteDataZMQ&) = delete;

  // Creates and binds (or connects) the sockets; once (StateError on a second call).
  void reset_state();
  // The next datapoint, std::nullopt after `timeout` (negative: no limit). A malformed
  // message throws ProtocolError naming the socket and the rule it broke; it is consumed,
  // so the next call goes on with the stream.
  std::optional<TensorDict> next(std::chrono::milliseconds timeout);
  TensorDict next();

  // Endpoints actually bound or connected (tcp://host:* resolved to the port).
  std::string endpoint(int which) const;
  uint64_t count(int which) const;  // datapoints received from addr1 (0) / addr2 (1)
  uint64_t rejected() const;        // malformed messages dropped
  void close();

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace tensorwire::dataflow
