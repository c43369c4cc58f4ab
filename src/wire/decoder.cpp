#include "tensorwire/wire/decoder.h"

#include "core/copy_bytes.h"

#include <cstring>

namespace tensorwire::wire {

namespace core_detail = tensorwire::detail;

namespace {

// An ordered_json object looks keys up linearly, so parsing an object of n keys into it
// costs O(n^2): a denial of service for untrusted input. Parse into the map-based json
// (O(n log n)) and move the result into ordered form without any lookup. Object members
// come out in key order, which the decoder never relies on.
Json to_ordered(nlohmann::json&& j) {
  switch (j.type()) {
    case nlohmann::json::value_t::object: {
      Json out = Json::object();
      auto& members = out.get_ref<Json::object_t&>();
      members.reserve(j.size());
      for (auto& [k, v] : j.get_ref<nlohmann::json::object_t&>())
        members.emplace_back(k, to_ordered(std::move(v)));
      return out;
    }
    case nlohmann::json::value_t::array: {
      Json out = Json::array();
      auto& items = out.get_ref<Json::array_t&>();
      items.reserve(j.size());
      for (auto& v : j.get_ref<nlohmann::json::array_t&>())
        items.push_back(to_ordered(std::move(v)));
      return out;
    }
    case nlohmann::json::value_t::string:
      return Json(std::move(j.get_ref<std::string&>()));
    case nlohmann::json::value_t::boolean:
      return Json(j.get<bool>());
    case nlohmann::json::value_t::number_integer:
      return Json(j.get<int64_t>());
    case nlohmann::json::value_t::number_unsigned:
      return Json(j.get<uint64_t>());
    case nlohmann::json::value_t::number_float:
      return Json(j.get<double>());
    default:
      return Json(nullptr);
  }
}

}  // namespace

Json parse_untrusted_json(std::span<const std::byte> bytes, const Limits& limits,
                          const char* what) {
  const char* begin = reinterpret_cast<const char*>(bytes.data());
  // JSON nesting is bounded too: deeply nested input must not exhaust the stack of a
  // recursive consumer. Two JSON levels per TensorDict level, plus room for values.
  const int max_json_depth = static_cast<int>(limits.max_depth) * 2 + 16;
  auto cb = [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
    if (depth > max_json_depth)
      throw ProtocolError(std::string("invalid ") + what + ": JSON nested deeper than " +
                          std::to_string(max_json_depth));
    return true;
  };
  try {
    return to_ordered(nlohmann::json::parse(begin, begin + bytes.size(), cb));
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("invalid ") + what + ": malformed JSON (" + e.what() + ")");
  }
}

Decoder::Decoder(Limits limits) : limits_(limits) {}

FrameHeader Decoder::read_header(std::span<const std::byte> bytes) const {
  return FrameHeader::decode(bytes, limits_);
}

Incoming Decoder::prepare(const FrameHeader& h, std::span<const std::byte> metadata,
                          TensorDict* into) {
  Incoming in;
  prepare(h, metadata, into, in);
  return in;
}

void Decoder::prepare(const FrameHeader& h, std::span<const std::byte> metadata, TensorDict* into,
                      Incoming& in) {
  in.reset();
  in.header = h;
  if (metadata.size() != h.metadata_bytes)
    throw ProtocolError("metadata is " + std::to_string(metadata.size()) +
                        " bytes, the header announced " + std::to_string(h.metadata_bytes));
  switch (h.kind) {
    case MessageKind::SchemaAndStorage:
      return prepare_schema(h, metadata, in);
    case MessageKind::Storage:
      return prepare_storage(h, into, in);
    case MessageKind::NonConsolidated:
      return prepare_non_consolidated(h, metadata, in);
    case MessageKind::Control:
      in.control = parse_untrusted_json(metadata, limits_, "control message");
      return;
  }
  throw ProtocolError("unknown message kind");
}

void Decoder::prepare_schema(const FrameHeader& h, std::span<const std::byte> metadata,
                             Incoming& in) {
  ConsolidatedLayout layout = ConsolidatedLayout::parse(
      parse_untrusted_json(metadata, limits_, "schema"), limits_, h.payload_bytes);
  // Everything is validated: only now is memory allocated for the payload.
  Storage storage = Storage::allocate(h.payload_bytes, 64);
  TensorDict td = layout.instantiate(storage);
  td.lock_();
  in.result = std::move(td);
  in.new_layout = std::move(layout);
  in.buffers.emplace_back(storage.data(), storage.nbytes());
}

// Whether `meta` describes the cached schema. Received metadata has its object members
// in key order while a local consolidate() keeps insertion order, so equality is checked
// order-insensitively, once per distinct metadata object (then remembered).
bool Decoder::same_layout(const std::shared_ptr<const Json>& meta) {
  if (meta == layout_->metadata_ptr() || meta == matched_into_meta_) return true;
  auto canonical = [](const Json& j) { return nlohmann::json::parse(j.dump()); };
  if (canonical(*meta) != canonical(layout_->metadata())) return false;
  matched_into_meta_ = meta;
  return true;
}

void Decoder::prepare_storage(const FrameHeader& h, TensorDict* into, Incoming& in) {
  if (!layout_)
    throw ProtocolError("storage message (schema id " + std::to_string(h.schema_id) +
                        ") with no schema received before it");
  if (h.schema_id != schema_id_)
    throw ProtocolError("storage message for schema id " + std::to_string(h.schema_id) +
                        ", but the last schema received has id " + std::to_string(schema_id_));
  if (h.payload_bytes != current_storage_.nbytes())
    throw ProtocolError("storage message of " + std::to_string(h.payload_bytes) +
                        " bytes for schema " + std::to_string(schema_id_) + " whose storage is " +
                        std::to_string(current_storage_.nbytes()) + " bytes");
  // The caller may have unlocked and rearranged the dict we returned: its views no longer
  // describe the storage, so give it fresh ones (the storage itself is still ours).
  if (!is_consolidated_root(current_) || !current_.consolidated()->storage.same(current_storage_)) {
    current_ = layout_->instantiate(current_storage_);
    current_.lock_();
  }
  in.target = &current_;
  // A caller's TensorDict is used when it has exactly this layout (same metadata object,
  // or equal metadata) and a storage of the right size.
  if (into && into != &current_ && is_consolidated_root(*into)) {
    const Consolidated& c = *into->consolidated();
    if (c.storage.nbytes() == h.payload_bytes && same_layout(c.metadata)) in.target = into;
  }
  const Storage& dst = in.target->consolidated()->storage;
  in.buffers.emplace_back(dst.data(), dst.nbytes());
}

void Decoder::prepare_non_consolidated(const FrameHeader& h, std::span<const std::byte> metadata,
                                       Incoming& in) {
  Json header = parse_untrusted_json(metadata, limits_, "non-consolidated header");
  auto bad = [](const std::string& rule) -> ProtocolError {
    return ProtocolError("invalid non-consolidated header: " + rule);
  };
  if (!header.is_object()) throw bad("must be a JSON object");
  auto shape_of = [&](const Json& v, const std::string& what) {
    if (!v.is_array() || v.size() > limits_.max_dims)
      throw bad(what + " must be a list of at most " + std::to_string(limits_.max_dims) +
                " integers");
    Shape s;
    for (const Json& d : v) {
      if (!d.is_number_unsigned() && !(d.is_number_integer() && d.get<int64_t>() >= 0))
        throw bad(what + " must hold non-negative integers");
      if (d.get<uint64_t>() > (1ull << 62)) throw bad(what + " dim too large");
      s.push_back(d.get<int64_t>());
    }
    try {
      checked_numel(s);
    } catch (const Error& e) {
      throw bad(what + ": " + e.what());
    }
    return s;
  };
  auto bs = header.find("batch_size");
  if (bs == header.end()) throw bad("missing \"batch_size\"");
  auto entries = header.find("entries");
  if (entries == header.end() || !entries->is_array()) throw bad("\"entries\" must be a list");
  if (entries->size() > limits_.max_leaves)
    throw bad(std::to_string(entries->size()) + " entries exceed max_leaves " +
              std::to_string(limits_.max_leaves));

  // First pass: validate every entry and size the payload, before allocating.
  struct Leaf {
    size_t entry;
    DType dtype;
    Shape shape;
    uint64_t nbytes;
    uint64_t offset;
  };
  std::vector<Leaf> leaves;
  uint64_t sum = 0, storage_bytes = 0;
  for (size_t i = 0; i < entries->size(); ++i) {
    const Json& e = (*entries)[i];
    std::string where = "entry " + std::to_string(i);
    if (!e.is_object()) throw bad(where + " must be an object");
    auto key = e.find("key");
    if (key == e.end() || !key->is_array() || key->empty() || key->size() > limits_.max_depth)
      throw bad(where + ": \"key\" must be a non-empty list of at most max_depth strings");
    for (const Json& part : *key)
      if (!part.is_string() || part.get_ref<const std::string&>().empty())
        throw bad(where + ": key parts must be non-empty strings");
    auto type = e.find("type");
    if (type == e.end() || !type->is_string()) throw bad(where + ": missing \"type\"");
    if (*type == "tensor") {
      auto dt = e.find("dtype");
      if (dt == e.end() || !dt->is_string()) throw bad(where + ": missing \"dtype\"");
      auto dtype = parse_dtype(dt->get_ref<const std::string&>());
      if (!dtype) throw bad(where + ": unknown dtype " + dt->dump());
      auto sh = e.find("shape");
      if (sh == e.end()) throw bad(where + ": missing \"shape\"");
      Shape shape = shape_of(*sh, where + " shape");
      uint64_t numel = static_cast<uint64_t>(checked_numel(shape));
      if (numel > limits_.max_message_bytes / itemsize(*dtype))
        throw bad(where + ": shape " + shape_str(shape) + " exceeds max_message_bytes");
      uint64_t nbytes = numel * itemsize(*dtype);
      sum += nbytes;
      if (sum > h.payload_bytes)
        throw bad("leaf sizes exceed payload_bytes " + std::to_string(h.payload_bytes));
      leaves.push_back({i, *dtype, std::move(shape), nbytes, storage_bytes});
      storage_bytes += (nbytes + 63) / 64 * 64;  // each leaf 64-byte aligned on this side
    } else if (*type == "dict") {
      auto b = e.find("batch_size");
      if (b == e.end()) throw bad(where + ": missing \"batch_size\"");
      shape_of(*b, where + " batch_size");
    } else if (*type == "non_tensor") {
      if (!e.contains("value")) throw bad(where + ": missing \"value\"");
    } else if (*type == "non_tensor_stack") {
      auto b = e.find("batch_size");
      auto v = e.find("values");
      auto sd = e.find("stack_dim");
      if (b == e.end() || v == e.end() || !v->is_array() || sd == e.end() ||
          !sd->is_number_integer())
        throw bad(where + ": a non_tensor_stack needs batch_size, stack_dim and values");
      shape_of(*b, where + " batch_size");
    } else {
      throw bad(where + ": unknown type " + type->dump());
    }
  }
  if (sum != h.payload_bytes)
    throw bad("leaf sizes add up to " + std::to_string(sum) + " bytes, payload_bytes is " +
              std::to_string(h.payload_bytes));

  // Second pass: build. Set() re-checks batch prefixes and nesting; its errors are
  // protocol errors here.
  try {
    std::optional<Device> device;
    if (auto d = header.find("device"); d != header.end() && !d->is_null()) device = Device::cpu();
    TensorDict td(shape_of(*bs, "batch_size"), device);
    if (auto n = header.find("names");
        n != header.end() && n->is_array() && n->size() == td.batch_size().size()) {
      std::vector<std::optional<std::string>> names;
      for (const Json& x : *n)
        names.push_back(x.is_string() ? std::optional<std::string>(x.get<std::string>())
                                      : std::nullopt);
      td.set_names(std::move(names));
    }
    Storage storage = Storage::allocate(storage_bytes, 64);
    size_t next_leaf = 0;
    for (size_t i = 0; i < entries->size(); ++i) {
      const Json& e = (*entries)[i];
      Key key(e["key"].get<std::vector<std::string>>());
      const std::string& type = e["type"].get_ref<const std::string&>();
      if (type == "tensor") {
        const Leaf& l = leaves[next_leaf++];
        Tensor t = Tensor::view(storage, l.offset, l.shape, l.dtype);
        td.set(key, t);
        in.buffers.emplace_back(storage.data() + l.offset, l.nbytes);
      } else if (type == "dict") {
        if (td.contains(key)) throw bad("key " + key.str() + " appears twice");
        td.set(key, TensorDict(shape_of(e["batch_size"], "batch_size"), device));
      } else if (type == "non_tensor") {
        td.set(key, NonTensor{e["value"]});
      } else {
        NonTensorStack st{shape_of(e["batch_size"], "batch_size"), e["stack_dim"].get<int64_t>(),
                          e["values"].get<std::vector<Json>>()};
        td.set(key, std::move(st));
      }
    }
    in.result = std::move(td);
  } catch (const ProtocolError&) {
    throw;
  } catch (const Error& e) {
    throw bad(e.what());
  }
}

TensorDict& Decoder::finish(Incoming& in) {
  switch (in.header.kind) {
    case MessageKind::SchemaAndStorage:
      layout_ = std::move(in.new_layout);
      schema_id_ = in.header.schema_id;
      current_ = std::move(*in.result);
      current_storage_ = current_.consolidated()->storage;
      matched_into_meta_.reset();
      return current_;
    case MessageKind::Storage:
      return *in.target;
    case MessageKind::NonConsolidated:
      nc_current_ = std::move(*in.result);
      return nc_current_;
    case MessageKind::Control:
      break;
  }
  throw ProtocolError("a control message carries no TensorDict");
}

TensorDict& Decoder::decode(std::span<const std::byte> message, TensorDict* into) {
  if (message.size() < kHeaderBytes)
    throw ProtocolError("message of " + std::to_string(message.size()) +
                        " bytes is shorter than a frame header");
  FrameHeader h = read_header(message.first(kHeaderBytes));
  const uint64_t rest = message.size() - kHeaderBytes;
  if (h.metadata_bytes > rest || h.payload_bytes != rest - h.metadata_bytes)
    throw ProtocolError("message of " + std::to_string(message.size()) +
                        " bytes does not match its header (" + std::to_string(h.metadata_bytes) +
                        " metadata + " + std::to_string(h.payload_bytes) + " payload bytes)");
  Incoming in = prepare(h, message.subspan(kHeaderBytes, h.metadata_bytes), into);
  fill(in, message.subspan(kHeaderBytes + h.metadata_bytes));
  return finish(in);
}

void Decoder::fill(const Incoming& incoming, std::span<const std::byte> payload) {
  // prepare() sized the buffers from the header, which the caller matched to the payload;
  // checked again here, since a short payload would be read past its end.
  size_t total = 0;
  for (const auto& buf : incoming.buffers) total += buf.size();
  if (total > payload.size())
    throw ProtocolError("payload of " + std::to_string(payload.size()) +
                        " bytes, its leaves need " + std::to_string(total));
  const std::byte* src = payload.data();
  for (const auto& buf : incoming.buffers) {
    if (!buf.empty()) core_detail::copy_bytes(buf.data(), src, buf.size());
    src += buf.size();
  }
}

}  // namespace tensorwire::wire
