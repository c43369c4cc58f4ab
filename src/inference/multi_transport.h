// MultiTransport (private): several transports served by one InferenceServer as one.
//
// Each drain takes from every transport, fairly (a share of the batch each, the rest to
// whoever has more, the starting transport rotating), so neither local nor remote actors
// starve (what it does not do by default is wait for a transport whose requests come
// slower: see `min_share`). Groups of equal structure from different transports are concatenated
// into one policy input (one policy call per batch); each answer goes back through its own
// transport, from a view of its rows of the output. The server's batching timeout applies
// to all. A wait returns at once when any transport has work; otherwise the server sleeps on
// a transport whose requests other processes make ready (shared memory: there is no one fd
// to sleep on for a futex, a condition variable and a socket), and each of the others wakes
// it (interrupt()) as a request becomes ready there (Transport::notify_work). The sleep is
// cut in short slices (rotating when several transports are slept on), which bounds what a
// wake-up that races the check for work can cost, at a wake-up per slice while idle.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference::detail {

class MultiTransport final : public Transport {
 public:
  // ValueError for no transport, a null one, or one given twice. `min_share` and
  // `max_wait`: ServerOptions::min_transport_share and its timeout.
  explicit MultiTransport(std::vector<std::shared_ptr<Transport>> parts, double min_share = 0,
                          std::chrono::nanoseconds max_wait = std::chrono::milliseconds(10));

  const char* kind() const noexcept override { return "multi"; }
  Client client() override;  // the first transport's
  const std::vector<std::shared_ptr<Transport>>& parts() const noexcept { return parts_; }

  void open_server() override;
  void close_server(const std::string& reason, bool fail_pending) override;
  void release_server() noexcept override;
  void wait_for_work(Deadline deadline) override;
  void interrupt() override;
  bool has_work() override;
  bool notify_work(std::function<void()> on_work) override;
  void drain(size_t max_items, Drained& out) override;
  void collate(const Drained& drained, std::vector<Group>& groups) override;
  void resolve(const Drained& drained, const Group& group, const TensorDict& output,
               const VersionStamp& stamp) override;
  void reject(const Drained& drained, std::span<const size_t> rows,
              const RemoteError& error) override;

 private:
  struct Where {
    size_t part, pos;  // the request is sub_[part] at pos
  };
  struct Piece {
    size_t part, group;  // part_groups_[part][group]
    int64_t offset, n;   // its rows in the merged input
  };
  using Clock = std::chrono::steady_clock;
  // How each part has been served lately (serving thread only).
  struct Pace {
    double recent = 0;                      // requests taken, decayed by each drain that took any
    std::optional<Clock::time_point> last;  // the last drain that took from it
    std::chrono::nanoseconds gap{0};  // its usual interval between such drains (a moving mean)
  };
  // A part whose actors are asking but that is below its share and took nothing in this
  // drain (got_), if any: the one furthest below.
  std::optional<size_t> lagging(Clock::time_point now) const;
  // Adds this drain's got_ to each part's Pace.
  void account(Clock::time_point now);

  std::vector<std::shared_ptr<Transport>> parts_;
  double min_share_;
  std::chrono::nanoseconds max_wait_;
  std::vector<Pace> pace_;
  std::vector<size_t> got_;                           // by part: what the drain in progress took
  std::atomic<uint64_t> interrupts_{0};               // interrupt() calls: each ends a share's wait
  std::vector<std::shared_ptr<Transport>> sleep_on_;  // the parts that cannot notify_work
  size_t turn_ = 0;                                   // which of them the next wait is on
  std::vector<Drained> sub_;                          // what each part drained this batch
  std::vector<std::vector<Group>> part_groups_;       // each part's groups
  std::vector<Where> where_;                          // by position in the server's Drained
  std::vector<std::vector<Piece>> pieces_;            // by merged group
  std::vector<bool> answered_;
  const Group* groups_ = nullptr;  // the server's groups vector, to index resolve()'s group
  size_t next_ = 0;                // the part that drains first next time
};

}  // namespace tensorwire::inference::detail
