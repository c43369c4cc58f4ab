#include "tensorwire/wire/decoder.h"

#include "core/copy_bytes.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

namespace tensorwire::wire {

namespace core_detail = tensorwire::detail;

namespace {

// Builds a Json (nlohmann's ordered_json) straight from SAX events. Untrusted input must
// not cost more than it weighs: ordered_json's own parser looks every key up linearly
// (O(n^2) for an object of n keys), and parsing into the map-based json first and
// converting costs an extra tree of allocations. Here members are appended as they come
// (insertion order kept) and each object is checked for duplicate keys once, when it
// ends, by sorting: O(n log n). A duplicate key is an error rather than "last one wins":
// no valid message has one. Nesting is bounded, so no recursive consumer can run out of
// stack.
class JsonBuilder : public nlohmann::json_sax<Json> {
 public:
  JsonBuilder(const char* what, int max_depth) : what_(what), max_depth_(max_depth) {}

  Json take() { return std::move(root_); }

  bool null() override { return put(Json(nullptr)); }
  bool boolean(bool v) override { return put(Json(v)); }
  bool number_integer(number_integer_t v) override { return put(Json(v)); }
  bool number_unsigned(number_unsigned_t v) override { return put(Json(v)); }
  bool number_float(number_float_t v, const string_t&) override { return put(Json(v)); }
  bool string(string_t& v) override { return put(Json(std::move(v))); }
  bool binary(binary_t&) override { return fail("binary values are not JSON"); }

  bool start_object(std::size_t) override { return open(Json::object()); }
  bool key(string_t& k) override {
    stack_.back().members.emplace_back(std::move(k), nullptr);
    return true;
  }
  bool end_object() override {
    Frame& f = stack_.back();
    check_unique_keys(f.members);
    // ordered_map's elements have a const key, so its vector copies them deep when it
    // grows: members wait in a vector of movable pairs and move in once, at their count.
    auto& out = f.target->get_ref<Json::object_t&>();
    out.reserve(f.members.size());
    for (auto& [k, v] : f.members) out.emplace_back(std::move(k), std::move(v));
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) override { return open(Json::array()); }
  bool end_array() override {
    stack_.pop_back();
    return true;
  }

  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception& e) override {
    throw ProtocolError(std::string("invalid ") + what_ + ": malformed JSON (" + e.what() + ")");
  }

 private:
  using Members = std::vector<std::pair<std::string, Json>>;
  struct Frame {
    Json* target;     // the container being filled
    Members members;  // an object's members so far
  };

  // Where the next value goes: the root, the last key's slot, or the end of an array.
  // A slot stays put while its container is open: its parent only grows after it ends
  // (and a moved Frame keeps its vector's buffer).
  Json* slot() {
    if (stack_.empty()) return &root_;
    Frame& f = stack_.back();
    if (f.target->is_object()) return &f.members.back().second;
    auto& items = f.target->get_ref<Json::array_t&>();
    items.emplace_back(nullptr);
    return &items.back();
  }
  bool put(Json&& v) {
    *slot() = std::move(v);
    return true;
  }
  bool open(Json&& container) {
    if (static_cast<int>(stack_.size()) >= max_depth_)
      throw ProtocolError(std::string("invalid ") + what_ + ": JSON nested deeper than " +
                          std::to_string(max_depth_));
    Json* s = slot();
    *s = std::move(container);
    stack_.push_back(Frame{s, {}});
    // Room for a typical leaf entry ([dtype, shape, start, stop, pad]) or small object at
    // once: a text parser does not know sizes, and growing 1, 2, 4, 8 costs 4 allocations.
    if (s->is_array())
      s->get_ref<Json::array_t&>().reserve(8);
    else
      stack_.back().members.reserve(8);
    return true;
  }
  void check_unique_keys(const Members& members) {
    const size_t n = members.size();
    if (n < 2) return;
    if (n <= 8) {
      for (size_t i = 0; i < n; ++i)
        for (size_t j = i + 1; j < n; ++j)
          if (members[i].first == members[j].first) duplicate(members[i].first);
      return;
    }
    std::vector<const std::string*> keys;
    keys.reserve(n);
    for (const auto& m : members) keys.push_back(&m.first);
    std::sort(keys.begin(), keys.end(), [](auto* x, auto* y) { return *x < *y; });
    for (size_t i = 1; i < n; ++i)
      if (*keys[i] == *keys[i - 1]) duplicate(*keys[i]);
  }
  [[noreturn]] void duplicate(const std::string& key) {
    throw ProtocolError(std::string("invalid ") + what_ + ": duplicate key '" + key.substr(0, 64) +
                        "' in a JSON object");
  }
  [[noreturn]] bool fail(const std::string& why) {
    throw ProtocolError(std::string("invalid ") + what_ + ": " + why);
  }

  const char* what_;
  int max_depth_;
  Json root_;
  std::vector<Frame> stack_;
};

}  // namespace

Json parse_untrusted_json(std::span<const std::byte> bytes, const Limits& limits,
                          const char* what) {
  const char* begin = reinterpret_cast<const char*>(bytes.data());
  // The parser takes a NUL byte for the end of the input and would ignore what follows
  // ({...}\0garbage). JSON text never holds a raw NUL (in a string it is \u0000).
  if (const void* nul = std::memchr(begin, 0, bytes.size()))
    throw ProtocolError(std::string("invalid ") + what + ": NUL byte at offset " +
                        std::to_string(static_cast<const char*>(nul) - begin) + " of " +
                        std::to_string(bytes.size()) + " (JSON text holds no NUL byte)");
  // JSON nesting is bounded too: deeply nested input must not exhaust the stack of a
  // recursive consumer.
  JsonBuilder builder(what, max_json_depth(limits));
  try {
    Json::sax_parse(begin, begin + bytes.size(), &builder);
  } catch (const nlohmann::json::exception& e) {
    throw ProtocolError(std::string("invalid ") + what + ": malformed JSON (" + e.what() + ")");
  }
  return builder.take();
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

// Whether `meta` describes the cached schema. A sender may order object members
// differently from a local consolidate() (JSON does not fix the order), so equality is
// checked order-insensitively, once per distinct metadata object (then remembered).
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
      // The same bound as consolidated metadata (layout.cpp): a dim fits an int64.
      if (d.get<uint64_t>() > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw bad(what + " dim too large");
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
    if (key == e.end() || !key->is_array() || key->empty() || key->size() > limits_.max_depth + 1)
      throw bad(where + ": \"key\" must be a non-empty list of at most max_depth + 1 = " +
                std::to_string(limits_.max_depth + 1) + " strings");
    for (const Json& part : *key)
      if (!part.is_string() || part.get_ref<const std::string&>().empty())
        throw bad(where + ": key parts must be non-empty strings");
    auto type = e.find("type");
    if (type == e.end() || !type->is_string()) throw bad(where + ": missing \"type\"");
    // Received values obey the limit a sender obeys, so what arrives can be sent on.
    auto too_deep = [&] {
      return bad(where + " (key " + Key(key->get<std::vector<std::string>>()).str() +
                 "): " + value_depth_rule(limits_));
    };
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
      auto v = e.find("value");
      if (v == e.end()) throw bad(where + ": missing \"value\"");
      if (value_deeper_than(*v, limits_.max_depth)) throw too_deep();
    } else if (*type == "non_tensor_stack") {
      auto b = e.find("batch_size");
      auto v = e.find("values");
      auto sd = e.find("stack_dim");
      if (b == e.end() || v == e.end() || !v->is_array() || sd == e.end() ||
          !sd->is_number_integer())
        throw bad(where + ": a non_tensor_stack needs batch_size, stack_dim and values");
      shape_of(*b, where + " batch_size");
      for (const Json& x : *v)
        if (value_deeper_than(x, limits_.max_depth)) throw too_deep();
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
  // What prepare() leaves for its kind of message; a default or reset Incoming has none.
  const bool prepared =
      in.header.kind == MessageKind::Storage ? in.target != nullptr
      : in.header.kind == MessageKind::Control
          ? true
          : in.result.has_value() &&
                (in.header.kind != MessageKind::SchemaAndStorage || in.new_layout.has_value());
  if (!prepared)
    throw Error("Decoder::finish: the Incoming was not prepared (call prepare() first)");
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
