#include "slot_layout.h"

#include <cstring>

#include "tensorwire/core/consolidate.h"

namespace tensorwire::inference::detail {

namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

void collect(const TensorDict& level, const Key* prefix, const char* what,
             std::vector<LeafSlot>& out) {
  for (const auto& [name, e] : level.items()) {
    Key key = prefix ? prefix->child(name) : Key(name);
    if (e.is_tensordict()) {
      collect(e.tensordict(), &key, what, out);
    } else if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      if (!t.device().is_cpu())
        throw ValueError(std::string(what) + ": leaf " + key.str() + " is on " + t.device().str() +
                         "; slots live in CPU shared memory");
      out.push_back({key, t.dtype(), t.shape(), t.nbytes(), 0});
    } else {
      throw TypeError(std::string(what) + ": " + key.str() + " is a " + e.kind_name() +
                      "; a spec must hold tensor leaves only");
    }
  }
}

}  // namespace

SlotLayout SlotLayout::from_spec(const TensorDict& spec, uint32_t num_slots, const char* what) {
  if (num_slots < 1)
    throw ValueError("num_slots must be at least 1, got " + std::to_string(num_slots));
  SlotLayout l;
  collect(spec, nullptr, what, l.leaves_);
  if (l.leaves_.empty())
    throw ValueError(std::string(what) + " must have at least one tensor leaf");
  size_t offset = 0;
  for (LeafSlot& leaf : l.leaves_) {
    leaf.offset = offset;
    size_t region = leaf.row_bytes * num_slots;
    if (leaf.row_bytes && region / leaf.row_bytes != num_slots)
      throw ValueError(std::string(what) + ": bank size overflows");
    offset = align_up(offset + region);
  }
  l.bank_bytes_ = std::max<size_t>(offset, kAlign);
  l.num_slots_ = num_slots;
  l.spec_ = spec;  // the structure (nesting, batch sizes) to rebuild around slot views
  return l;
}

std::vector<Key> SlotLayout::keys() const {
  std::vector<Key> out;
  out.reserve(leaves_.size());
  for (const LeafSlot& l : leaves_) out.push_back(l.key);
  return out;
}

std::vector<RequestLeaf> SlotLayout::request_leaves() const {
  std::vector<RequestLeaf> out;
  out.reserve(leaves_.size());
  for (const LeafSlot& l : leaves_) out.push_back({l.key, l.dtype, l.shape});
  return out;
}

int SlotLayout::find(const Key& key) const noexcept {
  for (size_t i = 0; i < leaves_.size(); ++i)
    if (leaves_[i].key == key) return static_cast<int>(i);
  return -1;
}

TensorDict SlotLayout::rows(const Storage& bank, size_t first, int64_t n) const {
  return build(Shape{n}, [&](size_t i) {
    const LeafSlot& l = leaves_[i];
    Shape shape{n};
    shape.insert(shape.end(), l.shape.begin(), l.shape.end());
    return Tensor::view(bank, l.offset + first * l.row_bytes, std::move(shape), l.dtype);
  });
}

TensorDict SlotLayout::row(const Storage& bank, size_t slot) const {
  return build(Shape{}, [&](size_t i) {
    const LeafSlot& l = leaves_[i];
    return Tensor::view(bank, l.offset + slot * l.row_bytes, l.shape, l.dtype);
  });
}

TensorDict SlotLayout::copy_row(const std::byte* bank, size_t slot) const {
  size_t total = 0;
  for (const LeafSlot& l : leaves_) total = align_up(total + l.row_bytes);
  Storage storage = Storage::allocate(std::max<size_t>(total, kAlign), kAlign);
  size_t at = 0;
  return build(Shape{}, [&](size_t i) {
    const LeafSlot& l = leaves_[i];
    std::memcpy(storage.data() + at, bank + l.offset + slot * l.row_bytes, l.row_bytes);
    Tensor t = Tensor::view(storage, at, l.shape, l.dtype);
    at = align_up(at + l.row_bytes);
    return t;
  });
}

}  // namespace tensorwire::inference::detail
