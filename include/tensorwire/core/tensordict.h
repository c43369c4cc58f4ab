// TensorDict: an insertion-ordered, nested map from string keys to tensors and small
// non-tensor values, whose entries share leading batch dimensions.
//
// Value semantics for structure, reference semantics for data: copying a TensorDict
// copies its tree of keys (nested TensorDicts included) but the copies' tensors share
// storage, like tensordict's `td.copy()`. clone() copies the data too.
//
// Thread-safety: const methods may run concurrently; anything else needs external
// synchronisation.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "tensorwire/core/key.h"
#include "tensorwire/core/non_tensor.h"
#include "tensorwire/core/tensor.h"

namespace tensorwire {

class TensorDict;

// The consolidated form: one storage holding every leaf, plus tensordict-compatible
// metadata (see consolidate.h). Shared by a consolidated TensorDict and its sub-dicts.
struct Consolidated {
  Storage storage;
  std::shared_ptr<const Json> metadata;  // shared: many storages can have one layout
};

// A value in a TensorDict.
class Entry {
 public:
  using Value = std::variant<Tensor, NonTensor, NonTensorStack, std::unique_ptr<TensorDict>>;

  Entry(Tensor t);
  Entry(NonTensor v);
  Entry(NonTensorStack v);
  Entry(TensorDict td);
  Entry(const Entry& o);
  Entry(Entry&&) noexcept;
  Entry& operator=(const Entry& o);
  Entry& operator=(Entry&&) noexcept;
  ~Entry();

  bool is_tensor() const noexcept { return value_.index() == 0; }
  bool is_non_tensor() const noexcept { return value_.index() == 1; }
  bool is_non_tensor_stack() const noexcept { return value_.index() == 2; }
  bool is_tensordict() const noexcept { return value_.index() == 3; }

  // Each throws TypeError naming the actual kind when the entry holds something else.
  const Tensor& tensor() const;
  Tensor& tensor();
  const NonTensor& non_tensor() const;
  const NonTensorStack& non_tensor_stack() const;
  const TensorDict& tensordict() const;
  TensorDict& tensordict();

  const char* kind_name() const noexcept;  // "tensor", "non-tensor", ...
  const Value& value() const noexcept { return value_; }

 private:
  Value value_;
};

class TensorDict {
 public:
  explicit TensorDict(Shape batch_size = {}, std::optional<Device> device = std::nullopt);

  const Shape& batch_size() const noexcept { return batch_size_; }
  int64_t batch_dims() const noexcept { return static_cast<int64_t>(batch_size_.size()); }
  const std::optional<Device>& device() const noexcept { return device_; }
  const std::vector<std::optional<std::string>>& names() const noexcept { return names_; }
  void set_names(std::vector<std::optional<std::string>> names);

  // --- access ---------------------------------------------------------------
  bool contains(const Key& key) const;
  const Entry& entry(const Key& key) const;  // KeyError if absent
  Entry& entry(const Key& key);
  const Tensor& get(const Key& key) const;  // KeyError if absent, TypeError if not a tensor
  const TensorDict& get_tensordict(const Key& key) const;
  TensorDict& get_tensordict(const Key& key);
  const Json& get_non_tensor(const Key& key) const;

  // --- mutation ---------------------------------------------------------------
  // Each set checks that the value's leading dims equal batch_size (ValueError naming
  // the key and both shapes) and creates missing intermediate dicts for a path.
  // On a locked TensorDict (consolidated ones are) set/erase throw Error.
  TensorDict& set(const Key& key, Tensor value);
  TensorDict& set(const Key& key, NonTensor value);
  TensorDict& set(const Key& key, NonTensorStack value);
  TensorDict& set(const Key& key, TensorDict value);
  TensorDict& set(const Key& key, Entry value);
  void erase(const Key& key);  // KeyError if absent

  // Copies every tensor of `other` into the matching tensor of this one, in place
  // (so views into a consolidated storage are written through), broadcast and cast as
  // torch's copy_ does (src/core/cast.h). KeyError for a key this dict lacks, ValueError
  // for a shape that does not broadcast or a value that does not cast; non-tensor values
  // are replaced. Nothing is written unless every key checks out.
  void update_(const TensorDict& other);

  // --- structure --------------------------------------------------------------
  // Keys in insertion order; with include_nested, nested keys as paths after their
  // parent; with leaves_only, sub-dicts themselves are left out.
  std::vector<Key> keys(bool include_nested = false, bool leaves_only = false) const;
  size_t size() const noexcept { return entries_.size(); }
  bool empty() const noexcept { return entries_.empty(); }
  const std::vector<std::pair<std::string, Entry>>& items() const noexcept { return entries_; }

  TensorDict clone() const;  // deep copy of data; the clone is not consolidated
  // A dict of just these keys (paths allowed); strict=true raises KeyError for a missing one.
  TensorDict select(const std::vector<Key>& keys, bool strict = true) const;

  // Stacks equal-structured dicts along a new dim 0 (ValueError naming the first
  // difference otherwise); non-tensor values that differ become a NonTensorStack.
  static TensorDict stack(const std::vector<TensorDict>& tds);
  std::vector<TensorDict> unbind(int64_t dim = 0) const;                // only dim 0
  TensorDict index(int64_t i) const;                                    // views, along dim 0
  TensorDict slice(int64_t start, int64_t length, int64_t step) const;  // views, along dim 0

  // --- consolidation & locking -----------------------------------------------
  bool is_consolidated() const noexcept { return consolidated_ != nullptr; }
  const std::shared_ptr<const Consolidated>& consolidated() const noexcept { return consolidated_; }
  bool is_locked() const noexcept { return locked_; }
  void lock_();
  void unlock_();  // also forgets the consolidated form, as tensordict does

  // Attaches the consolidated form (used by consolidate() and decoders).
  void attach_consolidated_(std::shared_ptr<const Consolidated> c, const Json* metadata_node);
  const Json* consolidated_metadata() const noexcept { return consolidated_meta_; }

 private:
  friend class Entry;
  using Items = std::vector<std::pair<std::string, Entry>>;
  Entry* find(const std::string& name);
  const Entry* find(const std::string& name) const;
  Entry& append_(std::string name, Entry value);
  void rebuild_index_();
  static constexpr size_t kIndexThreshold = 16;
  TensorDict& parent_for(const Key& key, bool create);
  const TensorDict* parent_for(const Key& key) const;
  void check_batch(const Key& key, const Shape& shape, const char* what) const;
  void check_mutable(const Key& key) const;
  TensorDict conform_update(const TensorDict& other, const Key& prefix) const;
  void apply_update(const TensorDict& other);

  Shape batch_size_;
  std::optional<Device> device_;
  std::vector<std::optional<std::string>> names_;
  Items entries_;
  // name -> position, only for dicts over kIndexThreshold keys. Copies share it (their
  // positions are equal) and copy it on write.
  std::shared_ptr<std::unordered_map<std::string, size_t>> index_;
  bool locked_ = false;
  std::shared_ptr<const Consolidated> consolidated_;
  const Json* consolidated_meta_ = nullptr;  // this (sub)dict's node inside consolidated_->metadata
};

// Structure and values equal (keys compared as sets at each level, so insertion order
// does not matter; batch sizes, dtypes, shapes, bytes and non-tensor values must match).
// On a difference, `why` (if given) names the first one found.
bool equal(const TensorDict& a, const TensorDict& b, std::string* why = nullptr);

// Whether `a` holds the very tensors of `b`: the same keys in the same order, each tensor
// viewing the same bytes of the same storage (a dict given again, with none of its leaves
// replaced; not another dict with equal values). Recursion follows `b`: pass as `b` a
// dict known to be within kMaxDepth.
bool same_leaves(const TensorDict& a, const TensorDict& b);

// True when every element of every tensor leaf is nonzero (for (a == b).all() on a dict
// of bool leaves); non-tensor entries are ignored.
bool all_true(const TensorDict& td);

// Multi-line human description (keys, dtypes, shapes, sizes), used by `tensorwire inspect`.
std::string describe(const TensorDict& td);

}  // namespace tensorwire
