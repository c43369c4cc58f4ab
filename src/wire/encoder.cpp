#include "tensorwire/wire/encoder.h"

#include <algorithm>

#include "core/plan_cache.h"

namespace tensorwire::wire {

namespace {

Json shape_json(const Shape& s) {
  return Json(s);
}

void header_entries(const TensorDict& td, Json& entries, std::vector<std::string>& path,
                    uint32_t max_depth) {
  if (path.size() > max_depth)
    throw ValueError("send: the TensorDict at key " + Key(path).str() + " is nested " +
                     std::to_string(path.size()) + " levels deep, more than the limit of " +
                     std::to_string(max_depth) +
                     " (ConsolidateOptions::max_depth; a receiver accepts "
                     "wire::Limits::max_depth, both default to kMaxDepth)");
  for (const auto& [name, e] : td.items()) {
    path.push_back(name);
    Json entry;
    entry["key"] = path;
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      if (!t.device().is_cpu())
        throw ValueError("key '" + name + "' is on " + t.device().str() +
                         "; only CPU tensors can be sent");
      entry["type"] = "tensor";
      entry["dtype"] = std::string(dtype_name(t.dtype()));
      entry["shape"] = shape_json(t.shape());
      entries.push_back(std::move(entry));
    } else if (e.is_tensordict()) {
      entry["type"] = "dict";
      entry["batch_size"] = shape_json(e.tensordict().batch_size());
      entries.push_back(std::move(entry));
      header_entries(e.tensordict(), entries, path, max_depth);
    } else if (e.is_non_tensor()) {
      entry["type"] = "non_tensor";
      check_value_depth(e.non_tensor().value, max_depth, "send: key " + Key(path).str());
      entry["value"] = e.non_tensor().value;
      entries.push_back(std::move(entry));
    } else {
      const NonTensorStack& st = e.non_tensor_stack();
      entry["type"] = "non_tensor_stack";
      entry["batch_size"] = shape_json(st.batch_size);
      entry["stack_dim"] = st.stack_dim;
      for (const Json& v : st.values)
        check_value_depth(v, max_depth, "send: key " + Key(path).str());
      entry["values"] = st.values;
      entries.push_back(std::move(entry));
    }
    path.pop_back();
  }
}

}  // namespace

Json non_consolidated_header(const TensorDict& td, uint32_t max_depth) {
  Json h;
  h["batch_size"] = shape_json(td.batch_size());
  h["device"] = td.device() ? Json(td.device()->str()) : Json(nullptr);
  Json names = Json::array();
  for (const auto& n : td.names()) names.push_back(n ? Json(*n) : Json(nullptr));
  h["names"] = std::move(names);
  h["entries"] = Json::array();
  std::vector<std::string> path;
  header_entries(td, h["entries"], path, max_depth);
  return h;
}

Encoder::Encoder(Mode mode, ConsolidateOptions options)
    : mode_(mode), options_(options), plans_(std::make_unique<PlanCache>(options)) {}
Encoder::~Encoder() = default;
Encoder::Encoder(Encoder&&) noexcept = default;
Encoder& Encoder::operator=(Encoder&&) noexcept = default;

void Encoder::reset() noexcept {
  schema_id_ = 0;
  last_metadata_.clear();
  last_source_ = nullptr;
  schema_plan_ = 0;
}

void Encoder::finish_header(MessageKind kind, uint64_t payload_bytes) {
  msg_.header.kind = kind;
  msg_.header.flags = 0;
  msg_.header.schema_id = kind == MessageKind::NonConsolidated ? 0 : schema_id_;
  msg_.header.metadata_bytes = msg_.metadata.size();
  msg_.header.payload_bytes = payload_bytes;
  msg_.header_bytes = msg_.header.encode();
}

const OutMessage& Encoder::encode(const TensorDict& td) {
  if (!plans_) throw Error("this wire::Encoder was moved from");
  msg_.payload.clear();
  msg_.keepalive.clear();
  msg_.metadata.clear();
  if (mode_ == Mode::Consolidated)
    encode_consolidated(td);
  else
    encode_non_consolidated(td);
  return msg_;
}

void Encoder::encode_consolidated(const TensorDict& td) {
  size_t total;
  std::string metadata;
  bool same;
  if (is_consolidated_root(td)) {
    // Already one storage: send it as it is. The same metadata object means the same
    // layout, so the steady state costs no serialisation at all.
    const Consolidated& c = *td.consolidated();
    total = c.storage.nbytes();
    same = schema_id_ != 0 && c.metadata == last_source_;
    if (!same) {
      metadata = c.metadata->dump();
      same = schema_id_ != 0 && metadata == last_metadata_;
    }
    last_source_ = c.metadata;
    msg_.payload.emplace_back(c.storage.data(), total);
  } else {
    const ConsolidatedPlan& plan = plans_->plan(td);
    // The plan the last message was sent with: its metadata needs no serialising.
    same = schema_id_ != 0 && schema_plan_ == plans_->generation();
    if (!same) {
      metadata = plan.metadata.dump();
      same = schema_id_ != 0 && metadata == last_metadata_;
    }
    total = plan.total_bytes;
    last_source_ = nullptr;
    if (total > gather_max_ || !gather(td, plan)) {
      if (!same || staging_.nbytes() != total) staging_ = Storage::allocate(total, 64);
      pack(td, plan, staging_.data());
      msg_.payload.emplace_back(staging_.data(), total);
    }
  }
  if (same) {
    finish_header(MessageKind::Storage, total);
  } else {
    schema_id_ = next_schema_id_++;
    last_metadata_ = metadata;
    msg_.metadata = std::move(metadata);
    finish_header(MessageKind::SchemaAndStorage, total);
  }
  // Set once the schema is settled: an exception on the way leaves the generation of an
  // older plan here, and the next message compares metadata again.
  schema_plan_ = last_source_ ? 0 : plans_->generation();
}

bool Encoder::gather(const TensorDict& td, const ConsolidatedPlan& plan) {
  // Zeros for the padding between leaves (less than the alignment each).
  static constexpr size_t kZeros = 4096;
  static const std::byte zeros[kZeros]{};
  bool contiguous = true;
  for_each_placed_leaf(td, plan, [&](const Tensor& t, size_t start, size_t end) {
    contiguous = contiguous && t.is_contiguous();
    msg_.payload.emplace_back(static_cast<const std::byte*>(t.data()), t.nbytes());
    for (size_t pad = end - start - t.nbytes(); pad > 0;) {
      const size_t n = std::min(pad, kZeros);
      msg_.payload.emplace_back(zeros, n);
      pad -= n;
    }
  });
  if (!contiguous) msg_.payload.clear();  // packed instead
  return contiguous;
}

void Encoder::encode_non_consolidated(const TensorDict& td) {
  msg_.metadata = non_consolidated_header(td, options_.max_depth).dump();
  uint64_t total = 0;
  for_each_leaf(td, [&](const Tensor& t) {
    if (t.is_contiguous()) {
      msg_.payload.emplace_back(static_cast<const std::byte*>(t.data()), t.nbytes());
    } else {
      msg_.keepalive.push_back(t.clone());
      const Tensor& c = msg_.keepalive.back();
      msg_.payload.emplace_back(static_cast<const std::byte*>(c.data()), c.nbytes());
    }
    total += t.nbytes();
  });
  finish_header(MessageKind::NonConsolidated, total);
}

OutMessage Encoder::control(const Json& body) {
  OutMessage m;
  // Invalid UTF-8 in a text (an error message from C++) is replaced, never a throw here.
  m.metadata = body.dump(-1, ' ', false, Json::error_handler_t::replace);
  m.header.kind = MessageKind::Control;
  m.header.metadata_bytes = m.metadata.size();
  m.header_bytes = m.header.encode();
  return m;
}

}  // namespace tensorwire::wire
