// Saved TensorDicts, in tensordict's consolidated file layout:
//   [storage bytes][metadata JSON][u64 little-endian JSON length]
// so tensordict's TensorDict.from_consolidated() reads what save() writes and load()
// reads what tensordict's consolidate(filename=...) writes.
#pragma once

#include <string>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/limits.h"

namespace tensorwire {

// Writes atomically (a temporary file renamed into place), so a crash never leaves a
// half-written file under `path`.
void save(const TensorDict& td, const std::string& path, const ConsolidateOptions& options = {});

// Memory-maps the file and returns views into it (no copy). ProtocolError naming the
// problem for a truncated or corrupt file.
TensorDict load(const std::string& path, const wire::Limits& limits = {});

}  // namespace tensorwire
