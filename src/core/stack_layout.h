// How a NonTensorStack of stack_dim d lies in tensordict's consolidated metadata: its
// elements are the slices along dim d (tensordict stacks sub-stacks along that dim), while
// NonTensorStack::values is row-major over batch_size. consolidate() writes a stack with its
// dim d moved to the front; the layout parser reads one and moves that dim back.
#pragma once

#include <cstddef>

#include "tensorwire/core/non_tensor.h"

namespace tensorwire::detail {

// `st` with batch dim `from` moved to position `to`, the other dims in their order (its
// values reordered to stay row-major). stack_dim is left as it was.
NonTensorStack move_stack_dim(const NonTensorStack& st, size_t from, size_t to);

}  // namespace tensorwire::detail
