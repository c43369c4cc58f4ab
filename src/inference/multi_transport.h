// MultiTransport (private): several transports served by one InferenceServer as one.
//
// Each drain takes from every transport, fairly (a share of the batch each, the rest to
// whoever has more, the starting transport rotating), so neither local nor remote actors
// starve. Groups of equal structure from different transports are concatenated into one
// policy input (one policy call per batch); each answer goes back through its own
// transport, from a view of its rows of the output. The server's batching timeout applies
// to all: the wait rotates over the transports in short slices (there is no one fd to sleep
// on for a futex, a condition variable and a socket), which costs a wake-up per slice while
// idle.
#pragma once

#include <memory>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference::detail {

class MultiTransport final : public Transport {
 public:
  // ValueError for no transport, a null one, or one given twice.
  explicit MultiTransport(std::vector<std::shared_ptr<Transport>> parts);

  const char* kind() const noexcept override { return "multi"; }
  Client client() override;  // the first transport's
  const std::vector<std::shared_ptr<Transport>>& parts() const noexcept { return parts_; }

  void open_server() override;
  void close_server(const std::string& reason, bool fail_pending) override;
  void wait_for_work(Deadline deadline) override;
  void interrupt() override;
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
  std::vector<std::shared_ptr<Transport>> parts_;
  std::vector<Drained> sub_;                     // what each part drained this batch
  std::vector<std::vector<Group>> part_groups_;  // each part's groups
  std::vector<Where> where_;                     // by position in the server's Drained
  std::vector<std::vector<Piece>> pieces_;       // by merged group
  std::vector<bool> answered_;
  const Group* groups_ = nullptr;  // the server's groups vector, to index resolve()'s group
  size_t next_ = 0;                // the part that drains first next time
};

}  // namespace tensorwire::inference::detail
