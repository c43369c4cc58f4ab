// SlotLayout: where each leaf of a fixed-structure request (or response) lives in a bank
// of `num_slots` rows.
//
// Structure of arrays: each leaf has its own region holding the leaf for slot 0, slot 1,
// ... back to back, so rows [first, first + n) of a leaf are one contiguous block. A
// batch of contiguous slots is therefore a zero-copy, contiguous view of the bank, and
// writing a batch's responses back is one copy per leaf. Regions start at 64-byte
// boundaries.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/inference/client.h"

namespace tensorwire::inference::detail {

struct LeafSlot {
  Key key;
  DType dtype;
  Shape shape;       // one request's leaf shape (the spec's batch dims included)
  size_t row_bytes;  // bytes of one request's leaf
  size_t offset;     // where the leaf's region starts in the bank
};

class SlotLayout {
 public:
  SlotLayout() = default;
  // Validates the spec: TypeError for a non-tensor value, ValueError for no tensor leaf or
  // a leaf not on the CPU. `what` names the spec in messages ("request_spec").
  static SlotLayout from_spec(const TensorDict& spec, uint32_t num_slots, const char* what);

  const std::vector<LeafSlot>& leaves() const noexcept { return leaves_; }
  size_t bank_bytes() const noexcept { return bank_bytes_; }
  uint32_t num_slots() const noexcept { return num_slots_; }
  const TensorDict& spec() const noexcept { return spec_; }
  std::vector<Key> keys() const;
  std::vector<RequestLeaf> request_leaves() const;  // key, dtype and shape of each leaf
  // Index of the leaf with this key, or -1.
  int find(const Key& key) const noexcept;

  // Rows [first, first + n) of the bank held by `bank` (a storage over the whole bank):
  // leaves of shape [n, *leaf shape], batch size [n, *spec batch]. Zero-copy.
  TensorDict rows(const Storage& bank, size_t first, int64_t n) const;
  // One row without the batch dimension (a single request's or response's view).
  TensorDict row(const Storage& bank, size_t slot) const;
  // A copy of one row in fresh memory (one allocation for all leaves).
  TensorDict copy_row(const std::byte* bank, size_t slot) const;

  // The spec's structure rebuilt around leaf tensors: leaf(i) for the i-th leaf, batch
  // sizes prefixed with `prefix`.
  template <class LeafFn>
  TensorDict build(const Shape& prefix, LeafFn&& leaf) const {
    size_t next = 0;
    return build_level(spec_, prefix, [&]() { return leaf(next++); });
  }

 private:
  template <class NextLeaf>
  static TensorDict build_level(const TensorDict& level, const Shape& prefix, NextLeaf&& next) {
    Shape batch = prefix;
    batch.insert(batch.end(), level.batch_size().begin(), level.batch_size().end());
    TensorDict out(batch, level.device());
    for (const auto& [name, e] : level.items()) {
      if (e.is_tensor())
        out.set(name, next());
      else
        out.set(name, build_level(e.tensordict(), prefix, next));
    }
    return out;
  }

  TensorDict spec_;  // structure only: used to rebuild nesting and batch sizes
  std::vector<LeafSlot> leaves_;
  size_t bank_bytes_ = 0;
  uint32_t num_slots_ = 0;
};

}  // namespace tensorwire::inference::detail
