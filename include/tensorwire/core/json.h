// The JSON type used for metadata and non-tensor values. ordered_json keeps insertion
// order, which is the order of keys in a TensorDict.
#pragma once

#include <nlohmann/json.hpp>

namespace tensorwire {
using Json = nlohmann::ordered_json;
}  // namespace tensorwire
