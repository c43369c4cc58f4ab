#include "dataflow/shm_channel.h"

#include <cstring>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/frame.h"

namespace tensorwire::dataflow::detail {

namespace {

// Leaves 64-byte aligned in a chunk: payloads start 64-byte aligned too, so every leaf
// is cache-line aligned for the memcpy in and for SIMD readers out.
constexpr ConsolidateOptions kChunkLayout{64};

void append_shape(std::string& s, const Shape& shape) {
  s += '[';
  for (int64_t d : shape) {
    s += std::to_string(d);
    s += ',';
  }
  s += ']';
}

// Everything consolidate's metadata depends on, in a form that is cheap to build and
// compare: two datapoints with equal signatures have equal metadata.
void signature(const TensorDict& td, std::string& s) {
  append_shape(s, td.batch_size());
  s += td.device() ? td.device()->str() : "-";
  for (const auto& n : td.names()) {
    s += n ? *n : "\x01";
    s += '\x02';
  }
  s += td.is_locked() ? 'L' : 'U';
  s += '{';
  for (const auto& [name, e] : td.items()) {
    s += name;
    s += '\x00';
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      s += 't';
      s += static_cast<char>(t.dtype());
      append_shape(s, t.shape());
      if (!t.device().is_cpu()) s += t.device().str();
    } else if (e.is_tensordict()) {
      s += 'd';
      signature(e.tensordict(), s);
    } else if (e.is_non_tensor()) {
      s += 'n';
      s += e.non_tensor().value.dump();
    } else {
      const NonTensorStack& st = e.non_tensor_stack();
      s += 's';
      append_shape(s, st.batch_size);
      s += std::to_string(st.stack_dim);
      for (const Json& v : st.values) s += v.dump();
    }
    s += '\x03';
  }
  s += '}';
}

}  // namespace

ShmSender::ShmSender(std::string name, size_t min_chunks, shm::ChunkPool::NewSegment on_new_segment)
    : pool_(std::move(name), min_chunks, 1 << 20, std::move(on_new_segment)) {}

std::optional<shm::ChunkPool::Chunk> ShmSender::encode(const TensorDict& td, DescriptorHeader h,
                                                       std::string& out, uint64_t& peer_schema) {
  scratch_.clear();
  signature(td, scratch_);
  if (schema_id_ == 0 || scratch_ != signature_) {
    plan_ = plan_consolidation(td, kChunkLayout);
    metadata_ = plan_.metadata.dump();
    signature_.swap(scratch_);
    ++schema_id_;
  }
  const bool with_schema = peer_schema != schema_id_;
  std::optional<shm::ChunkPool::Chunk> chunk;
  if (plan_.total_bytes > 0) {
    chunk = pool_.allocate(plan_.total_bytes);
    try {
      pack(td, plan_, chunk->data);
    } catch (...) {
      pool_.free(*chunk);
      throw;
    }
    h.segment = chunk->segment;
    h.offset = chunk->offset;
  } else {
    h.segment = kNoSegment;
    h.offset = 0;
  }
  h.kind = DescriptorKind::Datapoint;
  h.encode(out);
  if (with_schema) {
    wire::FrameHeader fh;
    fh.kind = wire::MessageKind::SchemaAndStorage;
    fh.schema_id = schema_id_;
    fh.metadata_bytes = metadata_.size();
    fh.payload_bytes = plan_.total_bytes;
    const auto bytes = fh.encode();
    out.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
    out += metadata_;
  } else {
    // A Storage frame header depends on the schema only (its size included): encode it
    // (and its CRC) once per schema.
    if (storage_header_schema_ != schema_id_) {
      wire::FrameHeader fh;
      fh.kind = wire::MessageKind::Storage;
      fh.schema_id = schema_id_;
      fh.payload_bytes = plan_.total_bytes;
      storage_header_ = fh.encode();
      storage_header_schema_ = schema_id_;
    }
    out.append(reinterpret_cast<const char*>(storage_header_.data()), storage_header_.size());
  }
  peer_schema = schema_id_;
  return chunk;
}

void ShmSender::abandon(std::span<const std::byte> descriptor, uint64_t& peer_schema) {
  DescriptorHeader h = DescriptorHeader::decode(descriptor);
  if (h.segment != kNoSegment) pool_.free({h.segment, h.offset, nullptr});
  peer_schema = 0;  // it may have carried the schema
}

ShmReceiver::ShmReceiver(FetchSegment fetch, wire::Limits limits)
    : fetch_(std::move(fetch)), limits_(limits) {}

void ShmReceiver::add_segment(uint16_t sender, uint32_t index, shm::Segment segment) {
  Peer& p = peers_[sender];
  if (index != p.segments.size())
    throw ProtocolError("segment " + std::to_string(index) + " from sender " +
                        std::to_string(sender) + " out of order (expected " +
                        std::to_string(p.segments.size()) + ")");
  map(p, std::move(segment));
}

void ShmReceiver::map(Peer& peer, shm::Segment segment) {
  const size_t bytes = segment.size();
  peer.segments.push_back(std::move(segment));
  mapped_bytes_.fetch_add(bytes, std::memory_order_relaxed);
}

void ShmReceiver::forget(uint16_t sender) {
  auto it = peers_.find(sender);
  if (it == peers_.end()) return;
  size_t bytes = 0;
  for (const auto& s : it->second.segments) bytes += s.size();
  peers_.erase(it);
  mapped_bytes_.fetch_sub(bytes, std::memory_order_relaxed);
}

const shm::Segment& ShmReceiver::segment(uint16_t sender, Peer& peer, uint32_t index) {
  while (index >= peer.segments.size()) {
    if (index > peer.segments.size() + 1024)
      throw ProtocolError("descriptor names segment " + std::to_string(index) + " of sender " +
                          std::to_string(sender) + ", which has sent " +
                          std::to_string(peer.segments.size()));
    const auto next = static_cast<uint32_t>(peer.segments.size());
    map(peer, fetch_(sender, next));
  }
  return peer.segments[index];
}

ShmReceiver::Received ShmReceiver::decode(std::span<const std::byte> msg) {
  Received r;
  r.header = DescriptorHeader::decode(msg);
  auto body = msg.subspan(kDescriptorHeaderBytes);
  switch (r.header.kind) {
    case DescriptorKind::Error:
      r.failure = decode_failure(body);
      return r;
    case DescriptorKind::Filtered:
      return r;
    case DescriptorKind::Datapoint:
      break;
  }
  Peer& peer = peers_[r.header.sender];
  if (body.size() < wire::kHeaderBytes)
    throw ProtocolError("datapoint descriptor without a frame header");
  // A frame header with the very bytes of the last one validated for this sender (every
  // Storage descriptor of a schema) need not be validated again.
  auto header_bytes = body.first(wire::kHeaderBytes);
  if (!peer.header_valid ||
      std::memcmp(header_bytes.data(), peer.header_bytes.data(), wire::kHeaderBytes) != 0) {
    peer.header_valid = false;
    peer.header = wire::FrameHeader::decode(header_bytes, limits_);
    std::memcpy(peer.header_bytes.data(), header_bytes.data(), wire::kHeaderBytes);
    peer.header_valid = true;
  }
  const wire::FrameHeader fh = peer.header;
  auto metadata = body.subspan(wire::kHeaderBytes);
  if (metadata.size() != fh.metadata_bytes)
    throw ProtocolError("datapoint descriptor: " + std::to_string(metadata.size()) +
                        " metadata bytes, the frame header announced " +
                        std::to_string(fh.metadata_bytes));
  if (fh.kind == wire::MessageKind::SchemaAndStorage) {
    peer.layout = std::make_shared<const wire::ConsolidatedLayout>(wire::ConsolidatedLayout::parse(
        wire::parse_untrusted_json(metadata, limits_, "schema"), limits_, fh.payload_bytes));
    peer.schema_id = fh.schema_id;
  } else if (fh.kind == wire::MessageKind::Storage) {
    if (!peer.layout || peer.schema_id != fh.schema_id)
      throw ProtocolError("datapoint descriptor for schema " + std::to_string(fh.schema_id) +
                          ", but the last schema from sender " + std::to_string(r.header.sender) +
                          " is " + std::to_string(peer.schema_id));
  } else {
    throw ProtocolError(std::string("datapoint descriptor carries a ") + wire::kind_name(fh.kind) +
                        " frame");
  }
  if (peer.layout->total_bytes() > fh.payload_bytes)
    throw ProtocolError("schema needs " + std::to_string(peer.layout->total_bytes()) +
                        " bytes, the datapoint has " + std::to_string(fh.payload_bytes));
  Storage storage;
  if (fh.payload_bytes == 0) {
    if (r.header.segment != kNoSegment) throw ProtocolError("an empty datapoint names a chunk");
    storage = Storage::allocate(0);
  } else {
    if (r.header.segment == kNoSegment) throw ProtocolError("a datapoint without a chunk");
    storage = shm::chunk_storage(segment(r.header.sender, peer, r.header.segment), r.header.offset,
                                 fh.payload_bytes);
  }
  r.datapoint = RawDatapoint{std::move(storage), peer.layout};
  return r;
}

void send_segment(os::UnixSocket& socket, uint32_t index, const shm::Segment& segment) {
  socket.send("segment " + std::to_string(index) + " " + std::to_string(segment.size()),
              {segment.fd()});
}

std::optional<std::pair<uint32_t, shm::Segment>> recv_segment(os::UnixSocket& socket,
                                                              os::Millis timeout) {
  auto m = socket.recv(timeout);
  if (!m) return std::nullopt;
  unsigned long index = 0, size = 0;
  if (std::sscanf(m->bytes.c_str(), "segment %lu %lu", &index, &size) != 2 || m->fds.size() != 1)
    throw ProtocolError("unexpected message on a segment socket: '" + m->bytes.substr(0, 64) + "'");
  return std::pair<uint32_t, shm::Segment>(static_cast<uint32_t>(index),
                                           shm::Segment::map(m->fds[0].get(), size));
}

}  // namespace tensorwire::dataflow::detail
