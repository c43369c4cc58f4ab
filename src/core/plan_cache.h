// PlanCache (private): the consolidation plan for a stream of dicts that mostly share one
// structure, as a sender sees them (the same keys, dtypes and shapes message after message).
//
// Building a plan builds tensordict's metadata JSON, which the sender then serialises and
// compares with the last one sent: about a third of the CPU of sending a 64 KiB dict. The
// cache keeps a flat record of the structure the last plan was made for; a dict that
// matches it (one walk, comparing names, dtypes, shapes, batch sizes, dim names, devices
// and lock states) gets the same plan back without any JSON. A dict with non-tensor
// entries is planned afresh every time (their values are part of the metadata).
//
// Not thread-safe: one per sending stream.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "tensorwire/core/consolidate.h"

namespace tensorwire {

class PlanCache {
 public:
  explicit PlanCache(ConsolidateOptions options = {}) : options_(options) {}

  // The plan for `td` (plan_consolidation's, with its errors): the previous one when `td`
  // has the structure that one was made for.
  const ConsolidatedPlan& plan(const TensorDict& td);
  // Names the plan plan() returns: changes whenever it makes a new one; never 0.
  uint64_t generation() const noexcept { return generation_; }

 private:
  struct Item {
    enum Kind : char {
      Dict,
      Tensor,
      Child
    } kind = Dict;  // Child: a sub-dict's name; its Dict follows
    std::string name;
    DType dtype{};
    Shape shape;  // a tensor's shape, a dict's batch size
    std::optional<Device> device;
    std::vector<std::optional<std::string>> names;
    bool locked = false;
    size_t size = 0;
  };
  // Whether `td` matches the record from items_[i] on; advances i past what it compared.
  bool matches(const TensorDict& td, size_t& i) const;
  // Records `td`'s structure; false when it cannot be cached (a non-tensor entry).
  bool record(const TensorDict& td);

  ConsolidateOptions options_;
  ConsolidatedPlan plan_;
  std::vector<Item> items_;  // the structure plan_ was made for; empty: none to reuse
  uint64_t generation_ = 0;
};

}  // namespace tensorwire
