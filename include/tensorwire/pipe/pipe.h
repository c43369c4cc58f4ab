// TensorDictPipe: a point-to-point stream of TensorDicts between two processes, on UCX
// (shared memory or CMA on one host, TCP or RDMA between hosts; UCX_TLS chooses).
//
// Consolidated mode sends a structure once, then only raw storage: the receiver writes
// each storage message into the buffer of the previous receive, with no allocation and no
// parsing, and returns the same TensorDict object with the new values. Every received
// header is validated by the wire codec (docs/protocol.md); a violation closes the pipe
// and tells the peer why.
//
// Peer death: UCX endpoint errors, plus a pidfd on a peer that runs on this host, end any
// wait with ClosedError within a second or so.
//
// Thread-safety: one send and one receive may run at the same time from two threads; two
// concurrent sends (or receives) are serialised. close() may be called from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/pipe/options.h"

namespace tensorwire {

namespace detail {
class PipeImpl;
class ListenerImpl;
}  // namespace detail

class TensorDictPipe {
 public:
  using Millis = std::chrono::milliseconds;
  static constexpr Millis kForever{-1};

  // Connects to a listener or server on host:port (handshake included).
  static TensorDictPipe connect(const std::string& host, uint16_t port,
                                const PipeOptions& options = {});
  // Listens on `port` (0 = a free port, reported to `on_listening`), waits for the first
  // client and returns the connected pipe; later clients are refused.
  static TensorDictPipe listen(uint16_t port, const PipeOptions& options = {},
                               const std::function<void(uint16_t)>& on_listening = {});

  // Blocks until the data has left `td`'s memory (it may be modified afterwards).
  void send(const TensorDict& td, Millis timeout = kForever);
  // Returns the received TensorDict. Consolidated mode: the same object as the previous
  // receive while the structure is unchanged (its storage overwritten in place), or
  // `*into` when `into` is consolidated with the received layout. The reference stays
  // valid until the next receive on this pipe.
  TensorDict& recv(TensorDict* into = nullptr, Millis timeout = kForever);
  // True when the last recv() started a new structure (a new TensorDict object).
  bool last_recv_was_new_schema() const;

  // Futures: the operation runs on a helper thread.
  std::future<void> send_async(TensorDict td);
  std::future<TensorDict> recv_async();

  // Non-blocking forms for event loops: each advances the operation as far as it can.
  // start_send() then poll_send() until true; poll_recv() until it returns a dict.
  // A send or receive that times out (or a poll loop that is abandoned) stays in flight:
  // the sent TensorDict's memory is still read, and a receive still writes into the
  // TensorDict given to it, until a later call completes it. Keep both alive until then.
  void start_send(const TensorDict& td);
  // `spin`: keep polling this long before giving up (an event loop that would otherwise
  // pay tens of microseconds per wake-up; a reply on one host is about 1 us away).
  bool poll_send(std::chrono::microseconds spin = std::chrono::microseconds(0));
  TensorDict* poll_recv(TensorDict* into = nullptr,
                        std::chrono::microseconds spin = std::chrono::microseconds(0));
  // A fd that becomes readable when progress may be possible. Call arm() first: when it
  // returns false, events are already pending (poll again instead of sleeping).
  int fd() const;
  bool arm();
  // Counts the progress calls that found work. Two waiters on one pipe (a send and a
  // receive in one event loop): one that sees it change across its own poll and arm may
  // have taken the other's event, and should wake the other before it sleeps.
  uint64_t events() const;
  // A fd that becomes readable if the peer process exits (-1 for a remote peer).
  int peer_fd() const;

  void close();
  bool closed() const;
  uint16_t local_port() const;  // listener side: the port that was bound
  const std::string& peer() const;
  const PipeOptions& options() const;
  // The UCX transports the connection's data moves over, as UCX names them, e.g.
  // "sysv/memory" between processes of one host, "tcp/lo" over loopback TCP
  // (diagnostics: which path a pipe took). Empty once closed.
  std::string transports() const;

  TensorDictPipe(TensorDictPipe&&) noexcept;
  TensorDictPipe& operator=(TensorDictPipe&&) noexcept;
  ~TensorDictPipe();  // closes

 private:
  friend class PipeListener;
  friend class TensorDictServer;
  explicit TensorDictPipe(std::shared_ptr<detail::PipeImpl> impl);
  std::shared_ptr<detail::PipeImpl> impl_;
};

// Accepts connections on a port; each becomes its own pipe (after the handshake).
class PipeListener {
 public:
  explicit PipeListener(uint16_t port, const PipeOptions& options = {});
  ~PipeListener();
  uint16_t port() const;
  // Waits up to `timeout` for a client; std::nullopt on timeout. A client that fails the
  // handshake (wrong key, mode mismatch) is refused (it gets the reason) and counted, and
  // accept() goes on, unless throw_on_refusal.
  std::optional<TensorDictPipe> accept(TensorDictPipe::Millis timeout = TensorDictPipe::kForever,
                                       bool throw_on_refusal = false);
  int fd() const;  // readable when a connection request may be pending
  bool arm();
  void close();
  size_t refused() const;  // clients refused at handshake so far
  const std::string& last_refusal() const;

 private:
  std::unique_ptr<detail::ListenerImpl> impl_;
};

}  // namespace tensorwire
