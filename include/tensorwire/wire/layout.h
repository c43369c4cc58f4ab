// ConsolidatedLayout: tensordict-compatible consolidate() metadata, parsed and fully
// validated against a storage size, ready to turn a storage into a TensorDict of views.
//
// This is where metadata from files and from the wire is checked: every dtype, shape,
// offset and nesting level, before any storage is allocated or written.
#pragma once

#include <memory>
#include <optional>

#include "tensorwire/core/tensordict.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire::wire {

class ConsolidatedLayout {
 public:
  // Throws ProtocolError naming the offending key path, field and rule. When
  // `storage_bytes` is given, every leaf must end within it.
  static ConsolidatedLayout parse(Json metadata, const Limits& limits,
                                  std::optional<uint64_t> storage_bytes = std::nullopt);

  // Bytes a storage needs: the largest leaf `stop` (0 with no leaves).
  uint64_t total_bytes() const noexcept { return total_bytes_; }
  size_t num_leaves() const noexcept { return num_leaves_; }
  const Json& metadata() const noexcept { return *shared_->metadata; }
  const std::shared_ptr<const Json>& metadata_ptr() const noexcept { return shared_->metadata; }

  // Views into `storage` (at least total_bytes() long); the result is consolidated
  // (it shares this layout's metadata) but not locked, like a tensordict receiver's.
  TensorDict instantiate(Storage storage) const;

  struct Node;

 private:
  std::shared_ptr<const Node> root_;
  std::shared_ptr<Consolidated> shared_;  // metadata; storage filled per instantiate()
  uint64_t total_bytes_ = 0;
  size_t num_leaves_ = 0;
};

// A locked TensorDict of views into a consolidated storage someone else wrote (a file, a
// pickle, tensordict's consolidate()), its `metadata` validated against the storage's size
// first: ProtocolError as parse().
TensorDict view_consolidated(Storage storage, Json metadata, const Limits& limits = {});

}  // namespace tensorwire::wire
