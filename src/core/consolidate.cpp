#include "tensorwire/core/consolidate.h"

#include <cstring>

#include "core/stack_layout.h"

namespace tensorwire {

namespace {

Json shape_json(const Shape& s) {
  Json a = Json::array();
  for (int64_t d : s) a.push_back(d);
  return a;
}

Json device_json(const std::optional<Device>& d) {
  return d ? Json(d->str()) : Json(nullptr);
}

// tensordict writes a NonTensorStack as a child dict of class "NonTensorStack" whose
// elements are keyed "0", "1", ...; elements of a multi-dim stack are stacks themselves.
Json stack_metadata(const NonTensorStack& st, size_t dim, size_t first, int64_t stack_dim) {
  Json node;
  node["cls"] = "NonTensorStack";
  node["non_tensors"] = Json::object();
  node["leaves"] = Json::object();
  node["cls_metadata"] = {
      {"stack_dim", stack_dim}, {"stack_dim_name", nullptr}, {"is_locked", false}};
  const int64_t n = st.batch_size[dim];
  size_t per = 1;
  for (size_t d = dim + 1; d < st.batch_size.size(); ++d)
    per *= static_cast<size_t>(st.batch_size[d]);
  for (int64_t i = 0; i < n; ++i) {
    std::string key = std::to_string(i);
    if (dim + 1 == st.batch_size.size())
      node["non_tensors"][key] =
          Json::array({st.values[first + static_cast<size_t>(i)], Json::array(), nullptr});
    else
      node[key] = stack_metadata(st, dim + 1, first + static_cast<size_t>(i) * per, 0);
  }
  return node;
}

// Sub-dicts are keys of their parent's metadata object, beside the fixed keys; a child
// with one of those names cannot be represented (tensordict has the same limit).
void check_child_name(const std::string& name) {
  for (const char* reserved : {"cls", "leaves", "non_tensors", "cls_metadata", "size"})
    if (name == reserved)
      throw ValueError("consolidate: a nested TensorDict cannot be named '" + name +
                       "' (reserved by the consolidated metadata format)");
}

// Appends a member to a JSON object without ordered_json's operator[], whose lookup is a
// linear search (quadratic over a dict's entries). Only for names known to be new: keys in
// a TensorDict are unique, and check_child_name() keeps children off the fixed keys.
Json& append_member(Json& object, const std::string& name, Json value) {
  auto& members = object.get_ref<Json::object_t&>();
  members.emplace_back(name, std::move(value));
  return members.back().second;
}

// "'a' > 'b' > ... > 'z'": the path to a too-deep dict, shortened (it can be thousands of
// levels long).
std::string path_str(const std::vector<std::string>& path) {
  std::string out;
  for (size_t i = 0; i < path.size(); ++i) {
    if (i == 3 && path.size() > 5) {
      out += " > ...";
      i = path.size() - 2;
      continue;
    }
    out += (i ? " > '" : "'") + path[i] + "'";
  }
  return out;
}

void plan_node(const TensorDict& td, const ConsolidateOptions& opt, ConsolidatedPlan& plan,
               Json& node, std::vector<std::string>& path) {
  if (path.size() > opt.max_depth)
    throw ValueError("consolidate: the TensorDict at " + path_str(path) + " is nested " +
                     std::to_string(path.size()) + " levels deep, more than the limit of " +
                     std::to_string(opt.max_depth) +
                     " (ConsolidateOptions::max_depth; a receiver accepts "
                     "wire::Limits::max_depth, both default to kMaxDepth)");
  node["cls"] = "TensorDict";
  node["non_tensors"] = Json::object();
  node["leaves"] = Json::object();
  Json names = Json::array();
  for (const auto& n : td.names()) names.push_back(n ? Json(*n) : Json(nullptr));
  node["cls_metadata"] = {{"device", device_json(td.device())},
                          {"names", std::move(names)},
                          {"batch_size", shape_json(td.batch_size())},
                          {"is_locked", td.is_locked()}};
  // Leaves and non-tensors are gathered apart and moved in at the end: no references into
  // `node` are held across insertions (ordered_json stores members in a vector, so adding
  // a child may move them). Reserving up front matters: a reallocation copies every
  // member, as the pair's const key makes it not nothrow-movable.
  Json leaves = Json::object(), non_tensors = Json::object();
  leaves.get_ref<Json::object_t&>().reserve(td.size());
  node.get_ref<Json::object_t&>().reserve(node.size() + td.size());
  for (const auto& [name, e] : td.items()) {
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      if (!t.device().is_cpu())
        throw ValueError("consolidate: key '" + name + "' is on " + t.device().str() +
                         "; only CPU tensors can be consolidated");
      const size_t n = t.nbytes();
      const size_t pad = (opt.alignment - n % opt.alignment) % opt.alignment;
      const size_t start = plan.total_bytes;
      plan.offsets.push_back(start);
      plan.nbytes.push_back(n);
      plan.total_bytes = start + n + pad;
      append_member(leaves, name,
                    Json::array({std::string(dtype_name(t.dtype())), shape_json(t.shape()), start,
                                 plan.total_bytes, pad}));
    } else if (e.is_tensordict()) {
      check_child_name(name);
      path.push_back(name);
      plan_node(e.tensordict(), opt, plan, append_member(node, name, Json()), path);
      path.pop_back();
    } else if (e.is_non_tensor()) {
      check_value_depth(e.non_tensor().value, opt.max_depth, "consolidate: key '" + name + "'");
      append_member(non_tensors, name,
                    Json::array({e.non_tensor().value, shape_json(td.batch_size()),
                                 device_json(td.device())}));
    } else {
      const NonTensorStack& st = e.non_tensor_stack();
      check_child_name(name);
      // Each dim of a stack is one more level of nested stacks in the metadata.
      if (path.size() + st.batch_size.size() > opt.max_depth)
        throw ValueError("consolidate: the non-tensor stack '" + name + "' with " +
                         std::to_string(st.batch_size.size()) + " dims at depth " +
                         std::to_string(path.size()) + " nests deeper than the limit of " +
                         std::to_string(opt.max_depth) + " (ConsolidateOptions::max_depth)");
      for (const Json& v : st.values)
        check_value_depth(v, opt.max_depth, "consolidate: key '" + name + "'");
      // Its elements in the metadata are the slices along stack_dim (core/stack_layout.h).
      append_member(
          node, name,
          st.stack_dim == 0
              ? stack_metadata(st, 0, 0, 0)
              : stack_metadata(detail::move_stack_dim(st, static_cast<size_t>(st.stack_dim), 0), 0,
                               0, st.stack_dim));
    }
  }
  node["non_tensors"] = std::move(non_tensors);
  node["leaves"] = std::move(leaves);
}

// Rebuilds the tree with every tensor replaced by a view into `c->storage`.
TensorDict view_node(const TensorDict& td, const std::shared_ptr<const Consolidated>& c,
                     const Json& node, const ConsolidatedPlan& plan, size_t& leaf) {
  TensorDict out(td.batch_size(), td.device());
  out.set_names(td.names());
  for (const auto& [name, e] : td.items()) {
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      out.set(name, Tensor::view(c->storage, plan.offsets[leaf++], t.shape(), t.dtype()));
    } else if (e.is_tensordict()) {
      out.set(name, view_node(e.tensordict(), c, node[name], plan, leaf));
    } else {
      out.set(name, e);
    }
  }
  out.attach_consolidated_(c, &node);
  return out;
}

bool shares_consolidation(const TensorDict& td, const Consolidated* c) noexcept {
  if (td.consolidated().get() != c) return false;
  for (const auto& [name, e] : td.items())
    if (e.is_tensordict() && !shares_consolidation(e.tensordict(), c)) return false;
  return true;
}

}  // namespace

bool is_consolidated_root(const TensorDict& td) noexcept {
  const auto& c = td.consolidated();
  return c && td.consolidated_metadata() == c->metadata.get() && shares_consolidation(td, c.get());
}

ConsolidatedPlan plan_consolidation(const TensorDict& td, const ConsolidateOptions& options) {
  if (options.alignment == 0 || (options.alignment & (options.alignment - 1)) != 0)
    throw ValueError("consolidate: alignment " + std::to_string(options.alignment) +
                     " is not a power of two");
  // Less would start a leaf of 8-byte elements where it cannot be viewed: what came out
  // could not be read back, here (load, a pickle) or by tensordict.
  if (options.alignment < 8)
    throw ValueError("consolidate: alignment " + std::to_string(options.alignment) +
                     " is below 8 (every leaf must start where its elements can be viewed; "
                     "tensordict uses 8)");
  ConsolidatedPlan plan;
  std::vector<std::string> path;
  plan_node(td, options, plan, plan.metadata, path);
  return plan;
}

void pack(const TensorDict& td, const ConsolidatedPlan& plan, std::byte* dst) {
  for_each_placed_leaf(td, plan, [&](const Tensor& t, size_t start, size_t end) {
    t.copy_to(dst + start);
    // Zero the padding so a storage never carries stale heap bytes over the wire.
    if (end > start + t.nbytes())
      std::memset(dst + start + t.nbytes(), 0, end - start - t.nbytes());
  });
}

TensorDict consolidate(const TensorDict& td, const ConsolidateOptions& options) {
  if (is_consolidated_root(td)) return td;
  ConsolidatedPlan plan = plan_consolidation(td, options);
  auto c = std::make_shared<Consolidated>();
  c->storage = Storage::allocate(plan.total_bytes, 64);
  pack(td, plan, c->storage.data());
  c->metadata = std::make_shared<const Json>(std::move(plan.metadata));
  size_t leaf = 0;
  TensorDict out = view_node(td, c, *c->metadata, plan, leaf);
  out.lock_();
  return out;
}

}  // namespace tensorwire
