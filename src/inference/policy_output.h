// What every transport checks of a policy's output before it answers from it.
#pragma once

#include <cstdint>

#include "tensorwire/core/tensordict.h"

namespace tensorwire::inference::detail {

// ValueError unless `output`'s first batch dimension is `rows` (one row for each request
// of the batch), as a wrong leaf shape or dtype is a ValueError.
void check_output_rows(const TensorDict& output, int64_t rows);

}  // namespace tensorwire::inference::detail
