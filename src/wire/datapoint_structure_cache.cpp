#include "wire/datapoint_structure_cache.h"

#include <optional>

namespace tensorwire::wire {

std::shared_ptr<const DatapointNode> DatapointStructureCache::get(
    const std::shared_ptr<const Json>& metadata, uint64_t storage_bytes,
    const ConsolidatedLayout* layout, bool allow_pickle) {
  auto it = cache_.find({metadata.get(), allow_pickle});
  if (it != cache_.end()) return it->second.node;
  if (cache_.size() >= 64) cache_.clear();
  std::optional<ConsolidatedLayout> parsed;
  if (!layout) layout = &parsed.emplace(ConsolidatedLayout::parse(*metadata, {}, storage_bytes));
  Entry e{metadata, DatapointDecoder::structure(*layout, allow_pickle)};
  std::shared_ptr<const DatapointNode> n = e.node;
  cache_.emplace(std::make_pair(metadata.get(), allow_pickle), std::move(e));
  return n;
}

}  // namespace tensorwire::wire
