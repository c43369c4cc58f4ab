// DatapointStructureCache: DatapointDecoder structures by schema, for a consumer that
// decodes many datapoints of few schemas (the Python binding). Internal: not user API.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <utility>

#include "tensorwire/wire/datapoint.h"

namespace tensorwire::wire {

// Structures by schema, for a consumer that decodes many datapoints of few schemas: the
// structure of a metadata object is made once and reused while that object lives (the
// cache holds it, so its address is not reused while cached); emptied when 64 are held.
// Not thread-safe: one per consumer thread, or a lock around it. A structure is shared:
// the caller keeps it while it walks it, however many others are made meanwhile (the
// Python binding walks one while other threads, given the GIL by Python code that a
// datapoint's conversion runs, decode other schemas and empty the cache).
class DatapointStructureCache {
 public:
  // DatapointDecoder::structure() of this metadata (parsed against `storage_bytes` first
  // when no `layout` of it is given); nullptr when it is not a datapoint.
  std::shared_ptr<const DatapointNode> get(const std::shared_ptr<const Json>& metadata,
                                           uint64_t storage_bytes, const ConsolidatedLayout* layout,
                                           bool allow_pickle);

 private:
  struct Entry {
    std::shared_ptr<const Json> metadata;
    std::shared_ptr<const DatapointNode> node;
  };
  struct Hash {
    size_t operator()(const std::pair<const Json*, bool>& k) const noexcept {
      return std::hash<const void*>()(k.first) ^ k.second;
    }
  };
  std::unordered_map<std::pair<const Json*, bool>, Entry, Hash> cache_;
};

}  // namespace tensorwire::wire
