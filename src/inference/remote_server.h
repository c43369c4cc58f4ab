// The server side of a RemoteTransport (private): the slot bank, the listener thread and one
// thread per connected client. remote_transport.h describes the design, remote_frames.h the
// messages.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <stop_token>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "bank_batch.h"
#include "os/adaptive_spin.h"
#include "os/fork.h"
#include "slot_layout.h"
#include "tensorwire/inference/remote_transport.h"
#include "ucx/heartbeats.h"
#include "ucx/ucx.h"
#include "wire/handshake.h"
#include "work_notifier.h"

namespace tensorwire::inference::detail {

class RemoteConnection;

// The longest spin of a serving or connection thread before it sleeps: twice the gap
// between an answer and the client's next request across two simulated hosts (about 45 us,
// docs/benchmarks.md), as AdaptiveSpin learns budgets of twice the waits it sees.
inline constexpr std::chrono::microseconds kLongestSpin{200};

// The largest batch whose answers the serving thread sends itself. A small batch means an
// idle server, whose serving thread would wait for work next: sending saves each client a
// hand-over (a wake-up of its connection's thread). A large one means requests queue, and
// the serving thread's time bounds the throughput: its connection threads send in
// parallel (256 clients: 6.1-6.6 k requests/s with every answer sent by the serving
// thread, 8.8-11.8 k handed over; docs/benchmarks.md).
inline constexpr size_t kAnswersSentByTheServer = 4;

// The serving thread takes in requests itself (RemoteServer::take_arrivals) from a
// connection whose thread has not taken a turn for kTurnOverdue. On a server host whose CPUs
// are busy (local actors of the same server), a connection's thread woken by a request waits
// for a CPU for up to a scheduler slice: remote actors got 2-7% of a mixed batch with a CPU
// of their own (docs/benchmarks.md). A look costs the serving thread a worker progress (a
// system call), so a look that finds nothing doubles that connection's gap to the next one
// (from kLookGapMin up to kLookGapMax: an idle client costs a look a millisecond), and with
// more than kConnectionsTheServerReceivesFrom connections their threads, which run in
// parallel, do it alone.
inline constexpr std::chrono::microseconds kTurnOverdue{20};
inline constexpr std::chrono::microseconds kLookGapMin{10};
inline constexpr std::chrono::microseconds kLookGapMax{1000};
inline constexpr size_t kConnectionsTheServerReceivesFrom = 8;
// How long a connection's thread yields for its worker's mutex after a wait before it
// blocks on it (RemoteConnection::relock).
inline constexpr std::chrono::microseconds kRelockSpin{50};

struct RemoteSlot {
  enum State : uint8_t {
    Free,
    Receiving,  // a request is being received into it
    Ready,      // received, waiting for a drain
    Taken,      // drained: the policy is working on it
    Answering   // its response or failure is queued or being sent
  };
  State state = Free;
  uint32_t conn = 0;  // the connection whose request it holds
  uint64_t seq = 0;   // that client's number for the request
  int64_t submitted_ns = 0;
};

// An answer handed to a connection thread: a response from `slot`, or a failure message.
struct Outgoing {
  uint32_t slot = UINT32_MAX;  // UINT32_MAX: no slot (a request refused before it had one)
  uint64_t seq = 0;
  std::optional<Json> failure;
};

class RemoteServer {
 public:
  RemoteServer(const TensorDict& request_spec, const TensorDict& response_spec,
               RemoteOptions options);
  ~RemoteServer();  // stop()
  // Stops the listener and every connection (clients get ClosedError(reason)); joins them.
  void stop(const std::string& reason);

  const RemoteOptions options;
  const uint64_t generation = os::fork_generation();
  // Whether this is a forked child's copy: the listener, threads and locks are the parent's.
  bool inherited() const noexcept { return generation != os::fork_generation(); }
  SlotLayout request, response;
  Storage request_bank, response_bank;
  size_t request_bytes = 0;  // one request on the wire: its leaves back to back
  BatchViews batch;          // serving thread only
  // How long the serving thread spins for work before it sleeps on `work`: it learns the
  // gaps between batches, so a steady stream of requests is caught spinning and an idle
  // or slow one costs no CPU. Serving thread only.
  os::AdaptiveSpin work_spin = os::AdaptiveSpin::lasting(kLongestSpin);
  uint16_t port = 0;

  // --- everything below under mu ---
  mutable std::mutex mu;
  std::condition_variable work;
  WorkNotifier notifier;  // a server of several transports asleep on another one
  uint64_t wakeups = 0;
  std::vector<RemoteSlot> slots;
  std::vector<uint32_t> free_slots;
  std::deque<uint32_t> ready;
  bool serving = false;
  bool stopped = false;  // the server was shut down: requests are answered with ClosedError
  bool stopped_before_open = false;  // for RemoteTransport::release_server()
  std::string stop_reason;
  std::unordered_map<uint32_t, std::shared_ptr<RemoteConnection>> conns;  // live ones
  // Connections waiting for a free slot with a request at hand, in the order they began to
  // wait: each freed slot is handed to the first (RemoteConnection::granted), so one that
  // merely runs first cannot take it. Many clients on few slots starved some for seconds.
  std::deque<uint32_t> starved;
  uint64_t refused = 0;
  std::string last_refusal;
  uint64_t taken_in = 0;  // looks of take_arrivals() that took in a request (or a failure)
  size_t connected = 0;

  // Under mu: gives a slot back: to the connection that has waited longest for one (woken),
  // else to free_slots.
  void free_slot(uint32_t i);
  // Who sends an answer: the connection's thread (handed over through its outbox), or the
  // calling serving thread itself when that connection's thread is not using its worker
  // (RemoteConnection::send_now). Never Caller from a connection's thread.
  enum class Sender { Connection, Caller };
  // Under mu: sends or queues an answer for the slot's connection, or frees the slot when
  // the connection is gone. A slot already answered (or free) is left alone.
  void answer(uint32_t slot, std::optional<Json> failure, Sender sender = Sender::Connection);
  // Counts a refused client and logs `why` as a warning (after letting go of mu).
  void refuse(const std::string& why);
  // A connection that could not make its end (a worker: descriptors, memory) refuses its
  // request, so its client hears at once (ucx::Listener::reject).
  void reject(ucx::ConnRequest& req) noexcept { listener_->reject(req); }
  // Serving thread, not under mu: takes in the requests that arrived on connections whose
  // thread waits for its client's next request (RemoteConnection::receive_now), with at most
  // kConnectionsTheServerReceivesFrom connections. Returns how many looks took something in
  // (the caller adds them to taken_in under mu, which it takes next anyway).
  uint64_t take_arrivals();

 private:
  void listen() noexcept;
  void reap(bool all);

  std::optional<ucx::Listener> listener_;
  std::thread listener_thread_;
  std::atomic<bool> stop_{false};
  std::vector<std::shared_ptr<RemoteConnection>> threads_;  // listener thread (and stop) only
  uint32_t next_conn_ = 1;
  std::once_flag stopped_once_;
  std::vector<std::shared_ptr<RemoteConnection>> arrivals_;  // take_arrivals() only
};

class RemoteConnection : public std::enable_shared_from_this<RemoteConnection> {
 public:
  RemoteConnection(RemoteServer& server, uint32_t id, ucx::ConnRequest request);
  ~RemoteConnection();  // join()
  void start();
  // Waits for the thread to end (detaches it when called on that thread).
  void join();
  // Asks the thread to end, telling the client `reason`; any thread.
  void stop(const std::string& reason);
  bool finished() const noexcept { return finished_.load(std::memory_order_acquire); }
  // Wakes the thread (an answer was queued, a slot freed); any thread, under server.mu.
  void wake() noexcept;
  // The serving thread's answer, posted from the calling thread when this connection's
  // thread is not using its worker (it is waiting): false when it is, and the answer goes
  // to the outbox instead. Under server.mu.
  bool send_now(Outgoing& o);
  // The serving thread's turn at receiving, while this connection's thread waits for its
  // client (or for a CPU after its wake-up): takes in the requests that arrived. Nothing when
  // the thread is using its worker. Not under server.mu. A failure is left for the thread,
  // which ends the connection with it.
  bool receive_now();  // true when it took in a request
  // Whether the serving thread should look (receive_now()) at `now_ns`: no answer is owed
  // (the client's next request is what may have come), the thread has not taken a turn for
  // kTurnOverdue, and the last look was not too recent. Under server.mu.
  bool overdue(int64_t now_ns) const noexcept;
  // After a look: the gap to the next one. Serving thread only.
  void looked(int64_t now_ns, bool found) noexcept;

  std::deque<Outgoing> outbox;    // under server.mu
  std::vector<uint32_t> granted;  // free slots handed to it while it starved; under server.mu
  size_t unanswered = 0;          // its requests made ready and not answered yet; under server.mu

 private:
  struct Receive;
  struct Send;
  void run() noexcept;
  void handshake();
  void serve(std::unique_lock<std::mutex>& io);
  void relock(std::unique_lock<std::mutex>& io);
  void take_requests();
  size_t complete_receives();  // how many completed
  void send_answers();
  // Posts `o`'s send (under io_mu_): true when it completed at once, for a slot.
  bool post(Outgoing& o);
  void complete_sends();
  void heartbeats();
  void release_slots() noexcept;

  RemoteServer& s_;
  const uint32_t id_;
  ucx::ConnRequest request_;
  const std::string peer_;  // "client <ip:port>", as messages name it
  std::unique_ptr<ucx::Worker> worker_;
  std::unique_ptr<ucx::Endpoint> ep_;
  // Guards the worker, the endpoint and the transfers. The connection's thread holds it
  // except while it waits, so the serving thread can post an answer itself (send_now())
  // instead of handing it over: a hand-over woke a sleeping thread, 35 us of a 92 us round
  // trip across two simulated hosts (docs/benchmarks.md). Taken before server.mu; the
  // serving thread, which holds server.mu, only ever tries it.
  std::mutex io_mu_;
  std::mutex wake_mu_;  // guards worker_ for wake() against its teardown
  // wake() rings the bell, which the thread's spin before a sleep watches, and signals the
  // worker only while the thread is asleep on its fd.
  os::WaitWord bell_;
  std::atomic<bool> asleep_{false};
  // The spin before a sleep, learning (work_spin above) the wait for an answer while the
  // client has requests at the server, and the client's pace otherwise: one budget for
  // both learnt the (short) answer and then missed the next request.
  os::AdaptiveSpin answer_spin_ = os::AdaptiveSpin::lasting(kLongestSpin);
  os::AdaptiveSpin request_spin_ = os::AdaptiveSpin::lasting(kLongestSpin);
  std::thread thread_;
  // stop(): ends the serve loop, and a handshake's waits within one slice.
  std::stop_source stop_;
  std::atomic<bool> finished_{false};
  std::string stop_reason_;            // under server.mu
  std::exception_ptr stolen_failure_;  // receive_now()'s failure, rethrown by serve(); under io_mu_
  std::atomic<int64_t> turn_ns_{0};    // when the thread last took a turn or looked
  int64_t next_look_ns_ = 0;           // the serving thread's, for overdue() and looked()
  int64_t look_gap_ns_ = 0;
  std::vector<std::unique_ptr<Receive>> receives_;
  std::vector<std::unique_ptr<Send>> sends_;
  ucx::Heartbeats heartbeats_;
  std::chrono::milliseconds period_{100};  // the longest sleep between two turns
};

// The server side one request at a time, for adapters whose own server batches
// (tensorwire.torchrl under torchrl's InferenceServer), as ShmAccess (shm_rows.h). A slot
// that is no longer Taken (answered already) is not answered again: a no-op.
struct RemoteAccess {
  static TensorDict request_row(const RemoteTransport& t, uint32_t slot);
  static void resolve_one(RemoteTransport& t, uint32_t slot, const TensorDict& response);
  static void reject_one(RemoteTransport& t, uint32_t slot, const RemoteError& error);
  // RemoteServer::taken_in, for tests.
  static uint64_t taken_in(const RemoteTransport& t);
};

// The handshake both sides of a remote transport run (wire/handshake.h).
wire::HandshakeConfig remote_handshake_config(const std::string& auth_key,
                                              std::chrono::milliseconds liveness_timeout);

}  // namespace tensorwire::inference::detail
