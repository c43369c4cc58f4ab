// The two ends of "datapoints through shared memory, descriptors through a message pipe".
//
// ShmSender packs a TensorDict into a chunk of a ChunkPool it owns (one memcpy per leaf,
// straight into shared memory) and writes the descriptor that names the chunk. The
// consolidated schema goes with a datapoint only when the structure changed (the wire
// format's SchemaAndStorage vs Storage messages); a structure signature, cheaper than
// planning, decides.
//
// ShmReceiver turns descriptors back into TensorDicts of views into the sender's chunks;
// the chunk is released when the last view goes. It keeps, per sender, the segments it
// was given and the last schema.
//
// Neither knows the message pipe: segments travel over a Unix socket (send_segment /
// recv_segment, SCM_RIGHTS) and descriptors over whatever the caller uses (ZeroMQ).
// Thread-safety: each object is used by one thread; the chunk release may happen on any.
#pragma once

#include <atomic>
#include <optional>
#include <span>
#include <string>
#include <unordered_map>

#include "dataflow/descriptor.h"
#include "dataflow/raw_datapoint.h"
#include "os/unix_socket.h"
#include "shm/chunk_arena.h"
#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/frame.h"
#include "tensorwire/wire/layout.h"

namespace tensorwire::dataflow::detail {

class ShmSender {
 public:
  // `min_chunks`: the first arena holds at least this many chunks of the first datapoint's
  // size (the runner passes hwm + a few, so that steady state never grows the pool).
  ShmSender(std::string name, size_t min_chunks, shm::ChunkPool::NewSegment on_new_segment);

  // Packs `td` into a new chunk and appends its descriptor (`h` with the segment and
  // offset filled in) to `out`. `peer_schema` is the schema id the destination received
  // last (0: none); the schema goes along when it differs, and it is then updated. A
  // sender with several destinations keeps one such id per destination.
  // Returns the chunk (none for a datapoint without bytes).
  std::optional<shm::ChunkPool::Chunk> encode(const TensorDict& td, DescriptorHeader h,
                                              std::string& out, uint64_t& peer_schema);
  // Frees the chunk named by a descriptor that was encoded but could not be sent (and
  // forgets that the destination got its schema).
  void abandon(std::span<const std::byte> descriptor, uint64_t& peer_schema);
  // Chunks sent to a receiver that died: those it never released are freed
  // (ChunkArena::reclaim). in_use(): whether one sent is not released yet.
  size_t reclaim(std::span<const shm::ChunkPool::Chunk> chunks) { return pool_.reclaim(chunks); }
  bool in_use(const shm::ChunkPool::Chunk& chunk) const { return pool_.in_use(chunk); }

  // The segments made so far, in order (for a receiver that joins late).
  size_t num_segments() const noexcept { return pool_.num_segments(); }
  const shm::Segment& segment(uint32_t index) const { return pool_.segment(index); }
  size_t shared_memory_bytes() const noexcept { return pool_.total_bytes(); }
  size_t bytes_in_use() const { return pool_.bytes_in_use(); }

 private:
  shm::ChunkPool pool_;
  std::string signature_;  // structure of the last datapoint
  std::string scratch_;
  ConsolidatedPlan plan_;
  std::string metadata_;
  uint64_t schema_id_ = 0;
  wire::FrameHeader::Bytes storage_header_{};
  uint64_t storage_header_schema_ = 0;
};

class ShmReceiver {
 public:
  // Called for a segment index a sender has not delivered yet; must return it (waiting
  // for the sender's Unix socket message) or throw.
  using FetchSegment = std::function<shm::Segment(uint16_t sender, uint32_t index)>;

  explicit ShmReceiver(FetchSegment fetch, wire::Limits limits = {});

  struct Received {
    DescriptorHeader header;
    std::optional<RawDatapoint> datapoint;  // Datapoint
    Failure failure;                        // Error
  };
  // ProtocolError for a malformed descriptor (it holds no chunk then).
  Received decode(std::span<const std::byte> message);

  void add_segment(uint16_t sender, uint32_t index, shm::Segment segment);
  // Bytes of the segments mapped now. Atomic: the owner reads it from any thread while its
  // consumer thread decodes (the map itself is the consumer's alone).
  size_t mapped_bytes() const noexcept { return mapped_bytes_.load(std::memory_order_relaxed); }
  // Forgets a sender's schema and segments (it restarted, or its stream was cut).
  void forget(uint16_t sender);

 private:
  struct Peer {
    std::vector<shm::Segment> segments;
    uint64_t schema_id = 0;
    std::shared_ptr<const wire::ConsolidatedLayout> layout;
    wire::FrameHeader::Bytes header_bytes{};  // the last frame header validated
    wire::FrameHeader header;
    bool header_valid = false;
  };
  const shm::Segment& segment(uint16_t sender, Peer& peer, uint32_t index);
  void map(Peer& peer, shm::Segment segment);

  FetchSegment fetch_;
  wire::Limits limits_;
  std::unordered_map<uint16_t, Peer> peers_;
  std::atomic<size_t> mapped_bytes_{0};
};

// Segments over a Unix socket: "segment <index> <bytes>" with the memfd attached.
void send_segment(os::UnixSocket& socket, uint32_t index, const shm::Segment& segment);
// Receives the next segment message; std::nullopt on timeout, ClosedError on EOF.
std::optional<std::pair<uint32_t, shm::Segment>> recv_segment(os::UnixSocket& socket,
                                                              os::Millis timeout);

}  // namespace tensorwire::dataflow::detail
