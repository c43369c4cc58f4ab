#include "dataflow/producers.h"

#include <algorithm>

namespace tensorwire::dataflow {

namespace {
// Closed connections kept in the table (those that sent datapoints, for producers() and the
// silence report); older ones are forgotten so that reconnecting producers do not grow it.
constexpr size_t kClosedKept = 64;
}  // namespace

ProducerTable::Entry* ProducerTable::find(int socket, int fd, bool only_connected) {
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it)
    if (it->info.socket == socket && it->fd == fd)
      return only_connected && !it->info.connected ? nullptr : &*it;
  return nullptr;
}

void ProducerTable::connected(int socket, int fd, std::string address) {
  // A new connection on an fd number still listed: the old one closed, its event unseen.
  if (find(socket, fd, true) != nullptr) disconnected(socket, fd);
  Entry e;
  e.info.address = std::move(address);
  e.info.socket = socket;
  e.info.connected = true;
  e.fd = fd;
  entries_.push_back(std::move(e));
}

void ProducerTable::disconnected(int socket, int fd) {
  Entry* e = find(socket, fd, true);
  if (e == nullptr) return;
  e->info.connected = false;
  forget_closed();
}

void ProducerTable::forget_closed() {
  // A closed connection stays while its last messages may still be queued (they are
  // counted to it); beyond kClosedKept, those that never sent go first (a port scanner, a
  // producer that had nothing to send), then the oldest.
  auto closed = [](const Entry& e) { return !e.info.connected; };
  if (static_cast<size_t>(std::count_if(entries_.begin(), entries_.end(), closed)) <= kClosedKept)
    return;
  std::erase_if(entries_,
                [](const Entry& e) { return !e.info.connected && e.info.datapoints == 0; });
  size_t n = std::count_if(entries_.begin(), entries_.end(), closed);
  for (auto it = entries_.begin(); n > kClosedKept && it != entries_.end();) {
    if (closed(*it)) {
      it = entries_.erase(it);
      --n;
    } else {
      ++it;
    }
  }
}

void ProducerTable::pause(Clock::duration gap) {
  for (Entry& e : entries_)
    if (e.info.datapoints > 0) e.heard += gap;
}

std::optional<ProducerTable::Silent> ProducerTable::silent(Clock::time_point now,
                                                           std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0) return std::nullopt;
  // Fair queueing serves each connection with a datapoint queued at least once a round.
  const auto open = static_cast<uint64_t>(std::count_if(
      entries_.begin(), entries_.end(), [](const Entry& e) { return e.info.connected; }));
  // Margin: a connection whose queue ran dry waits for the socket to process its commands
  // (remote.cpp, check_silence(): at each check, else every 100 receive calls, 3 frames each).
  const uint64_t rounds = 4 * open + 40;
  for (Entry& e : entries_) {
    if (e.info.datapoints == 0 || e.reported) continue;
    const auto since = now - *e.info.last_datapoint;
    const bool by_time = now - e.heard > timeout;
    const bool by_reads = since > timeout && read_ - e.read_at_heard > rounds;
    if (!by_time && !by_reads) continue;
    e.reported = true;
    return Silent{e.info, by_time ? now - e.heard : since};
  }
  return std::nullopt;
}

std::vector<ProducerInfo> ProducerTable::list() const {
  std::vector<ProducerInfo> out;
  out.reserve(entries_.size());
  for (const Entry& e : entries_)
    if (e.info.connected || e.info.datapoints > 0) out.push_back(e.info);
  return out;
}

}  // namespace tensorwire::dataflow
