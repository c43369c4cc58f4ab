// Zero-filled storage that costs no memory until written: an anonymous private mapping,
// whose pages the kernel supplies (zero) on first touch. For values nobody may read, such
// as a spec rebuilt from its structure alone (wire::decode_structure), of any size.
#pragma once

#include <cstddef>

#include "tensorwire/core/storage.h"

namespace tensorwire::detail {

// `nbytes` zero bytes (none for 0). SystemError when the mapping fails.
Storage zero_storage(size_t nbytes);

}  // namespace tensorwire::detail
