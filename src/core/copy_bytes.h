// copy_bytes: memcpy that splits a large copy between the calling thread and one helper
// thread (private to the library).
//
// Why: one core cannot saturate the memory system; a 4.8 MB copy into shared memory or a
// 64 MiB consolidation runs close to twice as fast on two. torch's copy_ does the same for
// large CPU tensors (parallel_for). Copies below kParallelMin, copies made while the helper
// is busy with another thread's copy, and machines with one CPU take the plain memcpy.
//
// The helper is one long-lived thread per process, started on first use; a forked child
// (which has no threads) starts its own. It is never joined: it sleeps on a futex between
// copies and ends with the process.
#pragma once

#include <cstddef>

namespace tensorwire::detail {

inline constexpr size_t kParallelCopyMin = size_t{1} << 20;

void copy_bytes(void* dst, const void* src, size_t n) noexcept;

}  // namespace tensorwire::detail
