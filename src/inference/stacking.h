// Batching for the transports without a fixed layout (thread, socket): requests are
// grouped by structure (keys, dtypes, shapes, batch sizes), each group is stacked along
// a new dim 0, and each policy output is split back into one response per request.
#pragma once

#include <string>
#include <vector>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference::detail {

// A string equal for two TensorDicts exactly when TensorDict::stack can stack them.
std::string structure_key(const TensorDict& td);

// Fills `groups` from requests[i] (i = position in the drained batch), one group per
// structure in order of first appearance.
void group_and_stack(const std::vector<const TensorDict*>& requests, std::vector<Group>& groups);

// The per-request responses of one group: checks the output's leading dim, stamps the
// policy version (when stamp.key is set) and unbinds dim 0 (views of the output).
std::vector<TensorDict> split_output(const TensorDict& output, size_t rows,
                                     const VersionStamp& stamp);

}  // namespace tensorwire::inference::detail
