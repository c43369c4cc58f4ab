#include "bank_batch.h"

#include <algorithm>
#include <cstring>

#include "client_impl.h"
#include "policy_output.h"

namespace tensorwire::inference::detail {

namespace {

// Writes `value` converted to `dtype` into `count` consecutive elements at dst.
void fill_scalar(std::byte* dst, DType dtype, int64_t value, size_t count) {
  auto fill = [&](auto v) {
    for (size_t i = 0; i < count; ++i) std::memcpy(dst + i * sizeof v, &v, sizeof v);
  };
  switch (dtype) {
    case DType::Int64:
      return fill(static_cast<int64_t>(value));
    case DType::Int32:
      return fill(static_cast<int32_t>(value));
    case DType::Int16:
      return fill(static_cast<int16_t>(value));
    case DType::Int8:
      return fill(static_cast<int8_t>(value));
    case DType::UInt8:
      return fill(static_cast<uint8_t>(value));
    case DType::UInt16:
      return fill(static_cast<uint16_t>(value));
    case DType::UInt32:
      return fill(static_cast<uint32_t>(value));
    case DType::UInt64:
      return fill(static_cast<uint64_t>(value));
    case DType::Float32:
      return fill(static_cast<float>(value));
    case DType::Float64:
      return fill(static_cast<double>(value));
    default:
      throw ValueError(
          "policy_version can only be stamped into an integer or float32/float64 "
          "leaf, the response spec declares " +
          std::string(dtype_name(dtype)));
  }
}

}  // namespace

void collate_slots(const SlotLayout& layout, const Storage& bank, BatchViews& o, const Drained& d,
                   std::vector<Group>& groups) {
  groups.resize(1);
  Group& g = groups[0];
  g.rows.resize(d.size());
  for (size_t k = 0; k < d.size(); ++k) g.rows[k] = k;
  // Rows in slot order: contiguous slots then make a contiguous view of the bank.
  std::sort(g.rows.begin(), g.rows.end(), [&](size_t a, size_t b) { return d.ids[a] < d.ids[b]; });
  const size_t n = g.rows.size();
  const uint64_t first = d.ids[g.rows[0]];
  const bool contiguous = d.ids[g.rows[n - 1]] - first == n - 1;
  if (!contiguous) {
    for (const LeafSlot& l : layout.leaves()) {
      std::byte* dst = o.staging.data() + l.offset;
      const std::byte* src = bank.data() + l.offset;
      for (size_t k = 0; k < n; ++k)
        std::memcpy(dst + k * l.row_bytes, src + d.ids[g.rows[k]] * l.row_bytes, l.row_bytes);
    }
  }
  const uint64_t key = (contiguous ? first << 32 : uint64_t{1} << 63) | n;
  auto it = o.views.find(key);
  if (it == o.views.end()) {
    if (o.views.size() >= 4096) o.views.clear();
    auto view = std::make_shared<const TensorDict>(
        contiguous ? layout.rows(bank, first, static_cast<int64_t>(n))
                   : layout.rows(o.staging, 0, static_cast<int64_t>(n)));
    it = o.views.emplace(key, std::move(view)).first;
  }
  g.input = it->second;
}

void write_response_rows(const SlotLayout& layout, std::byte* bank_data, const Drained& d,
                         const Group& g, const TensorDict& output, const VersionStamp& stamp) {
  const int64_t n = static_cast<int64_t>(g.rows.size());
  check_output_rows(output, n);
  const auto& leaves = layout.leaves();
  thread_local std::vector<const Tensor*> src;
  src.assign(leaves.size(), nullptr);
  // Validate everything before writing anything.
  for (size_t k = 0; k < leaves.size(); ++k) {
    const LeafSlot& l = leaves[k];
    const bool stamped = stamp.key && l.key == *stamp.key;
    if (!output.contains(l.key)) {
      if (stamped) continue;
      throw KeyError("the policy output has no key " + l.key.str() +
                     " (declared in the response spec)");
    }
    if (stamped) continue;
    const Entry& e = output.entry(l.key);
    auto expected = [&] {
      Shape s{n};
      s.insert(s.end(), l.shape.begin(), l.shape.end());
      return leaf_str(l.dtype, s);
    };
    if (!e.is_tensor())
      throw ValueError("policy output key " + l.key.str() + ": expected a tensor " + expected() +
                       ", got a " + e.kind_name());
    const Tensor& t = e.tensor();
    if (!t.device().is_cpu())
      throw ValueError("policy output key " + l.key.str() + " is on " + t.device().str() +
                       "; move results to the CPU");
    const Shape& ts = t.shape();
    if (t.dtype() != l.dtype || ts.size() != l.shape.size() + 1 || ts[0] != n ||
        !std::equal(l.shape.begin(), l.shape.end(), ts.begin() + 1))
      throw ValueError("policy output key " + l.key.str() + ": expected " + expected() + ", got " +
                       leaf_str(t.dtype(), ts));
    src[k] = &t;
  }
  const uint64_t first = d.ids[g.rows[0]];
  const bool contiguous = d.ids[g.rows[n - 1]] - first == static_cast<uint64_t>(n - 1);
  for (size_t k = 0; k < leaves.size(); ++k) {
    const LeafSlot& l = leaves[k];
    std::byte* bank = bank_data + l.offset;
    if (!src[k]) {
      if (stamp.key && l.key == *stamp.key) {
        const size_t per_row = l.row_bytes / itemsize(l.dtype);
        for (int64_t j = 0; j < n; ++j)
          fill_scalar(bank + d.ids[g.rows[j]] * l.row_bytes, l.dtype, stamp.version, per_row);
      }
      continue;
    }
    if (contiguous) {
      src[k]->copy_to(bank + first * l.row_bytes);
      continue;
    }
    Tensor c = src[k]->contiguous();
    const std::byte* from = static_cast<const std::byte*>(c.data());
    for (int64_t j = 0; j < n; ++j)
      std::memcpy(bank + d.ids[g.rows[j]] * l.row_bytes, from + j * l.row_bytes, l.row_bytes);
  }
  // Stamping when the policy returned the key too: the server's version wins.
  if (stamp.key) {
    int idx = layout.find(*stamp.key);
    if (idx >= 0 && src[static_cast<size_t>(idx)]) {
      const LeafSlot& l = leaves[static_cast<size_t>(idx)];
      const size_t per_row = l.row_bytes / itemsize(l.dtype);
      for (int64_t j = 0; j < n; ++j)
        fill_scalar(bank_data + l.offset + d.ids[g.rows[j]] * l.row_bytes, l.dtype, stamp.version,
                    per_row);
    }
  }
}

void write_response_row(const SlotLayout& layout, std::byte* bank, uint32_t slot,
                        const TensorDict& response) {
  const auto& leaves = layout.leaves();
  std::vector<const Tensor*> src(leaves.size(), nullptr);
  for (size_t k = 0; k < leaves.size(); ++k) {
    const LeafSlot& l = leaves[k];
    if (!response.contains(l.key))
      throw KeyError("the response has no key " + l.key.str() + " (declared in the response spec)");
    const Entry& e = response.entry(l.key);
    if (!e.is_tensor() || !e.tensor().device().is_cpu() || e.tensor().dtype() != l.dtype ||
        e.tensor().shape() != l.shape)
      throw ValueError("response key " + l.key.str() + ": expected " + leaf_str(l.dtype, l.shape) +
                       " on cpu, got " +
                       (e.is_tensor() ? leaf_str(e.tensor().dtype(), e.tensor().shape()) + " on " +
                                            e.tensor().device().str()
                                      : std::string("a ") + e.kind_name()));
    src[k] = &e.tensor();
  }
  write_row(layout, bank, slot, src);
}

void write_row(const SlotLayout& layout, std::byte* bank, size_t slot,
               const std::vector<const Tensor*>& leaves) {
  const auto& l = layout.leaves();
  for (size_t k = 0; k < l.size(); ++k)
    leaves[k]->copy_to(bank + l[k].offset + slot * l[k].row_bytes);
}

void validate_request(const TensorDict& td, const SlotLayout& layout,
                      std::vector<const Tensor*>& out, const char* transport) {
  out.clear();
  for (const LeafSlot& leaf : layout.leaves()) {
    const Entry* e = nullptr;
    try {
      e = &td.entry(leaf.key);
    } catch (const KeyError&) {
      throw KeyError("request has no key " + leaf.key.str() + " (declared in the request spec)");
    }
    if (!e->is_tensor())
      throw ValueError("request key " + leaf.key.str() + ": expected a tensor " +
                       leaf_str(leaf.dtype, leaf.shape) + ", got a " + e->kind_name());
    const Tensor& t = e->tensor();
    if (!t.device().is_cpu())
      throw ValueError("request key " + leaf.key.str() + ": tensor on " + t.device().str() + "; " +
                       transport + " only accepts CPU tensors (expected " +
                       leaf_str(leaf.dtype, leaf.shape) + " on cpu)");
    if (t.dtype() != leaf.dtype || t.shape() != leaf.shape)
      throw ValueError("request key " + leaf.key.str() + ": expected " +
                       leaf_str(leaf.dtype, leaf.shape) + ", got " +
                       leaf_str(t.dtype(), t.shape()));
    out.push_back(&t);
  }
}

}  // namespace tensorwire::inference::detail
