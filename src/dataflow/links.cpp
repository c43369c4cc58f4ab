#include "dataflow/links.h"

#include "os/fork.h"
#include "runtime/wait.h"

#include <unistd.h>

#include <new>
#include <thread>
#include <tuple>

namespace tensorwire::dataflow::detail {

// ---- MainLink ----------------------------------------------------------------------------

void MainLink::make_sockets(int n) {
  owner_pid = ::getpid();
  owner_generation = os::fork_generation();
  num_workers = n;
  generation.assign(static_cast<size_t>(n), 0);
  slot.assign(static_cast<size_t>(n), 0);
  parent_ends.resize(static_cast<size_t>(n * kSlots));
  child_ends.resize(parent_ends.size());
  for (int i = 0; i < n; ++i)
    std::tie(parent_ends[static_cast<size_t>(i)], child_ends[static_cast<size_t>(i)]) =
        os::UnixSocket::pair();
  sent_ = shm::Segment::create("dataflow-sent", sizeof(std::atomic<uint64_t>) * parent_ends.size());
  for (size_t s = 0; s < parent_ends.size(); ++s)
    new (sent_.data() + s * sizeof(std::atomic<uint64_t>)) std::atomic<uint64_t>(0);
  received_.assign(parent_ends.size(), 0);
  draining_since_.assign(parent_ends.size(), 0);
}

std::atomic<uint64_t>* MainLink::sent_count(uint16_t sender) const {
  return std::launder(reinterpret_cast<std::atomic<uint64_t>*>(
      sent_.data() + sender * sizeof(std::atomic<uint64_t>)));
}

uint16_t MainLink::next_generation(int index) {
  const uint16_t dead = sender_of(index);
  const auto i = static_cast<size_t>(index);
  // The next id of this worker (in turn) whose last owner's descriptors have all been read
  // (0), else the one that has drained longest (the lowest death number; see links.h).
  auto since = [&](int s) { return draining_since_[static_cast<size_t>(index + num_workers * s)]; };
  int next = (slot[i] + 1) % kSlots;
  for (int k = 2; k < kSlots && since(next) != 0; ++k)
    if (since((slot[i] + k) % kSlots) < since(next)) next = (slot[i] + k) % kSlots;
  ++generation[i];
  slot[i] = next;
  const uint16_t sender = sender_of(index);
  if (receiver) receiver->forget(sender);
  std::tie(parent_ends[sender], child_ends[sender]) = os::UnixSocket::pair();
  // The new worker counts from zero; what the dead one sent is final now.
  sent_count(sender)->store(0, std::memory_order_relaxed);
  received_[sender] = 0;
  draining_since_[sender] = 0;
  draining_since_[dead] = ++deaths_;
  retire_if_drained(dead);
  return sender;
}

void MainLink::count_received(uint16_t sender) {
  if (!valid_sender(sender)) return;  // the caller refuses it
  ++received_[sender];
  if (draining_since_[sender] != 0) retire_if_drained(sender);
}

void MainLink::retire_if_drained(uint16_t sender) {
  if (draining_since_[sender] == 0 ||
      received_[sender] < sent_count(sender)->load(std::memory_order_acquire))
    return;
  draining_since_[sender] = 0;
  // Datapoints already handed out keep their own mappings (shm::Segment::storage).
  if (receiver) receiver->forget(sender);
  parent_ends[sender].close();
}

bool MainLink::await_death(int index) {
  const uint32_t was = generation[static_cast<size_t>(index)];
  for (int i = 0; i < 200; ++i) {
    check_workers();
    if (generation[static_cast<size_t>(index)] != was) return true;
    std::this_thread::sleep_for(Millis(5));
  }
  return false;
}

void MainLink::check_workers() {
  if (watchdog) watchdog();
  while (auto d = workers.reap_dead()) {
    if (!on_death) throw workers.died(*d);
    on_death(*d);
  }
}

os::UnixSocket MainLink::take_child_end(uint16_t sender) {
  os::UnixSocket mine = std::move(child_ends.at(sender));
  forget_in_child();
  return mine;
}

void MainLink::forget_in_child() noexcept {
  parent_ends.clear();
  child_ends.clear();
  workers.forget_in_child();
}

void MainLink::open(const std::string& endpoint) {
  for (auto& c : child_ends) c.close();  // the children have theirs; EOF on ours: "worker gone"
  ctx = std::make_unique<zmqio::Context>();
  // The runner's own credits bound what is in flight; the ZeroMQ queue is never the limit.
  pull = std::make_unique<zmqio::Socket>(*ctx, zmq::socket_type::pull,
                                         zmqio::SocketOptions{.rcvhwm = 0});
  pull->bind(endpoint);
  receiver = std::make_unique<ShmReceiver>(
      [this](uint16_t sender, uint32_t index) { return fetch_segment(sender, index); });
  next_check = std::chrono::steady_clock::now() + liveness;
}

shm::Segment MainLink::fetch_segment(uint16_t sender, uint32_t index) {
  if (!valid_sender(sender) || !parent_ends[sender].valid())
    throw ProtocolError(owner + ": descriptor from unknown sender " + std::to_string(sender));
  std::optional<std::pair<uint32_t, shm::Segment>> m;
  // Interruptible, and bounded: the worker sends the segment before naming it.
  const bool got =
      runtime::wait_until(Deadline::after(std::chrono::seconds(10)), [&](Deadline slice) {
        try {
          m = recv_segment(parent_ends[sender], Millis(slice.poll_ms()));
        } catch (const ClosedError&) {
          await_death(index_of(sender));  // the worker is gone: say so
          throw;
        }
        if (!m) check_workers();
        return m.has_value();
      });
  if (!got)
    throw TimeoutError(owner + ": worker " + std::to_string(sender) + " named segment " +
                       std::to_string(index) + " but did not send it");
  if (m->first != index)
    throw ProtocolError(owner + ": worker " + std::to_string(sender) + " sent segment " +
                        std::to_string(m->first) + " where " + std::to_string(index) +
                        " was expected");
  return std::move(m->second);
}

std::optional<ShmReceiver::Received> MainLink::receive(Deadline deadline) {
  if (!pull) throw ClosedError(owner + " is closed");
  using clock = std::chrono::steady_clock;
  std::optional<ShmReceiver::Received> out;
  std::vector<zmqio::PollItem> items;
  runtime::wait_until(deadline, [&](Deadline slice) {
    while (true) {
      if (gate.closing()) throw ClosedError(owner + " is closed");
      const auto now = clock::now();
      // Checked on a clock, not per message: a pidfd poll per datapoint would cost a syscall.
      if (now >= next_check) {
        check_workers();
        next_check = now + liveness;
      }
      if (rest_.empty()) {
        bool more = false;
        if (pull->try_recv_frame(msg_, more)) {
          if (more) {
            std::vector<zmq::message_t> extra;
            pull->try_recv(extra);
            throw ProtocolError(owner + ": a descriptor message of several frames");
          }
          rest_ = std::span(static_cast<const std::byte*>(msg_.data()), msg_.size());
        }
      }
      if (!rest_.empty()) {
        DescriptorBatch batch(rest_);
        std::span<const std::byte> d;
        try {
          d = batch.next();
        } catch (...) {
          rest_ = {};
          throw;
        }
        rest_ = rest_.subspan(4 + d.size());
        out = receiver->decode(d);
        count_received(out->header.sender);
        return true;
      }
      if (slice.passed()) return false;
      const int left = slice.poll_ms();
      const Millis wait = left < 0 ? liveness : std::min(liveness, Millis(left));
      items.clear();
      items.push_back({pull.get(), -1, false});
      for (int fd : workers.pidfds()) items.push_back({nullptr, fd, false});
      zmqio::poll(items, wait);
      for (size_t i = 1; i < items.size(); ++i)
        if (items[i].ready) next_check = clock::time_point{};  // a worker ended: report it now
    }
  });
  return out;
}

void MainLink::close() noexcept {
  if (owner_pid != ::getpid()) return;  // a forked copy: nothing here is ours to close
  workers.kill_all();
  pull.reset();
  ctx.reset();
  parent_ends.clear();
  child_ends.clear();
  // The receiver's segments stay mapped as long as received datapoints view them.
  receiver.reset();
}

// ---- WorkerLink --------------------------------------------------------------------------

WorkerLink::WorkerLink(int index_, std::atomic<uint64_t>* sent_count_, os::UnixSocket socket_,
                       const std::string& endpoint, int sndhwm, size_t min_chunks)
    : index(index_),
      socket(std::move(socket_)),
      push(ctx, zmq::socket_type::push, zmqio::SocketOptions{.sndhwm = sndhwm}),
      sender("dataflow-w" + std::to_string(index_), min_chunks,
             [this](uint32_t i, const shm::Segment& s) { send_segment(socket, i, s); }),
      sent_count(sent_count_) {
  push.connect(endpoint);
}

namespace {

void put_u32(std::string& out, uint32_t v) {
  const char b[4] = {static_cast<char>(v), static_cast<char>(v >> 8), static_cast<char>(v >> 16),
                     static_cast<char>(v >> 24)};
  out.append(b, 4);
}

}  // namespace

std::span<const std::byte> DescriptorBatch::next() {
  if (rest_.empty()) return {};
  if (rest_.size() < 4) throw ProtocolError("descriptor batch: truncated length");
  const uint32_t n =
      std::to_integer<uint32_t>(rest_[0]) | std::to_integer<uint32_t>(rest_[1]) << 8 |
      std::to_integer<uint32_t>(rest_[2]) << 16 | std::to_integer<uint32_t>(rest_[3]) << 24;
  if (n == 0 || n > rest_.size() - 4)
    throw ProtocolError("descriptor batch: a descriptor of " + std::to_string(n) + " bytes in " +
                        std::to_string(rest_.size() - 4));
  auto d = rest_.subspan(4, n);
  rest_ = rest_.subspan(4 + n);
  return d;
}

void WorkerLink::add(std::string_view descriptor) {
  std::lock_guard lock(mu_);
  add_locked(descriptor);
}

void WorkerLink::add_locked(std::string_view descriptor) {
  if (batched_.load(std::memory_order_relaxed) == 0)
    batch_start_ = std::chrono::steady_clock::now();
  put_u32(batch_, static_cast<uint32_t>(descriptor.size()));
  batch_.append(descriptor);
  batched_.fetch_add(1, std::memory_order_relaxed);
}

void WorkerLink::flush() {
  std::lock_guard lock(mu_);
  flush_locked();
}

void WorkerLink::flush_locked() {
  if (batched_.load(std::memory_order_relaxed) == 0) return;
  zmq::message_t m(batch_.data(), batch_.size());
  // Counted first: a count short of what went out would let the main process drop this
  // sender's segments while a descriptor naming them is still on its way (MainLink).
  const uint64_t n = batched_.load(std::memory_order_relaxed);
  sent_count->fetch_add(n, std::memory_order_release);
  try {
    while (!push.send(m, Millis(200)))
      if (parent_gone()) ::_exit(0);
  } catch (...) {
    sent_count->fetch_sub(n, std::memory_order_release);
    // Not sent: give the chunks back (the caller reports the error).
    DescriptorBatch b(std::as_bytes(std::span(batch_)));
    for (auto d = b.next(); !d.empty(); d = b.next())
      if (DescriptorHeader::decode(d).kind == DescriptorKind::Datapoint)
        sender.abandon(d, peer_schema);
    batch_.clear();
    batched_.store(0, std::memory_order_relaxed);
    throw;
  }
  batch_.clear();
  batched_.store(0, std::memory_order_relaxed);
}

void WorkerLink::start_flusher(std::chrono::microseconds max_delay) {
  std::thread([this, max_delay] {
    while (!parent_gone()) {
      std::this_thread::sleep_for(max_delay / 2);
      if (batched_.load(std::memory_order_relaxed) == 0) continue;
      std::lock_guard lock(mu_);
      if (batched_.load(std::memory_order_relaxed) == 0 ||
          std::chrono::steady_clock::now() - batch_start_ < max_delay)
        continue;
      try {
        flush_locked();
      } catch (...) {
        // The worker's own next flush meets the same error and reports it.
      }
    }
  }).detach();  // the worker process never returns: it ends with _exit()
}

void WorkerLink::add_datapoint(const TensorDict& td, DescriptorHeader h) {
  h.sender = static_cast<uint16_t>(index);
  std::lock_guard lock(mu_);
  scratch.clear();
  sender.encode(td, h, scratch, peer_schema);
  add_locked(scratch);
}

void WorkerLink::send_failure(const Failure& f, DescriptorHeader h) {
  h.sender = static_cast<uint16_t>(index);
  h.kind = DescriptorKind::Error;
  h.segment = kNoSegment;
  std::lock_guard lock(mu_);
  scratch.clear();
  h.encode(scratch);
  scratch += encode_failure(f);
  add_locked(scratch);
  flush_locked();
}

void WorkerLink::park() {
  while (!parent_gone()) std::this_thread::sleep_for(Millis(50));
  ::_exit(0);
}

}  // namespace tensorwire::dataflow::detail
