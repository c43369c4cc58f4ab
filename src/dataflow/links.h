// The two sides of a runner's pipe, shared by MultiProcessRunnerZMQ and
// MultiProcessMapDataZMQ.
//
// MainLink (the main process): the worker processes, a Unix socket pair per worker for
// segments, the PULL socket the workers push descriptors into, and the ShmReceiver that
// turns them into TensorDicts. receive() waits for the next descriptor while watching
// every worker's pidfd, so a dead worker ends any wait within `liveness`: it throws
// WorkerDiedError, or hands the death to `on_death` when one is set (a restart).
//
// Senders: a replaced worker gets a new sender id (its index + num_workers x slot, one of
// kSlots), with its own socket pair and receiver state, so that descriptors of the dead
// one still queued in ZeroMQ are read against the dead one's segments, never the new one's.
// The new id is one whose last owner's descriptors have all been read (below), so a quick
// run of deaths behind a slow consumer never hands a new worker an id that descriptors
// still in the queue name (they were decoded against its segments: a ProtocolError, or
// another datapoint's bytes). Only when every other id of the worker still drains does the
// one that has drained longest come back: one kept by a descriptor lost with its worker.
//
// A dead sender's segments are let go of as soon as its last descriptor has been read:
// each worker counts the descriptors it hands to ZeroMQ in a shared counter per sender id
// (made before the first fork, so every worker and the fork server map it), and the main
// process counts those it reads. Once a dead sender's two counts meet, nothing more of it
// can come. A descriptor the dead worker counted but ZeroMQ never sent (it died with the
// message in its own queue) keeps its segments mapped until the id is taken again.
//
// WorkerLink (a worker): its own ZeroMQ context (created after the fork), the PUSH
// socket, and an ShmSender whose new segments go to the main process over the worker's
// Unix socket before any descriptor names them. Descriptors are batched: one ZeroMQ
// message carries one or more (the caller decides when to flush), which divides the
// per-message costs of ZeroMQ (two I/O threads, wake-ups) among small datapoints. Every
// wait checks that the parent is still there and exits the worker when it is not.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "dataflow/consumer_gate.h"
#include "dataflow/shm_channel.h"
#include "dataflow/workers.h"
#include "tensorwire/runtime/timeout.h"
#include "zmq/zmq.h"

namespace tensorwire::dataflow::detail {

using Millis = std::chrono::milliseconds;

struct MainLink {
  // Sender ids per worker: num_proc <= 1024 keeps every id within 16 bits.
  static constexpr int kSlots = 16;

  explicit MainLink(std::string owner_name, Millis liveness_interval)
      : owner(std::move(owner_name)), workers(owner), liveness(liveness_interval) {}
  ~MainLink() { close(); }

  // Before forking: one socket pair per worker (`child_ends` go to the children).
  void make_sockets(int num_workers);
  // Before forking a replacement of worker `index`: its next sender id, with a new socket
  // pair, the receiver's state of that id forgotten. Returns the id.
  uint16_t next_generation(int index);
  uint16_t sender_of(int index) const {
    return static_cast<uint16_t>(index + num_workers * slot[static_cast<size_t>(index)]);
  }
  int index_of(uint16_t sender) const { return sender % num_workers; }
  bool is_current(uint16_t sender) const { return sender_of(index_of(sender)) == sender; }
  bool valid_sender(uint16_t sender) const { return sender < parent_ends.size(); }
  // Where the worker of `sender` counts the descriptors it sends (see above).
  std::atomic<uint64_t>* sent_count(uint16_t sender) const;
  // In a child, before anything else: drops what belongs to the parent and returns the
  // child's own end of its socket pair.
  os::UnixSocket take_child_end(uint16_t sender);
  // In a child (the fork server): drops what belongs to the parent.
  void forget_in_child() noexcept;
  // After forking: the ZeroMQ context, the PULL socket bound to `endpoint`, the receiver.
  void open(const std::string& endpoint);

  // The next descriptor (decoded), std::nullopt after `timeout` (negative: no limit).
  // WorkerDiedError when a worker has ended; ProtocolError for a bad descriptor.
  std::optional<ShmReceiver::Received> receive(Deadline deadline);
  // Runs the watchdog, then hands each ended worker to on_death (or throws WorkerDiedError).
  void check_workers();
  // A socket of worker `index` was found closed: its fds close a moment before its pidfd
  // reports the death, so this checks the workers for up to a second. Throws
  // WorkerDiedError, or returns true once on_death replaced the worker; false: it did not
  // end meanwhile.
  bool await_death(int index);

  void close() noexcept;

  std::string owner;
  WorkerProcesses workers;
  Millis liveness;
  int num_workers = 0;
  std::vector<uint32_t> generation;                     // per worker index
  std::vector<int> slot;                                // per worker index: its sender id's
  std::vector<os::UnixSocket> parent_ends, child_ends;  // per sender id
  std::function<void(const WorkerProcesses::Death&)> on_death;
  std::function<void()> watchdog;  // at each liveness check (kills stuck workers)
  std::unique_ptr<zmqio::Context> ctx;
  std::unique_ptr<zmqio::Socket> pull;
  std::unique_ptr<ShmReceiver> receiver;
  std::chrono::steady_clock::time_point next_check{};
  int owner_pid = -1;
  // os::fork_generation() of that process: what the consumer's calls compare (a load; a
  // getpid() is a system call, and cost the C++ dataflow benchmark 15% per call).
  uint64_t owner_generation = 0;
  // The consumer's call and close() from another thread: receive() throws ClosedError at
  // its next look (within `liveness`) once close() began.
  ConsumerGate gate;

 private:
  shm::Segment fetch_segment(uint16_t sender, uint32_t index);
  // Counts a descriptor read from `sender`; a dead sender whose last one this was is let go.
  void count_received(uint16_t sender);
  // A dead sender all of whose descriptors were read: its segments and socket let go of.
  void retire_if_drained(uint16_t sender);
  shm::Segment sent_;               // std::atomic<uint64_t> per sender id, shared
  std::vector<uint64_t> received_;  // per sender id
  // Per sender id: 0, or the id's owner is dead with descriptors still to come, and this
  // is the number of the death (deaths_ then), so the longest draining has the lowest.
  std::vector<uint64_t> draining_since_;
  uint64_t deaths_ = 0;
  zmq::message_t msg_;               // the message being read
  std::span<const std::byte> rest_;  // its descriptors not read yet
};

struct WorkerLink {
  // `min_chunks`: see ShmSender. Connects a PUSH socket to `endpoint`. `sent_count`:
  // MainLink::sent_count(index), counted before each message goes to ZeroMQ.
  WorkerLink(int index, std::atomic<uint64_t>* sent_count, os::UnixSocket socket,
             const std::string& endpoint, int sndhwm, size_t min_chunks);

  // Encodes `td` into shared memory and adds its descriptor to the batch (not sent yet).
  void add_datapoint(const TensorDict& td, DescriptorHeader h);
  // Adds a descriptor to the batch.
  void add(std::string_view descriptor);
  // Sends the batch as one ZeroMQ message, waiting (with parent checks) for room. Exits
  // the process when the parent is gone.
  void flush();
  size_t batched() const noexcept { return batched_.load(std::memory_order_relaxed); }
  // Starts a thread that sends a batch whose oldest descriptor has waited `max_delay`: the
  // caller's own policy cannot, while it is inside a dataflow's next() that blocks (a
  // burst of fast datapoints, then a wait for data). Only for callers that batch.
  void start_flusher(std::chrono::microseconds max_delay);

  void send_datapoint(const TensorDict& td, DescriptorHeader h) {
    add_datapoint(td, h);
    flush();
  }
  void send_failure(const Failure& f, DescriptorHeader h);
  // Waits until the parent is gone, then exits: a worker that reported a failure stays
  // until it is killed, so its report is delivered and never races its death.
  [[noreturn]] void park();

  int index;
  os::UnixSocket socket;
  zmqio::Context ctx;
  zmqio::Socket push;
  ShmSender sender;
  uint64_t peer_schema = 0;  // the last schema the main process got
  std::string scratch;
  std::atomic<uint64_t>* sent_count;

 private:
  void add_locked(std::string_view descriptor);
  void flush_locked();

  // The batch, the sender and the socket are shared with the flusher thread.
  std::mutex mu_;
  std::string batch_;  // [u32 length][descriptor] ...
  std::atomic<size_t> batched_{0};
  std::chrono::steady_clock::time_point batch_start_{};
};

// The descriptors of one message: [u32 length][descriptor] repeated.
class DescriptorBatch {
 public:
  explicit DescriptorBatch(std::span<const std::byte> message) : rest_(message) {}
  // The next descriptor; empty at the end. ProtocolError for a truncated message.
  std::span<const std::byte> next();

 private:
  std::span<const std::byte> rest_;
};

}  // namespace tensorwire::dataflow::detail
