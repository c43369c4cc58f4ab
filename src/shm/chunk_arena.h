// Variable-size chunks in shared memory, allocated by one process and released by any
// process that maps the segment.
//
// The pattern it serves: a producer writes a message's bytes into a chunk of a segment it
// owns and sends only (segment, offset) to a consumer, which reads the bytes in place and
// releases the chunk when it is done, possibly much later and in any order. A release is a
// single atomic store into the chunk's header: no lock, no message back, no syscall. The
// owner reclaims released chunks lazily, when it next allocates.
//
// Layout of a segment (all offsets relative to its start, see docs/dataflow.md):
//
//   [ArenaHeader, 64 B][ChunkHeader, 64 B][payload ...][ChunkHeader][payload ...] ...
//
// Chunks tile the segment exactly. A ChunkHeader holds the chunk's state (Free, Used,
// Released) and its total size; payloads start 64-byte aligned. Only the owner splits,
// merges or allocates chunks; a releaser only ever turns Used into Released. Hence the
// owner may rewrite any header that is not Used without racing anyone.
//
// Allocation merges runs of Free/Released chunks on the way and simply skips a chunk the
// consumer keeps. Chunks up to kNextFitBytes are found next-fit, from where the last
// allocation ended: released in the order they were sent, the oldest is the next one, so
// an allocation reads one header. Larger chunks are found first-fit from the start: a
// consumer that releases promptly makes the owner reuse the same few, still in the cache.
//
// Thread-safety: ChunkArena and ChunkPool are owner-side objects for one thread.
// release_chunk() may be called from any thread of any process that maps the segment.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "shm/segment.h"

namespace tensorwire::shm {

inline constexpr size_t kChunkAlignment = 64;      // payload alignment and size granularity
inline constexpr size_t kChunkHeaderBytes = 64;    // one header per chunk
inline constexpr size_t kArenaHeaderBytes = 64;    // one header per segment
inline constexpr size_t kNextFitBytes = 64 << 10;  // chunks up to this size: next-fit

// The owner's view of one segment formatted as a chunk arena.
class ChunkArena {
 public:
  ChunkArena() = default;
  // A new memfd segment of at least `bytes` (rounded up to the granularity), formatted as
  // one free chunk.
  static ChunkArena create(const std::string& name, size_t bytes);

  // Offset (from the segment start) of a payload of at least `nbytes`, or std::nullopt
  // when no run of free chunks is large enough.
  std::optional<size_t> allocate(size_t nbytes);
  // Gives a chunk back without anyone else having seen it (e.g. a send that failed).
  void free(size_t payload_offset);
  // Each allocation's serial (the arena's count of allocations when it was made).
  uint64_t serial_of(size_t payload_offset) const;
  // Whether the chunk allocated as `serial` at `payload_offset` is still Used (a quick
  // look: never throws, and may say true for bytes that only look like its header).
  bool in_use(size_t payload_offset, uint64_t serial) const;
  // Frees each chunk (payload offset, serial) that is still Used: their reader died before
  // it released them. One it released (and the owner perhaps merged or allocated again) is
  // left alone. One walk of the arena; returns how many were freed.
  size_t reclaim(std::vector<std::pair<size_t, uint64_t>> chunks);

  const Segment& segment() const noexcept { return segment_; }
  // Payload bytes the largest possible chunk could hold (an empty arena).
  size_t capacity() const noexcept;
  // Bytes in chunks that are Used (not yet released), headers included. Walks the arena.
  size_t bytes_in_use() const;

 private:
  Segment segment_;
  size_t rover_ = kArenaHeaderBytes;  // where the last allocation ended (next-fit)
  uint64_t serial_ = 0;               // allocations so far
};

// Releases the chunk whose payload starts at `payload_offset` in `segment` (any process).
// ProtocolError when the offset does not point at a Used chunk of that segment, so a bad
// descriptor cannot corrupt the arena.
void release_chunk(const Segment& segment, size_t payload_offset);

// The payload capacity of the chunk at `payload_offset` (validated like release_chunk, but
// for a Used chunk that stays Used).
size_t chunk_capacity(const Segment& segment, size_t payload_offset);

// A Storage over the first `nbytes` of a Used chunk's payload, whose release (when the last
// tensor viewing it goes, in the process that made it: not in a forked child) is
// release_chunk(). Keeps the segment mapped until then.
Storage chunk_storage(const Segment& segment, size_t payload_offset, size_t nbytes);

// Several arenas owned by one process, grown on demand.
//
// allocate() tries the arenas in order of creation; when none has room it creates a new
// one, sized so that the pool at least doubles (and at least `min_chunks` chunks of the
// requested size fit), and reports it through `on_new_segment` before returning a chunk
// from it, so that a peer can be told about the segment before any descriptor names it.
// Arenas are never shrunk or dropped while the pool lives: the total is bounded by twice
// the peak demand.
class ChunkPool {
 public:
  struct Chunk {
    uint32_t segment = 0;  // index into the pool's arenas, in order of creation
    size_t offset = 0;     // payload offset in that segment
    std::byte* data = nullptr;
    uint64_t serial = 0;  // ChunkArena::serial_of
  };
  using NewSegment = std::function<void(uint32_t index, const Segment& segment)>;

  ChunkPool(std::string name, size_t min_chunks, size_t min_segment_bytes,
            NewSegment on_new_segment);

  Chunk allocate(size_t nbytes);
  void free(const Chunk& chunk);
  bool in_use(const Chunk& chunk) const;          // ChunkArena::in_use
  size_t reclaim(std::span<const Chunk> chunks);  // ChunkArena::reclaim

  size_t num_segments() const noexcept { return arenas_.size(); }
  const Segment& segment(uint32_t index) const { return arenas_.at(index).segment(); }
  size_t total_bytes() const noexcept { return total_bytes_; }
  size_t bytes_in_use() const;

 private:
  std::string name_;
  size_t min_chunks_;
  size_t min_segment_bytes_;
  NewSegment on_new_segment_;
  std::vector<ChunkArena> arenas_;
  size_t total_bytes_ = 0;
  uint32_t last_ = 0;  // the arena that served the last allocation: tried first
};

}  // namespace tensorwire::shm
