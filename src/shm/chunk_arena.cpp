#include "shm/chunk_arena.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "os/fork.h"
#include "tensorwire/core/error.h"

namespace tensorwire::shm {

namespace {

constexpr uint32_t kArenaMagic = 0x41435754;  // "TWCA"
constexpr uint32_t kChunkMagic = 0x48435754;  // "TWCH"
constexpr uint32_t kVersion = 1;

enum State : uint32_t { kFree = 1, kUsed = 2, kReleased = 3 };

struct ArenaHeader {
  uint32_t magic;
  uint32_t version;
  uint64_t size;  // whole segment
};
static_assert(sizeof(ArenaHeader) <= kArenaHeaderBytes);

// The state word is the only field touched by non-owners, and only from Used to Released.
struct ChunkHeader {
  std::atomic<uint32_t> state;
  uint32_t magic;
  uint64_t size;    // whole chunk, header included; a multiple of kChunkAlignment
  uint64_t serial;  // the owner's count of allocations when this one was made (reclaim())
};
static_assert(sizeof(ChunkHeader) <= kChunkHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free);

size_t round_up(size_t n, size_t to) {
  return (n + to - 1) / to * to;
}

ChunkHeader* header_at(std::byte* base, size_t pos) {
  return reinterpret_cast<ChunkHeader*>(base + pos);
}

// The size of the chunk at `pos`, read once and checked: every process that maps the
// segment can write its headers, and a size of 0 or past the end would make the owner's
// walk spin for ever or step outside the segment.
size_t checked_size(ChunkHeader* h, size_t pos, size_t end) {
  const size_t size = std::atomic_ref<uint64_t>(h->size).load(std::memory_order_relaxed);
  if (size < kChunkHeaderBytes || size % kChunkAlignment != 0 || size > end - pos)
    throw ProtocolError("chunk arena corrupted: a chunk of " + std::to_string(size) +
                        " bytes at offset " + std::to_string(pos) + " of a " + std::to_string(end) +
                        "-byte segment");
  return size;
}

struct CheckedChunk {
  ChunkHeader* header;
  size_t size;  // as it was checked: not read again from memory others write
};

// Validates that `payload_offset` names a chunk header of `segment`; returns it.
CheckedChunk checked_header(const Segment& segment, size_t payload_offset, const char* what) {
  const size_t size = segment.size();
  if (!segment.valid() || payload_offset % kChunkAlignment != 0 ||
      payload_offset < kArenaHeaderBytes + kChunkHeaderBytes || payload_offset > size)
    throw ProtocolError(std::string(what) + ": offset " + std::to_string(payload_offset) +
                        " is not a chunk of a " + std::to_string(size) + "-byte arena");
  auto* arena = reinterpret_cast<const ArenaHeader*>(segment.data());
  const size_t pos = payload_offset - kChunkHeaderBytes;
  ChunkHeader* h = header_at(segment.data(), pos);
  if (arena->magic != kArenaMagic || h->magic != kChunkMagic)
    throw ProtocolError(std::string(what) + ": no chunk header at offset " +
                        std::to_string(payload_offset));
  return {h, checked_size(h, pos, size)};
}

}  // namespace

ChunkArena ChunkArena::create(const std::string& name, size_t bytes) {
  const size_t size = round_up(std::max(bytes, kArenaHeaderBytes + 2 * kChunkHeaderBytes), 4096);
  ChunkArena a;
  a.segment_ = Segment::create(name, size);
  std::byte* base = a.segment_.data();
  auto* arena = reinterpret_cast<ArenaHeader*>(base);
  arena->magic = kArenaMagic;
  arena->version = kVersion;
  arena->size = size;
  ChunkHeader* first = new (base + kArenaHeaderBytes) ChunkHeader{};
  first->magic = kChunkMagic;
  first->size = size - kArenaHeaderBytes;
  first->state.store(kFree, std::memory_order_relaxed);
  return a;
}

size_t ChunkArena::capacity() const noexcept {
  return segment_.valid() ? segment_.size() - kArenaHeaderBytes - kChunkHeaderBytes : 0;
}

std::optional<size_t> ChunkArena::allocate(size_t nbytes) {
  if (!segment_.valid()) return std::nullopt;
  std::byte* base = segment_.data();
  const size_t end = segment_.size();
  if (nbytes > end) return std::nullopt;
  const size_t need = kChunkHeaderBytes + round_up(std::max<size_t>(nbytes, 1), kChunkAlignment);
  // Small chunks: next-fit from where the last allocation ended, which finds the oldest
  // chunk first, so chunks released in the order they were sent cost one header read.
  // Large chunks: first-fit from the start, to reuse the memory most likely still cached.
  const size_t start = need <= kNextFitBytes ? rover_ : kArenaHeaderBytes;
  size_t pos = start;
  bool wrapped = false;
  while (true) {
    if (pos >= end) {
      if (wrapped || start == kArenaHeaderBytes) return std::nullopt;
      wrapped = true;
      pos = kArenaHeaderBytes;
    }
    if (wrapped && pos >= start) return std::nullopt;
    ChunkHeader* h = header_at(base, pos);
    const size_t size = checked_size(h, pos, end);
    // Acquire: a Released chunk's payload reads (in the releasing process) happen before
    // the owner writes the chunk again.
    if (h->state.load(std::memory_order_acquire) == kUsed) {
      pos += size;
      continue;
    }
    // Merge the run of Free/Released chunks that starts here.
    size_t run = size;
    while (pos + run < end) {
      ChunkHeader* next = header_at(base, pos + run);
      if (next->state.load(std::memory_order_acquire) == kUsed) break;
      const size_t next_size = checked_size(next, pos + run, end);
      next->magic = 0;  // no longer a header: a stale descriptor naming it is rejected
      run += next_size;
    }
    if (rover_ > pos && rover_ < pos + run) rover_ = pos;  // its chunk was merged into this one
    h->size = run;
    h->state.store(kFree, std::memory_order_relaxed);
    if (run >= need) {
      size_t taken = run;
      if (run - need >= kChunkHeaderBytes + kChunkAlignment) {
        ChunkHeader* rest = new (base + pos + need) ChunkHeader{};
        rest->magic = kChunkMagic;
        rest->size = run - need;
        rest->state.store(kFree, std::memory_order_relaxed);
        h->size = taken = need;
      }
      h->serial = ++serial_;
      h->state.store(kUsed, std::memory_order_release);
      rover_ = pos + taken < end ? pos + taken : kArenaHeaderBytes;
      return pos + kChunkHeaderBytes;
    }
    pos += run;
  }
}

void ChunkArena::free(size_t payload_offset) {
  ChunkHeader* h = checked_header(segment_, payload_offset, "ChunkArena::free").header;
  h->state.store(kFree, std::memory_order_release);
}

uint64_t ChunkArena::serial_of(size_t payload_offset) const {
  return checked_header(segment_, payload_offset, "ChunkArena::serial_of").header->serial;
}

bool ChunkArena::in_use(size_t payload_offset, uint64_t serial) const {
  // Called to ask, not to act: an offset that names no chunk is simply not in use.
  try {
    const ChunkHeader* h = checked_header(segment_, payload_offset, "ChunkArena::in_use").header;
    return h->serial == serial && h->state.load(std::memory_order_acquire) == kUsed;
  } catch (const ProtocolError&) {
    return false;
  }
}

size_t ChunkArena::reclaim(std::vector<std::pair<size_t, uint64_t>> chunks) {
  // Released by its reader, a chunk may since have been merged into another or allocated
  // again: its offset may now lie inside another chunk's payload, whose bytes could look
  // like a header. So the offsets are matched against the arena's own chain of headers.
  std::sort(chunks.begin(), chunks.end());
  std::byte* base = segment_.data();
  const size_t end = segment_.size();
  size_t freed = 0;
  auto want = chunks.begin();
  for (size_t pos = kArenaHeaderBytes; pos < end && want != chunks.end();) {
    ChunkHeader* h = header_at(base, pos);
    const size_t size = checked_size(h, pos, end);
    for (; want != chunks.end() && want->first <= pos + kChunkHeaderBytes; ++want) {
      uint32_t expected = kUsed;
      if (want->first == pos + kChunkHeaderBytes && h->serial == want->second &&
          h->state.compare_exchange_strong(expected, kFree, std::memory_order_acq_rel))
        ++freed;
    }
    pos += size;
  }
  return freed;
}

size_t ChunkArena::bytes_in_use() const {
  if (!segment_.valid()) return 0;
  size_t used = 0;
  for (size_t pos = kArenaHeaderBytes; pos < segment_.size();) {
    ChunkHeader* h = header_at(segment_.data(), pos);
    const size_t size = checked_size(h, pos, segment_.size());
    if (h->state.load(std::memory_order_acquire) == kUsed) used += size;
    pos += size;
  }
  return used;
}

void release_chunk(const Segment& segment, size_t payload_offset) {
  ChunkHeader* h = checked_header(segment, payload_offset, "release_chunk").header;
  uint32_t expected = kUsed;
  // Release: every read of the payload in this process happens before the owner reuses it.
  if (!h->state.compare_exchange_strong(expected, kReleased, std::memory_order_release,
                                        std::memory_order_relaxed))
    throw ProtocolError("release_chunk: the chunk at offset " + std::to_string(payload_offset) +
                        " is not in use (released twice?)");
}

size_t chunk_capacity(const Segment& segment, size_t payload_offset) {
  const auto [h, size] = checked_header(segment, payload_offset, "chunk_capacity");
  if (h->state.load(std::memory_order_acquire) != kUsed)
    throw ProtocolError("the chunk at offset " + std::to_string(payload_offset) + " is not in use");
  return size - kChunkHeaderBytes;
}

Storage chunk_storage(const Segment& segment, size_t payload_offset, size_t nbytes) {
  const auto [h, size] = checked_header(segment, payload_offset, "chunk_storage");
  if (h->state.load(std::memory_order_acquire) != kUsed)
    throw ProtocolError("the chunk at offset " + std::to_string(payload_offset) + " is not in use");
  if (nbytes > size - kChunkHeaderBytes)
    throw ProtocolError("a " + std::to_string(nbytes) +
                        "-byte payload does not fit the chunk at offset " +
                        std::to_string(payload_offset));
  // Only the process that took the chunk releases it. A forked child's copy of the
  // storage views the same shared memory: its release (the child dropping the copy, or
  // exiting) would hand the chunk back to its owner while the parent still reads it.
  return Storage::external(
      segment.data() + payload_offset, nbytes,
      [segment, payload_offset, generation = os::fork_generation()] {
        if (os::fork_generation() != generation) return;
        try {
          release_chunk(segment, payload_offset);
        } catch (...) {
          // A deleter must not throw; the chunk was validated when the storage was made.
        }
      },
      Storage::Kind::Shared);
}

ChunkPool::ChunkPool(std::string name, size_t min_chunks, size_t min_segment_bytes,
                     NewSegment on_new_segment)
    : name_(std::move(name)),
      min_chunks_(std::max<size_t>(min_chunks, 1)),
      min_segment_bytes_(min_segment_bytes),
      on_new_segment_(std::move(on_new_segment)) {}

ChunkPool::Chunk ChunkPool::allocate(size_t nbytes) {
  auto from = [&](uint32_t i) -> std::optional<Chunk> {
    if (auto off = arenas_[i].allocate(nbytes)) {
      last_ = i;
      return Chunk{i, *off, arenas_[i].segment().data() + *off, arenas_[i].serial_of(*off)};
    }
    return std::nullopt;
  };
  if (!arenas_.empty()) {
    if (auto c = from(last_)) return *c;
    for (uint32_t i = 0; i < arenas_.size(); ++i)
      if (i != last_)
        if (auto c = from(i)) return *c;
  }
  const size_t chunk = kChunkHeaderBytes + round_up(std::max<size_t>(nbytes, 1), kChunkAlignment);
  if (chunk < nbytes)
    throw ValueError("chunk of " + std::to_string(nbytes) + " bytes is too large");
  size_t bytes =
      std::max({min_segment_bytes_, kArenaHeaderBytes + chunk * min_chunks_, total_bytes_});
  const auto index = static_cast<uint32_t>(arenas_.size());
  arenas_.push_back(ChunkArena::create(name_ + "-" + std::to_string(index), bytes));
  total_bytes_ += arenas_.back().segment().size();
  if (on_new_segment_) {
    try {
      on_new_segment_(index, arenas_.back().segment());
    } catch (...) {
      total_bytes_ -= arenas_.back().segment().size();
      arenas_.pop_back();
      throw;
    }
  }
  if (auto c = from(index)) return *c;
  throw Error("ChunkPool: a new " + std::to_string(bytes) + "-byte arena cannot hold " +
              std::to_string(nbytes) + " bytes");
}

void ChunkPool::free(const Chunk& chunk) {
  arenas_.at(chunk.segment).free(chunk.offset);
}

bool ChunkPool::in_use(const Chunk& chunk) const {
  return chunk.segment < arenas_.size() &&
         arenas_[chunk.segment].in_use(chunk.offset, chunk.serial);
}

size_t ChunkPool::reclaim(std::span<const Chunk> chunks) {
  std::vector<std::vector<std::pair<size_t, uint64_t>>> by_arena(arenas_.size());
  for (const Chunk& c : chunks)
    if (c.segment < arenas_.size()) by_arena[c.segment].emplace_back(c.offset, c.serial);
  size_t freed = 0;
  for (size_t i = 0; i < arenas_.size(); ++i)
    if (!by_arena[i].empty()) freed += arenas_[i].reclaim(std::move(by_arena[i]));
  return freed;
}

size_t ChunkPool::bytes_in_use() const {
  size_t n = 0;
  for (const auto& a : arenas_) n += a.bytes_in_use();
  return n;
}

}  // namespace tensorwire::shm
