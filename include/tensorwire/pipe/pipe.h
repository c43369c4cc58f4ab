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
//
// Blocking calls (send, recv, accept, connect) take a Timeout (default: for ever) and check
// for an interrupt (tensorwire/runtime/interrupt.h) at least every kInterruptSlice, so a
// program's interrupt check (Ctrl-C in Python) ends them. A call that timed out or was
// interrupted leaves the pipe usable; what stays in flight is documented per call.
//
// Fork: a pipe, listener or server belongs to the process that made it. In a forked child
// every use of an inherited one throws ClosedError naming the object and the fork, and
// destroying it there leaves the parent's UCX state alone (the child leaks it on purpose).
// A child forked while its parent had UCX in use cannot start UCX (UCX 1.13's async thread
// does not survive fork): new pipes there throw at once, saying to use spawn/forkserver.
#pragma once

#include <cstdint>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <string>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/pipe/errors.h"
#include "tensorwire/pipe/options.h"

namespace tensorwire {

namespace detail {
class PipeImpl;
class ListenerImpl;
}  // namespace detail

class TensorDictPipe {
 public:
  // Connects to a listener or server on host:port (handshake included), within
  // options.connect_timeout. ConnectionRefused when nothing listens there, ClosedError
  // when the connection ends before the server took it up, TimeoutError when the handshake
  // does not complete in time, HandshakeError when the server refuses it (a wrong or
  // missing auth_key, another `consolidated` mode). A handshake given up lets UCX's wire-up
  // end first: the call returns up to 0.3 s after its timeout (docs/reliability.md).
  static TensorDictPipe connect(const std::string& host, uint16_t port,
                                const PipeOptions& options = {});
  // Listens on `port` (0 = a free port, reported to `on_listening`), waits for the first
  // client and returns the connected pipe; later clients are refused. TimeoutError when no
  // client connected within `timeout`.
  static TensorDictPipe listen(uint16_t port, const PipeOptions& options = {},
                               const std::function<void(uint16_t)>& on_listening = {},
                               Timeout timeout = Timeout::forever());

  // Returns once UCX has taken the message: `td` may be modified afterwards. A message
  // with at most 64 KiB of tensor data and 16 KiB of metadata is copied by UCX and send()
  // returns without waiting for the peer, so a send followed by a recv works on both
  // sides; but a sender runs at most about 1 MiB or 256 messages ahead of its receiver:
  // the message that reaches that returns once the peer has taken it. A larger payload
  // travels by rendezvous, straight from `td`'s memory into the receiver's: send() returns
  // when the peer has received it (docs/pipe.md, "When send() returns").
  //
  // Resuming: a send that timed out or was interrupted stays in flight, still reading
  // `td`'s memory: the pipe keeps that memory alive (`td` may be dropped), but leave it
  // unchanged until the send is over, or the peer may get the new bytes. Calling send()
  // again with the same TensorDict object (with the same leaves) continues it (the message
  // arrives exactly once); with another TensorDict, the one in flight completes first
  // (within this call's timeout), then the new one is sent; when the timeout passes
  // first, the new one was not sent (TimeoutError "send timed out before it started").
  void send(const TensorDict& td, Timeout timeout = Timeout::forever());
  // Returns the received TensorDict. Consolidated mode: the same object as the previous
  // receive while the structure is unchanged (its storage overwritten in place), or
  // `*into` when `into` is consolidated with the received layout. The reference stays
  // valid until the next receive on this pipe. A receive that timed out or was interrupted
  // stays in flight (it may still write into `into`); the next recv() continues it.
  TensorDict& recv(TensorDict* into = nullptr, Timeout timeout = Timeout::forever());
  // True when the last recv() brought a new structure (keys, dtypes or shapes). The
  // reference recv() returns may still be at the same address (the pipe's one slot holds
  // the new dict): a caller that keeps views of the old one's leaves must look here, not
  // compare addresses.
  bool last_recv_was_new_schema() const;

  // recv() and poll_recv() for a pipe that several threads receive from: what recv()
  // returns is the decoder's object, which the next receive (another thread's) replaces or
  // rewrites, so what the caller keeps is taken before the receive lets go of the pipe.
  // `target`: the object received into (`into`, or the decoder's; null: nothing yet);
  // `copy`: a structural copy of it (sharing its storage) when it is not `into` and is a new
  // object (not consolidated, or a new structure), or always with `copy_always`; then, of
  // the decoder's object of a consolidated pipe (whose storage the next receive rewrites in
  // place), a copy with storage of its own: what several receiving threads need.
  struct Received {
    TensorDict* target = nullptr;
    std::optional<TensorDict> copy;
    bool new_schema = false;
  };
  Received receive(TensorDict* into = nullptr, Timeout timeout = Timeout::forever(),
                   bool copy_always = false);
  Received poll_receive(TensorDict* into = nullptr,
                        std::chrono::microseconds spin = std::chrono::microseconds(0));

  // Futures: the blocking form runs on a helper thread, until `timeout` (TimeoutError from
  // get()). As with any std::async future, destroying one waits for its operation: bound
  // it with a timeout, or close() the pipe (from any thread), which ends it with ClosedError.
  std::future<void> send_async(TensorDict td, Timeout timeout = Timeout::forever());
  std::future<TensorDict> recv_async(Timeout timeout = Timeout::forever());

  // Non-blocking forms for event loops: each advances the operation as far as it can.
  // start_send() then poll_send() until true; poll_recv() until it returns a dict.
  // A send or receive that times out (or a poll loop that is abandoned) stays in flight:
  // the sent TensorDict's memory is still read, and a receive still writes into the
  // TensorDict given to it, until a later call completes it. Keep both alive until then.
  // start_send() returns false, sending nothing, while another send is in flight (one not
  // yet completed by poll_send(), or a blocking send() of another thread): poll_send() and
  // start again.
  [[nodiscard]] bool start_send(const TensorDict& td);
  // `spin`: keep polling this long before giving up (an event loop that would otherwise
  // pay tens of microseconds per wake-up; a reply on one host is about 1 us away).
  bool poll_send(std::chrono::microseconds spin = std::chrono::microseconds(0));
  // Whether the send in flight is `td`'s (the same object with the same leaves; one that
  // timed out, was interrupted or whose poll loop was abandoned): an event loop retrying
  // that send finishes it with poll_send() instead of starting it again (twice delivered).
  bool sending(const TensorDict& td);
  // Whether a receive in flight (one that timed out, was interrupted or whose poll loop was
  // abandoned after its message began) writes into `td`: `td` must stay alive until a later
  // receive completes it.
  bool receiving_into(const TensorDict& td);
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
  // Whether the pipe can no longer carry data: closed here, closed by the peer, the peer
  // gone or in breach of the protocol, or inherited through fork(). Does not block.
  bool failed() const;
  // True once the peer closed the pipe normally (a receive then throws ClosedError): the
  // end of a stream, as opposed to a peer that died or reported an error.
  bool closed_by_peer() const;
  uint16_t local_port() const;  // listener side: the port that was bound
  const std::string& peer() const;
  const PipeOptions& options() const;
  // The UCX transports the connection's data moves over, as UCX names them, e.g.
  // "sysv/memory" between processes of one host, "tcp/lo" over loopback TCP
  // (diagnostics: which path a pipe took). Empty once closed.
  std::string transports() const;
  // The largest payload a message of this pipe carries inside its frame (64 KiB; 8 KiB
  // over shared memory to a peer that takes split payloads: docs/pipe.md). Diagnostics.
  size_t inline_payload_max() const;

  TensorDictPipe(TensorDictPipe&&) noexcept;
  TensorDictPipe& operator=(TensorDictPipe&&) noexcept;  // closes the pipe it replaces
  ~TensorDictPipe();                                     // closes

 private:
  friend class PipeListener;
  friend class TensorDictServer;
  explicit TensorDictPipe(std::shared_ptr<detail::PipeImpl> impl);
  detail::PipeImpl& impl() const;  // ClosedError when moved from
  std::shared_ptr<detail::PipeImpl> impl_;
};

// Accepts connections on a port; each becomes its own pipe (after the handshake).
class PipeListener {
 public:
  explicit PipeListener(uint16_t port, const PipeOptions& options = {});
  PipeListener(PipeListener&&) noexcept;
  PipeListener& operator=(PipeListener&&) noexcept;  // closes the listener it replaces
  ~PipeListener();
  uint16_t port() const;
  // Waits up to `timeout` for a client; std::nullopt on timeout. A client that fails the
  // handshake (wrong key, mode mismatch) is refused (it gets the reason) and counted, and
  // accept() goes on, unless throw_on_refusal.
  // The handshake of each client has its own budget, options.connect_timeout. ClosedError
  // once closed.
  std::optional<TensorDictPipe> accept(Timeout timeout = Timeout::forever(),
                                       bool throw_on_refusal = false);
  int fd() const;  // readable when a connection request may be pending
  bool arm();
  void close();
  bool closed() const;     // also true when moved from
  size_t refused() const;  // clients refused at handshake so far
  std::string last_refusal() const;

 private:
  detail::ListenerImpl& impl() const;  // ClosedError when moved from
  std::unique_ptr<detail::ListenerImpl> impl_;
};

}  // namespace tensorwire
