#include "tensorwire/wire/datapoint.h"

#include <algorithm>
#include <cstring>
#include <unordered_map>

namespace tensorwire::wire {

namespace {

// Names a nested container may not take: the consolidated metadata's own fields share
// the node object with the children.
constexpr std::string_view kReserved[] = {"cls", "leaves", "non_tensors", "cls_metadata", "size"};

bool is_container(char c) {
  return c == 'l' || c == 't' || c == 'd' || c == 'o';
}

Tensor byte_vector(std::span<const std::byte> b) {
  Tensor t = Tensor::empty({static_cast<int64_t>(b.size())}, DType::UInt8);
  if (!b.empty()) std::memcpy(t.data(), b.data(), b.size());
  return t;
}

template <class T>
Tensor scalar(T v) {
  Tensor t = Tensor::empty({}, dtype_of<T>::value);
  *t.data<T>() = v;
  return t;
}

// ---- the structure of a consolidated node ----

[[noreturn]] void bad(const std::string& path, const std::string& rule) {
  throw ProtocolError("datapoint " + (path.empty() ? std::string("root") : path) + ": " + rule);
}

std::string join(const std::string& path, const std::string& key) {
  return path.empty() ? "'" + key + "'" : path + "/'" + key + "'";
}

bool is_count(const Json& v) {
  return v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0);
}

const Json* member(const Json& node, const char* field) {
  auto it = node.find(field);
  return it == node.end() ? nullptr : &*it;
}

// A node's entries by name, from the three places consolidated metadata puts them.
struct Entries {
  enum Where { Leaf, Value, Child };
  std::unordered_map<std::string_view, std::pair<Where, const Json*>> by_name;
};

Entries entries_of(const Json& node) {
  Entries out;
  auto add = [&](const Json& section, Entries::Where w) {
    for (auto it = section.begin(); it != section.end(); ++it)
      out.by_name.emplace(it.key(), std::make_pair(w, &it.value()));
  };
  add(*member(node, "leaves"), Entries::Leaf);
  add(*member(node, "non_tensors"), Entries::Value);
  for (auto it = node.begin(); it != node.end(); ++it) {
    const std::string& k = it.key();
    if (std::find(std::begin(kReserved), std::end(kReserved), k) != std::end(kReserved)) continue;
    out.by_name.emplace(k, std::make_pair(Entries::Child, &it.value()));
  }
  return out;
}

const char* expected_of(ElementKind k) {
  switch (k) {
    case ElementKind::Bool:
      return "a 0-d torch.bool leaf";
    case ElementKind::Int:
      return "a 0-d torch.int64 leaf";
    case ElementKind::Float:
      return "a 0-d torch.float64 leaf";
    case ElementKind::Scalar:
      return "a 0-d leaf";
    case ElementKind::Str:
    case ElementKind::Bytes:
    case ElementKind::Pickle:
      return "a 1-d torch.uint8 leaf";
    default:
      return "a leaf";
  }
}

struct StructureReader {
  uint64_t storage_bytes;
  bool allow_pickle;

  // nullptr: the node has no tag.
  std::unique_ptr<DatapointNode> node(const Json& meta, const std::string& path, int depth) {
    const Entries entries = entries_of(meta);
    auto tag_it = entries.by_name.find(kDatapointTag);
    if (tag_it == entries.by_name.end()) return nullptr;
    if (tag_it->second.first != Entries::Value)
      bad(path, "the tag '" + std::string(kDatapointTag) + "' must be a non-tensor value");
    const Json& tag = (*tag_it->second.second)[0];
    // "<container><kinds>", or for a dict ["d<kinds>", [keys]].
    const Json* keys = nullptr;
    const Json* kinds_json = &tag;
    if (tag.is_array()) {
      if (tag.size() != 2 || !tag[1].is_array())
        bad(path, "a tag that is an array must be [kinds string, [keys]]");
      kinds_json = &tag[0];
      keys = &tag[1];
    }
    if (!kinds_json->is_string()) bad(path, "the tag's kinds must be a string");
    const std::string& kinds = kinds_json->get_ref<const std::string&>();
    if (kinds.empty() || !is_container(kinds[0]))
      bad(path, "unknown container '" + kinds.substr(0, 1) + "' (expected l, t, d or o)");
    auto out = std::make_unique<DatapointNode>();
    out->container = static_cast<Container>(kinds[0]);
    const size_t n = kinds.size() - 1;
    if ((out->container == Container::Dict) != (keys != nullptr))
      bad(path, "a dict tag needs its keys, and only a dict tag has keys");
    if (keys && keys->size() != n)
      bad(path, std::to_string(n) + " kinds but " + std::to_string(keys->size()) + " keys");
    if (out->container == Container::Object && n != 1)
      bad(path, "an object container holds exactly one element, not " + std::to_string(n));
    if (entries.by_name.size() != n + 1)
      bad(path, "the tag lists " + std::to_string(n) + " elements but the node holds " +
                    std::to_string(entries.by_name.size() - 1) + " entries besides it");
    out->elements.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      DatapointElement e;
      if (keys) {
        if (!(*keys)[i].is_string())
          bad(path, "dict key " + std::to_string(i) + " is not a string");
        e.key = (*keys)[i].get<std::string>();
        if (e.key == kDatapointTag) bad(path, "a dict key may not be the tag's name");
      } else {
        e.key = std::to_string(i);
      }
      const std::string p = join(path, e.key);
      auto it = entries.by_name.find(e.key);
      if (it == entries.by_name.end()) bad(p, "listed by the tag but not in the node");
      element(e, kinds[i + 1], it->second.first, *it->second.second, p, depth);
      out->elements.push_back(std::move(e));
    }
    // Every entry is named once: n distinct keys found among n entries besides the tag.
    if (keys) {
      std::unordered_map<std::string_view, int> seen;
      for (const auto& e : out->elements)
        if (++seen[e.key] > 1) bad(join(path, e.key), "key appears twice in the tag");
    }
    return out;
  }

  void element(DatapointElement& e, char kind, Entries::Where where, const Json& v,
               const std::string& p, int depth) {
    e.kind = static_cast<ElementKind>(kind);
    switch (e.kind) {
      case ElementKind::None:
        if (where != Entries::Value || !v[0].is_null()) bad(p, "kind 'N' needs a null value");
        return;
      case ElementKind::Node: {
        if (where != Entries::Child) bad(p, "kind 'c' needs a nested node");
        const Json* cls = member(v, "cls");
        if (!cls || *cls != "TensorDict") bad(p, "kind 'c' needs a TensorDict node");
        if (depth + 1 > kMaxDatapointDepth)
          bad(p, "containers nested deeper than " + std::to_string(kMaxDatapointDepth));
        e.child = node(v, p, depth + 1);
        if (!e.child) bad(p, "a nested container without a tag");
        return;
      }
      case ElementKind::Array:
      case ElementKind::Torch:
      case ElementKind::Bool:
      case ElementKind::Int:
      case ElementKind::Float:
      case ElementKind::Scalar:
      case ElementKind::Str:
      case ElementKind::Bytes:
      case ElementKind::Pickle:
        break;
      default:
        bad(p, std::string("unknown element kind '") + kind + "'");
    }
    if (e.kind == ElementKind::Pickle && !allow_pickle)
      bad(p, "a pickled object, and this receiver does not unpickle (allow_pickle=False)");
    if (where != Entries::Leaf) bad(p, std::string("kind '") + kind + "' needs a tensor leaf");
    // [dtype, shape, start, stop, pad], already checked by the layout: re-derived here so
    // that the decoder relies on nothing it did not see.
    if (!v.is_array() || v.size() < 3 || !v[0].is_string() || !v[1].is_array() || !is_count(v[2]))
      bad(p, "a leaf must be [dtype, shape, start, ...]");
    auto dt = parse_dtype(v[0].get_ref<const std::string&>());
    if (!dt) bad(p, "unknown dtype " + v[0].dump());
    e.dtype = *dt;
    Shape shape;
    for (const Json& d : v[1]) {
      if (!is_count(d) || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        bad(p, "shape entries must be integers in [0, 2^63)");
      shape.push_back(d.get<int64_t>());
    }
    // A 0 anywhere makes the leaf empty, whatever the other dims (shape (1000, 0) of a
    // 16-byte storage is valid), so the product is taken whole, not bounded as it goes.
    uint64_t numel = UINT64_MAX;  // more than 2^63 elements: caught below
    try {
      numel = static_cast<uint64_t>(checked_numel(shape));
    } catch (const ValueError&) {
    }
    if (numel > storage_bytes / itemsize(e.dtype))
      bad(p, "a leaf larger than the storage's " + std::to_string(storage_bytes) + " bytes");
    e.shape.assign(shape.begin(), shape.end());
    e.nbytes = numel * itemsize(e.dtype);
    e.offset = v[2].get<uint64_t>();
    if (e.offset > storage_bytes || e.nbytes > storage_bytes - e.offset)
      bad(p, "leaf bytes [" + std::to_string(e.offset) + ", +" + std::to_string(e.nbytes) +
                 ") past the storage's " + std::to_string(storage_bytes) + " bytes");
    auto need = [&](std::optional<DType> dtype, size_t dims) {
      if ((dtype && e.dtype != *dtype) || e.shape.size() != dims)
        bad(p, std::string("kind '") + kind + "' needs " + expected_of(e.kind) + ", got " +
                   std::string(dtype_name(e.dtype)) + " of " + std::to_string(e.shape.size()) +
                   " dims");
    };
    switch (e.kind) {
      case ElementKind::Bool:
        need(DType::Bool, 0);
        break;
      case ElementKind::Int:
        need(DType::Int64, 0);
        break;
      case ElementKind::Float:
        need(DType::Float64, 0);
        break;
      case ElementKind::Scalar:
        need(std::nullopt, 0);
        break;
      case ElementKind::Str:
      case ElementKind::Bytes:
      case ElementKind::Pickle:
        need(DType::UInt8, 1);
        break;
      default:
        break;
    }
  }
};

// RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF.
bool valid_utf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const auto* end = p + s.size();
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
      continue;
    }
    int n;
    uint32_t cp;
    if (c >= 0xC2 && c <= 0xDF) {
      n = 1;
      cp = c & 0x1F;
    } else if (c >= 0xE0 && c <= 0xEF) {
      n = 2;
      cp = c & 0x0F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      n = 3;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (end - p <= n) return false;
    for (int i = 1; i <= n; ++i) {
      if ((p[i] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i] & 0x3F);
    }
    if ((n == 2 && (cp < 0x800 || (cp >= 0xD800 && cp <= 0xDFFF))) ||
        (n == 3 && (cp < 0x10000 || cp > 0x10FFFF)))
      return false;
    p += n + 1;
  }
  return true;
}

}  // namespace

// ---- DatapointEncoder ----

DatapointEncoder::DatapointEncoder(Container container)
    : kinds_(1, static_cast<char>(container)), keys_(Json::array()) {}

bool DatapointEncoder::valid_key(std::string_view key, bool container) noexcept {
  if (key.empty() || key == kDatapointTag || key.find('\0') != std::string_view::npos) return false;
  if (container)
    for (std::string_view r : kReserved)
      if (key == r) return false;
  return true;
}

void DatapointEncoder::check_not_finished() const {
  // finish() moved the kinds out: what is added now would be lost, or describe nothing.
  if (kinds_.empty()) throw Error("DatapointEncoder: used after finish()");
}

std::string DatapointEncoder::name(std::string key, bool container) {
  check_not_finished();
  const auto c = static_cast<Container>(kinds_[0]);
  if (c != Container::Dict) {
    if (!key.empty()) throw ValueError("datapoint: list, tuple and object elements take no key");
    if (c == Container::Object && size() == 1)
      throw ValueError("datapoint: an object container holds exactly one element");
    return std::to_string(size());
  }
  if (!valid_key(key, container))
    throw ValueError("datapoint: dict key '" + key +
                     "' cannot be encoded (empty, holding NUL, the tag's name, or a metadata "
                     "field name for a nested container)");
  // Else the second leaf replaced the first while the tag listed both: a datapoint the
  // decoder refuses.
  if (std::find(keys_.begin(), keys_.end(), key) != keys_.end())
    throw ValueError("datapoint: dict key '" + key + "' is given twice");
  keys_.push_back(key);
  return key;
}

void DatapointEncoder::add(std::string key, ElementKind kind, Tensor t) {
  std::string n = name(std::move(key), false);
  td_.set(n, std::move(t));
  kinds_ += static_cast<char>(kind);
}

void DatapointEncoder::add_array(std::string key, Tensor t, bool torch) {
  add(std::move(key), torch ? ElementKind::Torch : ElementKind::Array, std::move(t));
}
void DatapointEncoder::add_scalar(std::string key, Tensor t) {
  if (t.dim() != 0)
    throw ValueError("datapoint: a scalar must be 0-d, got " + shape_str(t.shape()));
  add(std::move(key), ElementKind::Scalar, std::move(t));
}
void DatapointEncoder::add_bool(std::string key, bool v) {
  add(std::move(key), ElementKind::Bool, scalar<bool>(v));
}
void DatapointEncoder::add_int(std::string key, int64_t v) {
  add(std::move(key), ElementKind::Int, scalar<int64_t>(v));
}
void DatapointEncoder::add_float(std::string key, double v) {
  add(std::move(key), ElementKind::Float, scalar<double>(v));
}
void DatapointEncoder::add_str(std::string key, std::string_view utf8) {
  if (!valid_utf8(utf8)) throw ValueError("datapoint: a string that is not UTF-8");
  add(std::move(key), ElementKind::Str, byte_vector(std::as_bytes(std::span(utf8))));
}
void DatapointEncoder::add_bytes(std::string key, std::span<const std::byte> b) {
  add(std::move(key), ElementKind::Bytes, byte_vector(b));
}
void DatapointEncoder::add_pickle(std::string key, std::span<const std::byte> b) {
  add(std::move(key), ElementKind::Pickle, byte_vector(b));
}
void DatapointEncoder::add_none(std::string key) {
  std::string n = name(std::move(key), false);
  td_.set(n, NonTensor{nullptr});
  kinds_ += static_cast<char>(ElementKind::None);
}
void DatapointEncoder::add_node(std::string key, TensorDict node) {
  if (!node.contains(std::string(kDatapointTag)))
    throw ValueError("datapoint: a nested node must come from DatapointEncoder::finish()");
  std::string n = name(std::move(key), true);
  td_.set(n, std::move(node));
  kinds_ += static_cast<char>(ElementKind::Node);
}

TensorDict DatapointEncoder::finish() && {
  check_not_finished();
  if (static_cast<Container>(kinds_[0]) == Container::Object && size() != 1)
    throw ValueError("datapoint: an object container holds exactly one element");
  // A dict's keys are listed: the consolidated layout groups leaves, values and nested
  // nodes, so the entries alone do not keep their order.
  if (static_cast<Container>(kinds_[0]) == Container::Dict)
    td_.set(std::string(kDatapointTag),
            NonTensor{Json::array({std::move(kinds_), std::move(keys_)})});
  else
    td_.set(std::string(kDatapointTag), NonTensor{std::move(kinds_)});
  return std::move(td_);
}

// ---- DatapointDecoder ----

std::unique_ptr<const DatapointNode> DatapointDecoder::structure(const ConsolidatedLayout& layout,
                                                                 bool allow_pickle) {
  StructureReader r{layout.total_bytes(), allow_pickle};
  return r.node(layout.metadata(), "", 0);
}

void DatapointDecoder::check_values(const DatapointNode& root, const Storage& s) {
  for (const DatapointElement& e : root.elements) {
    if (e.kind == ElementKind::Str) (void)read_str(s, e);
    if (e.child) check_values(*e.child, s);
  }
}

bool DatapointDecoder::read_bool(const Storage& s, const DatapointElement& e) noexcept {
  return std::to_integer<uint8_t>(s.data()[e.offset]) != 0;
}
int64_t DatapointDecoder::read_int(const Storage& s, const DatapointElement& e) noexcept {
  int64_t v;
  std::memcpy(&v, s.data() + e.offset, sizeof v);
  return v;
}
double DatapointDecoder::read_float(const Storage& s, const DatapointElement& e) noexcept {
  double v;
  std::memcpy(&v, s.data() + e.offset, sizeof v);
  return v;
}
std::string_view DatapointDecoder::read_str(const Storage& s, const DatapointElement& e) {
  std::string_view v(reinterpret_cast<const char*>(s.data() + e.offset), e.nbytes);
  if (!valid_utf8(v)) bad("'" + e.key + "'", "kind 's' holds bytes that are not UTF-8");
  return v;
}
std::span<const std::byte> DatapointDecoder::read_bytes(const Storage& s,
                                                        const DatapointElement& e) noexcept {
  return {s.data() + e.offset, e.nbytes};
}

}  // namespace tensorwire::wire
