#include "tensorwire/core/tensordict.h"

#include "cast.h"

#include <algorithm>

namespace tensorwire {

namespace {

bool has_prefix(const Shape& shape, const Shape& prefix) {
  return shape.size() >= prefix.size() && std::equal(prefix.begin(), prefix.end(), shape.begin());
}

}  // namespace

TensorDict::TensorDict(Shape batch_size, std::optional<Device> device)
    : batch_size_(std::move(batch_size)), device_(device), names_(batch_size_.size()) {
  checked_numel(batch_size_);
}

void TensorDict::set_names(std::vector<std::optional<std::string>> names) {
  if (names.size() != batch_size_.size())
    throw ValueError("set_names: " + std::to_string(names.size()) + " names for batch_size " +
                     shape_str(batch_size_));
  names_ = std::move(names);
}

Entry* TensorDict::find(const std::string& name) {
  return const_cast<Entry*>(static_cast<const TensorDict*>(this)->find(name));
}

// Small dicts search linearly (cheaper than hashing); large ones keep a hash index, so
// building or decoding a dict of n keys is O(n), not O(n^2).
const Entry* TensorDict::find(const std::string& name) const {
  if (index_) {
    auto it = index_->find(name);
    return it == index_->end() ? nullptr : &entries_[it->second].second;
  }
  for (const auto& [k, e] : entries_)
    if (k == name) return &e;
  return nullptr;
}

Entry& TensorDict::append_(std::string name, Entry value) {
  entries_.emplace_back(std::move(name), std::move(value));
  if (index_) {
    // Copies share the index until one of them changes: copy on write.
    if (index_.use_count() > 1)
      index_ = std::make_shared<std::unordered_map<std::string, size_t>>(*index_);
    index_->emplace(entries_.back().first, entries_.size() - 1);
  } else if (entries_.size() > kIndexThreshold) {
    rebuild_index_();
  }
  return entries_.back().second;
}

void TensorDict::rebuild_index_() {
  if (entries_.size() <= kIndexThreshold) {
    index_.reset();
    return;
  }
  index_ = std::make_shared<std::unordered_map<std::string, size_t>>();
  index_->reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) index_->emplace(entries_[i].first, i);
}

const TensorDict* TensorDict::parent_for(const Key& key) const {
  const TensorDict* td = this;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    const Entry* e = td->find(key.parts()[i]);
    if (!e || !e->is_tensordict()) return nullptr;
    td = &e->tensordict();
  }
  return td;
}

TensorDict& TensorDict::parent_for(const Key& key, bool create) {
  if (key.size() == 0) throw KeyError("empty key");
  TensorDict* td = this;
  for (size_t i = 0; i + 1 < key.size(); ++i) {
    const std::string& part = key.parts()[i];
    Entry* e = td->find(part);
    if (!e) {
      if (!create) throw KeyError("key " + key.str() + " not found");
      td->check_mutable(key);
      td->append_(part, Entry(TensorDict(td->batch_size_, td->device_)));
      e = &td->entries_.back().second;
    } else if (!e->is_tensordict()) {
      throw TypeError("key " + key.str() + ": '" + part + "' is a " + e->kind_name() +
                      ", not a TensorDict");
    }
    td = &e->tensordict();
  }
  return *td;
}

bool TensorDict::contains(const Key& key) const {
  if (key.size() == 0) return false;
  const TensorDict* td = parent_for(key);
  return td && td->find(key.back()) != nullptr;
}

const Entry& TensorDict::entry(const Key& key) const {
  const TensorDict* td = key.size() ? parent_for(key) : nullptr;
  const Entry* e = td ? td->find(key.back()) : nullptr;
  if (!e) throw KeyError("key " + key.str() + " not found");
  return *e;
}

Entry& TensorDict::entry(const Key& key) {
  return const_cast<Entry&>(static_cast<const TensorDict*>(this)->entry(key));
}

const Tensor& TensorDict::get(const Key& key) const {
  const Entry& e = entry(key);
  if (!e.is_tensor())
    throw TypeError("key " + key.str() + " holds a " + e.kind_name() + ", not a tensor");
  return e.tensor();
}

const TensorDict& TensorDict::get_tensordict(const Key& key) const {
  const Entry& e = entry(key);
  if (!e.is_tensordict())
    throw TypeError("key " + key.str() + " holds a " + e.kind_name() + ", not a TensorDict");
  return e.tensordict();
}

TensorDict& TensorDict::get_tensordict(const Key& key) {
  return const_cast<TensorDict&>(static_cast<const TensorDict*>(this)->get_tensordict(key));
}

const Json& TensorDict::get_non_tensor(const Key& key) const {
  const Entry& e = entry(key);
  if (!e.is_non_tensor())
    throw TypeError("key " + key.str() + " holds a " + e.kind_name() + ", not a non-tensor value");
  return e.non_tensor().value;
}

void TensorDict::check_batch(const Key& key, const Shape& shape, const char* what) const {
  if (!has_prefix(shape, batch_size_))
    throw ValueError("batch dimension mismatch for key " + key.str() + ": " + what + " of shape " +
                     shape_str(shape) + " does not start with batch_size " +
                     shape_str(batch_size_));
}

void TensorDict::check_mutable(const Key& key) const {
  if (locked_)
    throw Error("cannot set or erase key " + key.str() +
                ": the TensorDict is locked (by lock_(), by consolidation, or as a view of a "
                "transport's slot; call unlock_(), or clone() for a copy of your own)");
}

TensorDict& TensorDict::set(const Key& key, Entry value) {
  TensorDict& parent = parent_for(key, /*create=*/true);
  parent.check_mutable(key);
  if (key.back().empty()) throw KeyError("empty key name in " + key.str());
  if (value.is_tensor()) {
    const Tensor& t = value.tensor();
    if (!t.defined())
      throw ValueError("key " + key.str() +
                       ": the tensor is undefined (a default-constructed Tensor holds no data)");
    parent.check_batch(key, t.shape(), "tensor");
    if (parent.device_ && t.device() != *parent.device_)
      throw ValueError("key " + key.str() + ": tensor on " + t.device().str() +
                       " in a TensorDict on " + parent.device_->str());
  } else if (value.is_non_tensor_stack()) {
    value.non_tensor_stack().validate();
    parent.check_batch(key, value.non_tensor_stack().batch_size, "non-tensor stack");
  } else if (value.is_tensordict()) {
    parent.check_batch(key, value.tensordict().batch_size(), "TensorDict");
  } else if (!is_json_representable(value.non_tensor().value)) {
    throw ValueError("key " + key.str() + ": non-tensor value is not JSON-representable");
  }
  // The entry replaced is destroyed last, once this dict is whole again: releasing its
  // storage may run code (a Python array's finalizer) that looks at this dict, or changes it.
  std::optional<Entry> replaced;
  if (Entry* e = parent.find(key.back())) {
    replaced.emplace(std::move(*e));
    *e = std::move(value);
  } else {
    parent.append_(key.back(), std::move(value));
  }
  return *this;
}

TensorDict& TensorDict::set(const Key& key, Tensor value) {
  return set(key, Entry(std::move(value)));
}
TensorDict& TensorDict::set(const Key& key, NonTensor value) {
  return set(key, Entry(std::move(value)));
}
TensorDict& TensorDict::set(const Key& key, NonTensorStack value) {
  return set(key, Entry(std::move(value)));
}
TensorDict& TensorDict::set(const Key& key, TensorDict value) {
  return set(key, Entry(std::move(value)));
}

void TensorDict::erase(const Key& key) {
  TensorDict& parent = parent_for(key, /*create=*/false);
  parent.check_mutable(key);
  auto it = std::find_if(parent.entries_.begin(), parent.entries_.end(),
                         [&](const auto& kv) { return kv.first == key.back(); });
  if (it == parent.entries_.end()) throw KeyError("key " + key.str() + " not found");
  // Destroyed last, as in set(): while erase() shifts the entries, a finalizer run by the
  // release of this one's storage saw a key named '' (a moved-from entry), and a key it
  // added there ended up lost.
  Entry erased = std::move(it->second);
  parent.entries_.erase(it);
  parent.rebuild_index_();
}

TensorDict TensorDict::conform_update(const TensorDict& other, const Key& prefix) const {
  TensorDict out(other.batch_size_, other.device_);
  for (const auto& [name, src] : other.entries_) {
    Key key = prefix.size() ? prefix.child(name) : Key(name);
    const Entry* dst = find(name);
    if (!dst) throw KeyError("update_: key " + key.str() + " not found in the destination");
    if (src.is_tensor()) {
      if (!dst->is_tensor())
        throw TypeError("update_: key " + key.str() + " is a " + dst->kind_name() +
                        " in the destination, a tensor in the source");
      // Broadcast and cast to the destination's shape and dtype, as torch's copy_ (which
      // tensordict's update_ calls) does.
      const Tensor& a = dst->tensor();
      out.append_(name, Entry(detail::cast_to(src.tensor(), a.shape(), a.dtype(),
                                              "update_: key " + key.str())));
    } else if (src.is_tensordict()) {
      if (!dst->is_tensordict())
        throw TypeError("update_: key " + key.str() + " is a " + dst->kind_name() +
                        " in the destination, a TensorDict in the source");
      out.append_(name, Entry(dst->tensordict().conform_update(src.tensordict(), key)));
    } else {
      if (dst->is_tensor() || dst->is_tensordict())
        throw TypeError("update_: key " + key.str() + " is a " + dst->kind_name() +
                        " in the destination, a " + src.kind_name() + " in the source");
      // A consolidated dict's metadata records its non-tensor values; changing one in
      // place would make that metadata lie.
      bool same = src.is_non_tensor() == dst->is_non_tensor() &&
                  (src.is_non_tensor() ? src.non_tensor() == dst->non_tensor()
                                       : src.non_tensor_stack() == dst->non_tensor_stack());
      if (!same && consolidated_)
        throw ValueError(
            "update_: key " + key.str() +
            ": cannot change a non-tensor value of a consolidated TensorDict in place");
      out.append_(name, src);
    }
  }
  return out;
}

void TensorDict::apply_update(const TensorDict& other) {
  for (const auto& [name, src] : other.entries_) {
    Entry* dst = find(name);
    if (src.is_tensor())
      dst->tensor().copy_(src.tensor());
    else if (src.is_tensordict())
      dst->tensordict().apply_update(src.tensordict());
    else
      *dst = src;
  }
}

void TensorDict::update_(const TensorDict& other) {
  // Everything is checked and converted before the first write: all or nothing.
  apply_update(conform_update(other, Key(std::vector<std::string>{})));
}

std::vector<Key> TensorDict::keys(bool include_nested, bool leaves_only) const {
  std::vector<Key> out;
  for (const auto& [name, e] : entries_) {
    if (e.is_tensordict()) {
      if (!leaves_only) out.emplace_back(name);
      if (include_nested)
        for (Key& sub : e.tensordict().keys(true, leaves_only)) {
          std::vector<std::string> parts{name};
          parts.insert(parts.end(), sub.parts().begin(), sub.parts().end());
          out.emplace_back(std::move(parts));
        }
    } else {
      out.emplace_back(name);
    }
  }
  return out;
}

TensorDict TensorDict::clone() const {
  TensorDict out(batch_size_, device_);
  out.names_ = names_;
  for (const auto& [name, e] : entries_) {
    if (e.is_tensor())
      out.append_(name, Entry(e.tensor().clone()));
    else if (e.is_tensordict())
      out.append_(name, Entry(e.tensordict().clone()));
    else
      out.append_(name, e);
  }
  return out;
}

TensorDict TensorDict::select(const std::vector<Key>& keys, bool strict) const {
  TensorDict out(batch_size_, device_);
  out.names_ = names_;
  for (const Key& key : keys) {
    if (!contains(key)) {
      if (strict) throw KeyError("select: key " + key.str() + " not found");
      continue;
    }
    // Intermediate dicts take the batch size of the dict they come from.
    TensorDict* dst = &out;
    const TensorDict* src = this;
    for (size_t i = 0; i + 1 < key.size(); ++i) {
      const std::string& part = key.parts()[i];
      src = &src->find(part)->tensordict();
      Entry* e = dst->find(part);
      if (!e) {
        TensorDict child(src->batch_size_, src->device_);
        child.names_ = src->names_;
        dst->append_(part, Entry(std::move(child)));
        e = &dst->entries_.back().second;
      }
      dst = &e->tensordict();
    }
    const Entry* value = src->find(key.back());
    if (Entry* existing = dst->find(key.back()))
      *existing = *value;
    else
      dst->append_(key.back(), *value);
  }
  return out;
}

void TensorDict::lock_() {
  locked_ = true;
  for (auto& [name, e] : entries_)
    if (e.is_tensordict()) e.tensordict().lock_();
}

void TensorDict::unlock_() {
  locked_ = false;
  consolidated_.reset();
  consolidated_meta_ = nullptr;
  for (auto& [name, e] : entries_)
    if (e.is_tensordict()) e.tensordict().unlock_();
}

void TensorDict::attach_consolidated_(std::shared_ptr<const Consolidated> c,
                                      const Json* metadata_node) {
  consolidated_ = std::move(c);
  consolidated_meta_ = metadata_node;
}

}  // namespace tensorwire
