// consolidate(): pack every leaf of a TensorDict into one storage, with metadata in the
// exact structure tensordict's consolidate() writes, so each side can read the other's.
//
// Layout: leaves depth-first in insertion order; each leaf starts at a multiple of
// `alignment` bytes from the start of the storage, the gap after it zero-filled. The
// metadata records, per leaf, [dtype, shape, start, stop, pad] where stop includes the
// padding (tensordict's convention).
#pragma once

#include "tensorwire/core/nesting.h"
#include "tensorwire/core/tensordict.h"

namespace tensorwire {

struct ConsolidateOptions {
  size_t alignment = 8;  // a power of two, at least 8; tensordict uses 8
  // Deepest nesting accepted (sub-dict levels, and list/dict levels of a non-tensor
  // value); more is a ValueError. Receivers accept wire::Limits::max_depth, by default
  // the same kMaxDepth: raise both together.
  uint32_t max_depth = kMaxDepth;
};

// Returns a locked TensorDict whose tensors are views into one new storage.
// A TensorDict that is already consolidated is returned as it is (tensordict does the same).
TensorDict consolidate(const TensorDict& td, const ConsolidateOptions& options = {});

// The metadata consolidate() would write, the storage size and each leaf's offset (in
// depth-first insertion order), computed without touching tensor data. Senders that pack
// into a reused staging buffer plan once per structure and pack() per message.
struct ConsolidatedPlan {
  Json metadata;
  size_t total_bytes = 0;
  std::vector<size_t> offsets;  // one per tensor leaf, traversal order
  std::vector<size_t> nbytes;   // each leaf's bytes, padding not included
};
ConsolidatedPlan plan_consolidation(const TensorDict& td, const ConsolidateOptions& options = {});

// Writes every leaf of `td` to dst + offset (padding zero-filled); `td` must have the
// structure the plan was made from and dst must hold plan.total_bytes.
void pack(const TensorDict& td, const ConsolidatedPlan& plan, std::byte* dst);

// True when `td` is the root of a consolidated storage and every sub-dict still belongs
// to it (nothing was unlocked and rearranged since): then the storage *is* the data and
// can be sent or saved as it is.
bool is_consolidated_root(const TensorDict& td) noexcept;

// Calls fn(const Tensor&) for every tensor leaf, depth-first in insertion order: the
// order of leaves in a consolidated storage and in a non-consolidated message.
template <class Fn>
void for_each_leaf(const TensorDict& td, Fn&& fn) {
  for (const auto& [name, e] : td.items()) {
    if (e.is_tensor())
      fn(e.tensor());
    else if (e.is_tensordict())
      for_each_leaf(e.tensordict(), fn);
  }
}

// Calls fn(const Tensor& leaf, size_t start, size_t end) for every tensor leaf of `td`, which
// must have the structure `plan` was made for: where the plan places the leaf, `end` past
// its padding. What pack() copies, and what a sender that gathers the leaves instead sends.
// A leaf the plan has no place for, or of another size than its place, is a ValueError
// before anything of it is copied (a dict of another structure read past the plan and
// wrote past the buffer); fewer leaves than the plan, one after the leaves were copied.
template <class Fn>
void for_each_placed_leaf(const TensorDict& td, const ConsolidatedPlan& plan, Fn&& fn) {
  size_t leaf = 0;
  for_each_leaf(td, [&](const Tensor& t) {
    if (leaf >= plan.offsets.size())
      throw ValueError("the TensorDict has more leaves than the plan it is packed by (" +
                       std::to_string(plan.offsets.size()) + "): it has another structure");
    const size_t start = plan.offsets[leaf++];
    const size_t end = leaf < plan.offsets.size() ? plan.offsets[leaf] : plan.total_bytes;
    if (t.nbytes() != plan.nbytes[leaf - 1])
      throw ValueError("leaf " + std::to_string(leaf - 1) + " has " + std::to_string(t.nbytes()) +
                       " bytes where its plan has " + std::to_string(plan.nbytes[leaf - 1]) +
                       ": the TensorDict has another structure than its plan");
    fn(t, start, end);
  });
  if (leaf != plan.offsets.size())
    throw ValueError("the TensorDict has " + std::to_string(leaf) +
                     " leaves where the plan it is " + "packed by has " +
                     std::to_string(plan.offsets.size()));
}

}  // namespace tensorwire
