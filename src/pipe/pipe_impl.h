// PipeImpl: the state behind a TensorDictPipe (private). One UCX worker and endpoint per
// pipe, the wire encoder/decoder, and the receive state machine:
//
//   Idle --probe(frame tag)--> Frame --frame received--> (inline payload) --> Idle
//                                                    \--> Payload --buffers received--> Idle
//
// A frame is the 40-byte header and the metadata; a small payload travels in the same UCX
// message (one message per small TensorDict: latency), a larger one as one message per
// buffer on the payload tag, received straight into the destination storage (no copy out
// of the frame). The receiver tells which from the frame's length.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "os/process.h"
#include "os/unix_socket.h"
#include "runtime/heartbeat.h"
#include "runtime/timed_lock.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/runtime/timeout.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "ucx/heartbeats.h"
#include "ucx/ucx.h"
#include "ucx/worker_wait.h"
#include "wire/handshake.h"

namespace tensorwire::detail {

inline constexpr uint64_t kFrameTag = 1;
inline constexpr uint64_t kPayloadTag = 2;
inline constexpr uint64_t kControlTag = 3;
inline constexpr uint64_t kHeartbeatTag = 4;     // liveness (pipe_liveness.cpp)
inline constexpr size_t kInlineMax = 64 * 1024;  // the most a frame carries inline
// Over shared memory (the direct endpoint), a consolidated payload above this goes on its
// own message to a peer that takes that ("split_payloads" in its hello): copying it out of
// the frame costs more than a second message (64 KiB: about 1.4x the throughput and 0.8x
// the latency, docs/benchmarks.md). Over TCP the second message costs more: 64 KiB there
// stays inline.
inline constexpr size_t kInlineSplit = 8 * 1024;
// A frame (header, metadata, inline payload) is sent eagerly when it fits: send() then
// returns without waiting for the peer (docs/pipe.md), unless it is one sent synchronously
// (kUnmatchedBytes).
static_assert(kInlineMax + 16 * 1024 <= ucx::kEagerMax);
// How far a sender may run ahead of its receiver. UCX moves an eager message into the
// receiver's memory whenever the receiver's worker progresses, asked for or not, so a
// receiver slower than its senders held all they sent (docs/pipe.md, "How far a sender
// runs ahead"). The message that brings what was sent since the last synchronous one to
// this many bytes or messages is sent synchronously (its last send: Done::Matched), and
// its send() returns once the receiver has matched it.
inline constexpr uint64_t kUnmatchedBytes = 1 << 20;
inline constexpr uint32_t kUnmatchedMessages = 256;

// Why a pipe became unusable, which decides who is told and what is thrown.
enum class Fault {
  PeerBrokeProtocol,  // the peer sent something invalid: tell it why; ProtocolError
  PeerReportedError,  // the peer closed after telling us our error: ClosedError, with it
  ConnectionLost,     // the peer closed or vanished: nobody to tell; ClosedError
  LocalFailure,       // this side cannot go on: tell the peer; ClosedError
};

// `options` when their limits are usable (ValueError naming the one that is not): every
// pipe and listener starts with them.
const PipeOptions& checked_options(const PipeOptions& options);

class PipeImpl : public runtime::Beating {
 public:
  // Client side.
  PipeImpl(const std::string& host, uint16_t port, const PipeOptions& options);
  // Server side, from an accepted connection request.
  PipeImpl(ucx::ConnRequest& request, const PipeOptions& options, uint16_t local_port);
  ~PipeImpl();

  void handshake(bool as_server);

  void send(const TensorDict& td, Timeout timeout);
  TensorDict& recv(TensorDict* into, Timeout timeout);
  bool start_send(const TensorDict& td);
  bool poll_send(std::chrono::microseconds spin = std::chrono::microseconds(0));
  bool sending(const TensorDict& td);
  bool receiving_into(const TensorDict& td);
  TensorDict* poll_recv(TensorDict* into,
                        std::chrono::microseconds spin = std::chrono::microseconds(0));
  bool last_new_schema() const { return last_new_schema_; }
  TensorDictPipe::Received receive(TensorDict* into, Timeout timeout, bool copy_always);
  TensorDictPipe::Received poll_receive(TensorDict* into, std::chrono::microseconds spin);

  int fd() const { return worker_->efd(); }
  uint64_t events() const { return worker_->events(); }
  // Arms the worker for an asyncio wait on fd() (ucx::WorkerWait::arm): false when events
  // came in or UCX refuses (stalled on the peer).
  bool arm();
  int peer_fd() const { return peer_watch_ ? peer_watch_->fd() : -1; }

  void close();
  // A client that gave up on its handshake (its timeout, an interrupt, an error): lets the
  // first endpoint's wire-up end (ucx::let_wireup_end), then closes.
  void close_abandoned() noexcept;
  // Ends every wait of the pipe with ClosedError at once, from any thread, without closing
  // it: whoever waited then closes it (a listener's close() abandons the handshakes in
  // progress, and each handshake's thread closes its own pipe, side by side).
  void abandon() noexcept;
  bool closed() const { return closed_.load(); }
  // True once the pipe's peer closed it, went away, or broke the protocol.
  bool failed();
  // True when the peer closed the pipe normally (not after an error, not by dying).
  bool closed_by_peer() const { return closed_by_peer_; }
  // Whether the connection ever reached the peer (UCX's wire-up completed).
  bool reached_peer() const { return reached_peer_; }
  // A client's connection that failed before that: why, as ucx::Endpoint says it.
  void throw_if_unreached(const std::string& host, uint16_t port) const;
  uint16_t local_port() const { return local_port_; }
  const std::string& peer() const { return ep_->peer(); }
  std::string transports();
  size_t inline_payload_max() {
    std::lock_guard<std::mutex> lock(mu_);
    return inline_max_;
  }
  const PipeOptions& options() const { return options_; }

  // Liveness (pipe_liveness.cpp): heartbeats to and from a peer on another host, on the
  // process's liveness thread.
  void beat() noexcept override;

 private:
  TensorDict* step_recv(TensorDict* into);  // under mu_
  // Under mu_: what a receive that got `got` hands a caller (TensorDictPipe::Received).
  TensorDictPipe::Received taken(TensorDict* got, TensorDict* into, bool copy_always) const;
  bool step_send();  // under mu_
  // Under mu_: posts `td`'s send when `turn` (the caller holds send_mu_) and no send is in
  // flight; false otherwise, nothing sent.
  bool post_send(const TensorDict& td, bool turn);
  void check_alive();  // under mu_: throws ClosedError
  // Under mu_: ClosedError "<what>: the pipe is closed" once closed or abandoned.
  void check_open(const char* what) const;
  void drain_control();  // under mu_
  template <class Done>
  void check_cut(Done done);  // under mu_, a receive in progress: see pipe_impl.cpp
  [[noreturn]] void fail(const std::string& reason, Fault fault);  // under mu_
  // Throws ClosedError when this process is a fork of the one that made the pipe.
  void check_process() const;
  // The one wait of the pipe: progresses the worker and calls `ready()` (under mu_) until it
  // returns true, checking that the pipe is alive, sleeping on the wake-up fds between
  // polls and checking for an interrupt at least every kInterruptSlice. TimeoutError
  // ("<what> timed out after ...") once `deadline` passes.
  template <class Ready>
  void wait_until(Ready&& ready, Deadline deadline, const char* what);
  // The caller's turn on `one_at_a_time` (send_mu_ or recv_mu_), waited for until
  // `deadline` and interruptibly; TimeoutError naming `what` when another thread's call
  // holds it until then.
  std::unique_lock<runtime::TimedLock> turn(runtime::TimedLock& one_at_a_time, Deadline deadline,
                                            const char* what);
  // Sleeps until progress may be possible or `slice` passes; `seen` is worker_->events()
  // from before the caller's last poll (returns at once if anything progressed since).
  void wait_event(Deadline slice, uint64_t seen);
  // Under mu_: in_flight_ once its send is over (to destroy after unlocking), else nothing.
  std::optional<TensorDict> taken_in_flight();
  unsigned progress();  // under mu_
  bool peer_is_local() const;
  bool peer_is_ours(bool as_server) const;
  void wait_wireup(Deadline deadline);
  // What the hosts' verdicts came to: apart (heartbeats), one host on the first endpoint,
  // or one host on the direct (shared-memory) endpoint.
  enum class Host { Apart, Shared, Direct };
  Host use_direct_endpoint(Deadline deadline, bool local, bool peer_is_ours, bool verdicts);
  void retire_first_endpoint(Deadline deadline);
  void send_control(const Json& body, Deadline deadline);
  Json recv_control(Deadline deadline);
  void ensure_frame_capacity(size_t n);
  ucx::Request post_control(const Json& body);
  std::optional<Json> take_control(uint64_t tag, size_t max_bytes, const char* what);
  void flush(ucx::Request& req, std::chrono::milliseconds budget);
  // After the handshake, under mu_: heartbeats at the peer's interval unless it is on this
  // host.
  void start_liveness(int64_t peer_heartbeat_ms, bool same_host);
  // Whether a message on `tag` is one this pipe reads, now (check_alive). Under mu_.
  bool reads_tag(uint64_t tag) const;
  // close() with a send in flight (its close message stuck behind it, or a synchronous or
  // rendezvous send the peer has not taken yet: pipe_liveness.cpp): true when the liveness
  // thread took the rest of the close over.
  bool linger(ucx::Request& close_msg);  // under mu_
  // On the liveness thread, under mu_: one turn of a lingering close; once it is over, the
  // pipe's own reference and the message's storages, to let go of outside mu_.
  void linger_turn(std::shared_ptr<PipeImpl>& self, std::optional<TensorDict>& storages);
  // Under mu_: whether a send request is still running (a failed one counts as over).
  bool sends_in_flight();
  // Under mu_: the endpoint failed or the same-host peer process has exited.
  bool peer_gone() const;
  // The end of every close: the endpoint closed (by force when `force`), waiting up to
  // `budget` for a graceful one.
  void close_endpoint(bool force,
                      std::chrono::milliseconds budget = std::chrono::milliseconds(1000));  // mu_

  PipeOptions options_;
  uint64_t generation_;  // os::fork_generation() of the process that made the pipe
  pid_t owner_pid_;
  uint16_t local_port_ = 0;
  std::unique_ptr<ucx::Worker> worker_;
  std::unique_ptr<ucx::Endpoint> ep_;
  std::unique_ptr<ucx::Endpoint> first_ep_;  // the listener's endpoint, until retired
  bool early_direct_ = false;                // the peer's "direct" came before its address
  ucx::WorkerWait waiting_;                  // the sleep of wait_event (threads share worker_)
  std::optional<os::ProcessWatch> peer_watch_;
  std::chrono::steady_clock::time_point next_liveness_check_{};
  uint32_t liveness_calls_ = 0;
  std::mutex mu_;  // every UCX call and all state below
  // One sender and one receiver at a time; a second caller waits for its turn until its
  // own deadline, interruptibly (turn()).
  runtime::TimedLock send_mu_;
  runtime::TimedLock recv_mu_;
  std::atomic<bool> closed_{false};
  bool connected_ = false;      // the handshake completed (under mu_)
  bool heartbeats_on_ = false;  // beat() runs: tag 4 is read (under mu_)
  // The pipe's waits end with ClosedError (abandon()); close() has still to come.
  std::atomic<bool> abandoned_{false};
  bool wired_up_ = false;      // ep_'s UCX wire-up is over (a graceful close is safe)
  bool reached_peer_ = false;  // the first endpoint's wire-up completed
  bool peer_lost_ = false;     // failed with Fault::ConnectionLost: nobody to flush to
  std::string failure_;        // why the pipe is unusable ("" while healthy)
  bool failure_is_protocol_ = false;
  std::atomic<bool> closed_by_peer_{false};

  // liveness state, under mu_ (pipe_liveness.cpp)
  ucx::Heartbeats heartbeats_;

  wire::Encoder encoder_;
  wire::Decoder decoder_;

  std::vector<std::byte> control_buf_;  // the control frame in flight (post_control)

  // send state
  bool sending_ = false;
  const TensorDict* sending_td_ = nullptr;  // what the send in flight reads (identity only)
  // A copy of the dict whose blocking send returned (timed out, interrupted) still in flight:
  // it holds the storages UCX reads until the peer has the message, even if the caller
  // lets the dict go. Taken out (taken_in_flight()) once the send is over and destroyed
  // outside mu_: a storage that wraps a Python buffer takes the GIL to let it go.
  std::optional<TensorDict> in_flight_;
  // A lingering close (linger()): the pipe itself, kept alive until the close message and
  // the sends have left, the peer is gone or linger_until_ passed; and that close message.
  std::shared_ptr<PipeImpl> lingering_;
  ucx::Request close_msg_;
  std::chrono::steady_clock::time_point linger_until_{};
  std::vector<std::span<const std::byte>> pieces_;
  std::vector<ucp_dt_iov_t> frame_iov_;
  std::vector<ucp_dt_iov_t> payload_iov_;
  std::vector<ucx::Request> send_reqs_;
  // Sent since the last message sent synchronously (kUnmatchedBytes).
  uint64_t unmatched_bytes_ = 0;
  uint32_t unmatched_messages_ = 0;
  size_t inline_max_ = kInlineMax;  // the largest payload sent inline (set by the handshake)

  // receive state
  enum class RecvState { Idle, Frame, Payload } state_ = RecvState::Idle;
  std::unique_ptr<std::byte[]> frame_;
  size_t frame_capacity_ = 0;
  size_t frame_len_ = 0;
  size_t frame_got_ = 0;
  ucx::Request frame_req_;
  wire::Incoming incoming_;
  std::vector<ucx::Request> payload_reqs_;
  std::vector<size_t> payload_got_;  // received length per buffer
  bool last_new_schema_ = false;
  TensorDict* into_ = nullptr;
};

}  // namespace tensorwire::detail
