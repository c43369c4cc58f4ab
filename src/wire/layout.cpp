// Validation of consolidated metadata (tensordict's format) from files and the wire.
// Every rule here protects a later step: shapes and offsets are checked so that the
// views instantiate() builds lie inside the storage and never overlap.
#include "tensorwire/wire/layout.h"

#include <algorithm>
#include <charconv>
#include <limits>
#include <unordered_set>

#include "core/stack_layout.h"

namespace tensorwire::wire {

struct ConsolidatedLayout::Node {
  enum class Kind { Leaf, NonTensor, Stack, Child };
  struct Item {
    std::string name;
    Kind kind;
    DType dtype{};
    Shape shape;
    uint64_t start = 0;
    Json value;
    NonTensorStack stack;
    std::shared_ptr<Node> child;
    uint64_t order = 0;  // first byte offset, to recover insertion order
  };
  Shape batch_size;
  std::optional<Device> device;
  std::vector<std::optional<std::string>> names;
  bool is_locked = false;
  std::vector<Item> items;
  const Json* meta = nullptr;
};

namespace {

constexpr uint64_t kNoOffset = std::numeric_limits<uint64_t>::max();

struct Parser {
  const Limits& limits;
  std::optional<uint64_t> storage_bytes;
  uint64_t total = 0;
  size_t entries = 0;
  size_t num_leaves = 0;  // tensor leaves seen
  struct Range {
    uint64_t start, stop;  // [start, stop) of one leaf
    std::string path;
  };
  std::vector<Range> ranges;

  [[noreturn]] void bad(const std::string& path, const std::string& rule) const {
    throw ProtocolError("invalid consolidated metadata at '" + (path.empty() ? "<root>" : path) +
                        "': " + rule);
  }

  const Json& field(const Json& node, const char* name, const std::string& path) const {
    auto it = node.find(name);
    if (it == node.end()) bad(path, std::string("missing \"") + name + "\"");
    return *it;
  }

  uint64_t as_u64(const Json& v, const std::string& path, const char* what) const {
    if (!v.is_number_integer() ||
        (v.is_number_integer() && !v.is_number_unsigned() && v.get<int64_t>() < 0))
      bad(path, std::string(what) + " must be a non-negative integer");
    return v.get<uint64_t>();
  }

  Shape as_shape(const Json& v, const std::string& path, const char* what) const {
    if (!v.is_array()) bad(path, std::string(what) + " must be a list of integers");
    if (v.size() > limits.max_dims)
      bad(path, std::string(what) + " has " + std::to_string(v.size()) + " dims, limit is " +
                    std::to_string(limits.max_dims));
    Shape s;
    s.reserve(v.size());
    for (const Json& d : v) {
      uint64_t x = as_u64(d, path, what);
      if (x > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        bad(path, std::string(what) + " dim too large");
      s.push_back(static_cast<int64_t>(x));
    }
    try {
      checked_numel(s);
    } catch (const ValueError& e) {
      bad(path, std::string(what) + ": " + e.what());
    }
    return s;
  }

  std::optional<Device> as_device(const Json& v, const std::string& path) const {
    if (v.is_null()) return std::nullopt;
    if (!v.is_string()) bad(path, "device must be a string or null");
    auto d = parse_device(v.get_ref<const std::string&>());
    if (!d) bad(path, "unknown device '" + v.get<std::string>() + "'");
    // Bytes land in host memory here, whatever the sender's device was.
    return Device::cpu();
  }

  void count_entry(const std::string& path) {
    if (++entries > limits.max_leaves)
      bad(path, "more than " + std::to_string(limits.max_leaves) + " entries (max_leaves)");
  }

  static bool has_prefix(const Shape& s, const Shape& p) {
    return s.size() >= p.size() && std::equal(p.begin(), p.end(), s.begin());
  }

  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }

  void check_object(const Json& node, const std::string& path) const {
    if (!node.is_object()) bad(path, "must be a JSON object");
  }

  std::shared_ptr<ConsolidatedLayout::Node> parse_td(const Json& node, const std::string& path,
                                                     uint32_t depth, const Shape* parent_batch) {
    using Node = ConsolidatedLayout::Node;
    check_object(node, path);
    if (depth > limits.max_depth)
      bad(path, "nesting deeper than " + std::to_string(limits.max_depth) + " (max_depth)");
    const Json& cls = field(node, "cls", path);
    if (!cls.is_string() || cls.get_ref<const std::string&>() != "TensorDict")
      bad(path,
          "cls " + cls.dump() + " is not supported (only \"TensorDict\" and \"NonTensorStack\")");
    auto out = std::make_shared<Node>();
    out->meta = &node;
    const Json& cm = field(node, "cls_metadata", path);
    check_object(cm, path + " cls_metadata");
    out->batch_size = as_shape(field(cm, "batch_size", path), path, "batch_size");
    if (parent_batch && !has_prefix(out->batch_size, *parent_batch))
      bad(path, "batch_size " + shape_str(out->batch_size) + " does not start with the parent's " +
                    shape_str(*parent_batch));
    if (auto it = cm.find("device"); it != cm.end()) out->device = as_device(*it, path);
    out->names.assign(out->batch_size.size(), std::nullopt);
    if (auto it = cm.find("names"); it != cm.end() && !it->is_null()) {
      if (!it->is_array() || it->size() != out->batch_size.size())
        bad(path, "names must be a list with one entry per batch dim");
      for (size_t i = 0; i < it->size(); ++i) {
        const Json& n = (*it)[i];
        if (n.is_string())
          out->names[i] = n.get<std::string>();
        else if (!n.is_null())
          bad(path, "names entries must be strings or null");
      }
    }
    if (auto it = cm.find("is_locked"); it != cm.end()) {
      if (!it->is_boolean()) bad(path, "is_locked must be a boolean");
      out->is_locked = it->get<bool>();
    }

    const Json& leaves = field(node, "leaves", path);
    check_object(leaves, path + " leaves");
    for (auto it = leaves.begin(); it != leaves.end(); ++it) {
      std::string p = join(path, it.key());
      count_entry(p);
      out->items.push_back(parse_leaf(it.key(), it.value(), p, out->batch_size));
    }
    const Json& nts = field(node, "non_tensors", path);
    check_object(nts, path + " non_tensors");
    for (auto it = nts.begin(); it != nts.end(); ++it) {
      std::string p = join(path, it.key());
      count_entry(p);
      Node::Item item;
      item.name = it.key();
      item.kind = Node::Kind::NonTensor;
      item.order = kNoOffset;
      const Json& v = it.value();
      if (!v.is_array() || v.size() != 3)
        bad(p, "a non-tensor entry must be [value, batch_size, device]");
      as_shape(v[1], p, "non-tensor batch_size");
      as_device(v[2], p);
      if (value_deeper_than(v[0], limits.max_depth)) bad(p, value_depth_rule(limits));
      item.value = v[0];
      out->items.push_back(std::move(item));
    }
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string& k = it.key();
      if (k == "cls" || k == "leaves" || k == "non_tensors" || k == "cls_metadata" || k == "size")
        continue;
      std::string p = join(path, k);
      count_entry(p);
      check_object(it.value(), p);
      Node::Item item;
      item.name = k;
      const Json& ccls = field(it.value(), "cls", p);
      if (ccls.is_string() && ccls.get_ref<const std::string&>() == "NonTensorStack") {
        item.kind = Node::Kind::Stack;
        item.order = kNoOffset;
        item.stack = parse_stack(it.value(), p, depth + 1);
        if (!has_prefix(item.stack.batch_size, out->batch_size))
          bad(p, "non-tensor stack of batch_size " + shape_str(item.stack.batch_size) +
                     " does not start with the parent's " + shape_str(out->batch_size));
      } else {
        item.kind = Node::Kind::Child;
        item.child = parse_td(it.value(), p, depth + 1, &out->batch_size);
        item.order = kNoOffset;
        for (const auto& ci : item.child->items) item.order = std::min(item.order, ci.order);
      }
      out->items.push_back(std::move(item));
    }
    std::unordered_set<std::string_view> seen;  // O(n): a dict may hold many keys
    for (const auto& item : out->items) {
      if (item.name.empty()) bad(path, "empty key");
      if (!seen.insert(item.name).second) bad(join(path, item.name), "key appears twice");
    }
    // Tensors and sub-dicts in storage order (= the sender's insertion order); entries
    // with no bytes keep their metadata order after them.
    std::stable_sort(out->items.begin(), out->items.end(),
                     [](const Node::Item& a, const Node::Item& b) { return a.order < b.order; });
    return out;
  }

  ConsolidatedLayout::Node::Item parse_leaf(const std::string& name, const Json& v,
                                            const std::string& p, const Shape& batch) {
    using Node = ConsolidatedLayout::Node;
    if (!v.is_array() || v.size() < 5) bad(p, "a leaf must be [dtype, shape, start, stop, pad]");
    if (v.size() > 5) bad(p, "ragged (nested-jagged) leaves are not supported");
    Node::Item item;
    item.name = name;
    item.kind = Node::Kind::Leaf;
    if (!v[0].is_string()) bad(p, "dtype must be a string");
    auto dt = parse_dtype(v[0].get_ref<const std::string&>());
    if (!dt) bad(p, "unknown dtype '" + v[0].get<std::string>() + "'");
    item.dtype = *dt;
    item.shape = as_shape(v[1], p, "shape");
    if (!has_prefix(item.shape, batch))
      bad(p,
          "shape " + shape_str(item.shape) + " does not start with batch_size " + shape_str(batch));
    const uint64_t start = as_u64(v[2], p, "start");
    const uint64_t stop = as_u64(v[3], p, "stop");
    const uint64_t pad = as_u64(v[4], p, "pad");
    const uint64_t numel = static_cast<uint64_t>(checked_numel(item.shape));
    const uint64_t item_size = itemsize(item.dtype);
    if (numel > std::numeric_limits<uint64_t>::max() / item_size)
      bad(p, "shape x itemsize overflows");
    const uint64_t nbytes = numel * item_size;
    if (stop < start)
      bad(p, "stop " + std::to_string(stop) + " is before start " + std::to_string(start));
    if (pad > stop - start || stop - start - pad != nbytes)
      bad(p, "stop - start - pad = " + std::to_string(stop - start) + " - " + std::to_string(pad) +
                 " must equal the leaf's size " + std::to_string(nbytes));
    if (start % std::min<uint64_t>(item_size, 8) != 0)
      bad(p, "start " + std::to_string(start) + " is not aligned for " + v[0].get<std::string>());
    if (storage_bytes && stop > *storage_bytes)
      bad(p, "leaf ends at byte " + std::to_string(stop) + ", past the storage's " +
                 std::to_string(*storage_bytes) + " bytes");
    if (stop > total) total = stop;
    ranges.push_back({start, stop, p});
    ++num_leaves;
    item.start = start;
    item.order = start;
    return item;
  }

  // A NonTensorStack child: elements "0".."n-1", as non-tensor entries (a 1-d stack) or as
  // nested NonTensorStack children (one more dim each).
  NonTensorStack parse_stack(const Json& node, const std::string& path, uint32_t depth) {
    if (depth > limits.max_depth)
      bad(path, "nesting deeper than " + std::to_string(limits.max_depth) + " (max_depth)");
    NonTensorStack st;
    const Json& cm = field(node, "cls_metadata", path);
    check_object(cm, path + " cls_metadata");
    if (auto it = cm.find("stack_dim"); it != cm.end())
      st.stack_dim = static_cast<int64_t>(as_u64(*it, path, "stack_dim"));
    const Json& leaves = field(node, "leaves", path);
    if (!leaves.is_object() || !leaves.empty())
      bad(path, "a NonTensorStack cannot hold tensor leaves");
    const Json& nts = field(node, "non_tensors", path);
    check_object(nts, path + " non_tensors");
    // Elements are keyed "0".."n-1": each key is placed by its index in one pass (a lookup
    // per index would be quadratic in the stack's length).
    auto index_of = [&](const std::string& k) {
      size_t i = 0;
      auto [p, ec] = std::from_chars(k.data(), k.data() + k.size(), i);
      if (ec != std::errc() || p != k.data() + k.size() || (k.size() > 1 && k[0] == '0'))
        bad(join(path, k), "stack elements must be keyed by their index (0, 1, ...)");
      return i;
    };
    std::vector<const Json*> children;
    for (auto it = node.begin(); it != node.end(); ++it) {
      const std::string& k = it.key();
      if (k == "cls" || k == "leaves" || k == "non_tensors" || k == "cls_metadata" || k == "size")
        continue;
      children.push_back(&it.value());
    }
    if (!nts.empty() && !children.empty())
      bad(path, "a NonTensorStack mixes values and sub-stacks");
    const size_t n = nts.empty() ? children.size() : nts.size();
    std::vector<const Json*> elements(n, nullptr);
    for (auto it = (nts.empty() ? node.begin() : nts.begin());
         it != (nts.empty() ? node.end() : nts.end()); ++it) {
      const std::string& k = it.key();
      if (nts.empty() &&
          (k == "cls" || k == "leaves" || k == "non_tensors" || k == "cls_metadata" || k == "size"))
        continue;
      size_t i = index_of(k);
      if (i >= n) continue;  // then some index below n is missing: reported next
      if (elements[i]) bad(join(path, k), "element appears twice");
      elements[i] = &it.value();
    }
    for (size_t i = 0; i < n; ++i)
      if (!elements[i]) bad(path, "element " + std::to_string(i) + " missing");
    if (!children.empty()) {
      Shape inner;
      for (size_t i = 0; i < n; ++i) {
        const std::string where = join(path, std::to_string(i));
        count_entry(where);
        const Json& child = *elements[i];
        check_object(child, where);
        const Json& ccls = field(child, "cls", where);
        if (!ccls.is_string() || ccls.get_ref<const std::string&>() != "NonTensorStack")
          bad(where, "elements of a stack must be NonTensorStack or values");
        NonTensorStack sub = parse_stack(child, where, depth + 1);
        if (i == 0)
          inner = sub.batch_size;
        else if (sub.batch_size != inner)
          bad(path, "stack elements have different shapes");
        st.values.insert(st.values.end(), sub.values.begin(), sub.values.end());
      }
      st.batch_size = {static_cast<int64_t>(n)};
      st.batch_size.insert(st.batch_size.end(), inner.begin(), inner.end());
    } else {
      for (size_t i = 0; i < n; ++i) {
        const std::string where = join(path, std::to_string(i));
        count_entry(where);
        const Json& e = *elements[i];
        if (!e.is_array() || e.size() != 3)
          bad(where, "a non-tensor entry must be [value, batch_size, device]");
        if (value_deeper_than(e[0], limits.max_depth)) bad(where, value_depth_rule(limits));
        st.values.push_back(e[0]);
      }
      st.batch_size = {static_cast<int64_t>(n)};
    }
    if (st.batch_size.size() > limits.max_dims) bad(path, "too many dims");
    // stack_dim arrives as a u64: one past INT64_MAX reads as negative here.
    if (st.stack_dim < 0 || st.stack_dim >= static_cast<int64_t>(st.batch_size.size()))
      bad(path, "stack_dim out of range");
    // The elements read are the slices along stack_dim (core/stack_layout.h): that dim back
    // where it belongs.
    if (st.stack_dim > 0) st = detail::move_stack_dim(st, 0, static_cast<size_t>(st.stack_dim));
    return st;
  }
};

TensorDict build(const ConsolidatedLayout::Node& node, const Storage& storage,
                 const std::shared_ptr<const Consolidated>& c) {
  using Kind = ConsolidatedLayout::Node::Kind;
  TensorDict td(node.batch_size, node.device);
  td.set_names(node.names);
  for (const auto& item : node.items) {
    switch (item.kind) {
      case Kind::Leaf:
        td.set(item.name, Tensor::view(storage, item.start, item.shape, item.dtype));
        break;
      case Kind::NonTensor:
        td.set(item.name, NonTensor{item.value});
        break;
      case Kind::Stack:
        td.set(item.name, item.stack);
        break;
      case Kind::Child:
        td.set(item.name, build(*item.child, storage, c));
        break;
    }
  }
  td.attach_consolidated_(c, node.meta);
  return td;
}

}  // namespace

ConsolidatedLayout ConsolidatedLayout::parse(Json metadata, const Limits& limits,
                                             std::optional<uint64_t> storage_bytes) {
  ConsolidatedLayout layout;
  auto meta = std::make_shared<const Json>(std::move(metadata));
  Parser p{limits, storage_bytes};
  layout.root_ = p.parse_td(*meta, "", 0, nullptr);
  std::sort(p.ranges.begin(), p.ranges.end(), [](const Parser::Range& a, const Parser::Range& b) {
    return a.start != b.start ? a.start < b.start : a.stop < b.stop;
  });
  // Compare each non-empty leaf with the furthest-reaching one before it: an empty leaf
  // between two overlapping ones must not hide the overlap.
  const Parser::Range* prev = nullptr;
  for (const Parser::Range& r : p.ranges) {
    if (r.start == r.stop) continue;
    if (prev && r.start < prev->stop)
      p.bad(r.path, "overlaps leaf '" + prev->path + "' (bytes " + std::to_string(r.start) + ".." +
                        std::to_string(prev->stop) + ")");
    if (!prev || r.stop > prev->stop) prev = &r;
  }
  layout.total_bytes_ = p.total;
  layout.num_leaves_ = p.num_leaves;
  layout.shared_ = std::make_shared<Consolidated>();
  layout.shared_->metadata = std::move(meta);
  return layout;
}

TensorDict ConsolidatedLayout::instantiate(Storage storage) const {
  if (storage.nbytes() < total_bytes_)
    throw ValueError("instantiate: storage of " + std::to_string(storage.nbytes()) +
                     " bytes is smaller than the layout's " + std::to_string(total_bytes_));
  auto c = std::make_shared<Consolidated>();
  c->storage = storage;
  c->metadata = shared_->metadata;
  return build(*root_, storage, c);
}

TensorDict view_consolidated(Storage storage, Json metadata, const Limits& limits) {
  const auto layout = ConsolidatedLayout::parse(std::move(metadata), limits, storage.nbytes());
  TensorDict td = layout.instantiate(std::move(storage));
  td.lock_();
  return td;
}

}  // namespace tensorwire::wire
