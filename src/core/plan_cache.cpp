#include "core/plan_cache.h"

namespace tensorwire {

const ConsolidatedPlan& PlanCache::plan(const TensorDict& td) {
  size_t i = 0;
  if (matches(td, i) && i == items_.size()) return plan_;
  // Planned first: a dict plan_consolidation refuses leaves the cache as it was.
  plan_ = plan_consolidation(td, options_);
  ++generation_;
  items_.clear();
  if (!record(td)) items_.clear();
  return plan_;
}

// Recursion depth: at most one level past the recorded structure, which passed max_depth.
bool PlanCache::matches(const TensorDict& td, size_t& i) const {
  if (i >= items_.size()) return false;
  const Item& node = items_[i++];
  if (node.kind != Item::Dict || node.size != td.size() || node.shape != td.batch_size() ||
      node.device != td.device() || node.names != td.names() || node.locked != td.is_locked())
    return false;
  for (const auto& [name, e] : td.items()) {
    if (i >= items_.size()) return false;
    const Item& item = items_[i++];
    if (item.name != name) return false;
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      if (item.kind != Item::Tensor || item.dtype != t.dtype() || item.shape != t.shape() ||
          !t.device().is_cpu())
        return false;
    } else if (!e.is_tensordict() || item.kind != Item::Child || !matches(e.tensordict(), i)) {
      return false;
    }
  }
  return true;
}

bool PlanCache::record(const TensorDict& td) {
  items_.push_back({.kind = Item::Dict,
                    .shape = td.batch_size(),
                    .device = td.device(),
                    .names = td.names(),
                    .locked = td.is_locked(),
                    .size = td.size()});
  for (const auto& [name, e] : td.items()) {
    if (e.is_tensor()) {
      items_.push_back({.kind = Item::Tensor,
                        .name = name,
                        .dtype = e.tensor().dtype(),
                        .shape = e.tensor().shape()});
    } else if (e.is_tensordict()) {
      items_.push_back({.kind = Item::Child, .name = name});
      if (!record(e.tensordict())) return false;
    } else {
      return false;
    }
  }
  return true;
}

}  // namespace tensorwire
