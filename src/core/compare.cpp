// equal(), same_leaves(), all_true() and describe(): comparing and printing TensorDicts (tests and
// tools).
#include <algorithm>
#include <functional>
#include <sstream>

#include "tensorwire/core/tensordict.h"

namespace tensorwire {

namespace {

bool fail(std::string* why, std::string msg) {
  if (why) *why = std::move(msg);
  return false;
}

bool equal_at(const TensorDict& a, const TensorDict& b, const std::string& path, std::string* why) {
  if (a.batch_size() != b.batch_size())
    return fail(
        why, path + "batch_size " + shape_str(a.batch_size()) + " != " + shape_str(b.batch_size()));
  if (a.size() != b.size())
    return fail(why, path + std::to_string(a.size()) + " keys != " + std::to_string(b.size()));
  for (const auto& [name, ea] : a.items()) {
    std::string here = path + name;
    if (!b.contains(name)) return fail(why, "key '" + here + "' missing on the right");
    const Entry& eb = b.entry(name);
    if (ea.value().index() != eb.value().index())
      return fail(why, "key '" + here + "': " + ea.kind_name() + " vs " + eb.kind_name());
    if (ea.is_tensor()) {
      const Tensor& ta = ea.tensor();
      const Tensor& tb = eb.tensor();
      if (ta.dtype() != tb.dtype())
        return fail(why, "key '" + here + "': dtype " + std::string(dtype_name(ta.dtype())) +
                             " vs " + std::string(dtype_name(tb.dtype())));
      if (ta.shape() != tb.shape())
        return fail(why, "key '" + here + "': shape " + shape_str(ta.shape()) + " vs " +
                             shape_str(tb.shape()));
      if (!ta.equal(tb)) return fail(why, "key '" + here + "': values differ");
    } else if (ea.is_tensordict()) {
      if (!equal_at(ea.tensordict(), eb.tensordict(), here + ".", why)) return false;
    } else if (ea.is_non_tensor()) {
      if (!(ea.non_tensor() == eb.non_tensor()))
        return fail(why, "key '" + here + "': " + ea.non_tensor().value.dump() + " vs " +
                             eb.non_tensor().value.dump());
    } else if (!(ea.non_tensor_stack() == eb.non_tensor_stack())) {
      return fail(why, "key '" + here + "': non-tensor stacks differ");
    }
  }
  return true;
}

std::string human_bytes(size_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) v /= 1024, ++u;
  std::ostringstream os;
  os.precision(u ? 3 : 0);
  os << std::fixed << v << " " << units[u];
  if (u == 0) return std::to_string(n) + " B";
  std::string s = os.str();
  return s;
}

void describe_into(const TensorDict& td, int depth, std::ostringstream& os) {
  std::string indent(static_cast<size_t>(depth) * 2, ' ');
  for (const auto& [name, e] : td.items()) {
    os << indent << name << ": ";
    if (e.is_tensor()) {
      const Tensor& t = e.tensor();
      os << dtype_name(t.dtype()).substr(6) << shape_str(t.shape()) << "  "
         << human_bytes(t.nbytes()) << "\n";
    } else if (e.is_tensordict()) {
      os << "TensorDict(batch_size=" << shape_str(e.tensordict().batch_size()) << ")\n";
      describe_into(e.tensordict(), depth + 1, os);
    } else if (e.is_non_tensor()) {
      std::string v = e.non_tensor().value.dump();
      if (v.size() > 60) v = v.substr(0, 57) + "...";
      os << "non-tensor " << v << "\n";
    } else {
      os << "non-tensor stack" << shape_str(e.non_tensor_stack().batch_size) << "\n";
    }
  }
}

}  // namespace

bool equal(const TensorDict& a, const TensorDict& b, std::string* why) {
  return equal_at(a, b, "", why);
}

bool same_leaves(const TensorDict& a, const TensorDict& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < b.size(); ++i) {
    const auto& [ka, ea] = a.items()[i];
    const auto& [kb, eb] = b.items()[i];
    if (ka != kb) return false;
    if (eb.is_tensor()) {
      if (!ea.is_tensor() || !ea.tensor().storage().same(eb.tensor().storage()) ||
          ea.tensor().data() != eb.tensor().data())
        return false;
    } else if (eb.is_tensordict()) {
      if (!ea.is_tensordict() || !same_leaves(ea.tensordict(), eb.tensordict())) return false;
    }
  }
  return true;
}

namespace {

// The bytes of one floating-point component (a real number, or half of a complex one):
// those of IEEE binary formats and float8 keep the sign in the top bit of the last byte
// (little-endian), so -0.0 is zero too, as the value it is.
size_t float_component_bytes(DType t) {
  switch (t) {
    case DType::Float16:
    case DType::BFloat16:
    case DType::Float32:
    case DType::Float64:
    case DType::Float8E4M3FN:
    case DType::Float8E5M2:
      return itemsize(t);
    case DType::Complex64:
    case DType::Complex128:
      return itemsize(t) / 2;
    default:
      return 0;  // not floating point: every bit counts
  }
}

}  // namespace

bool all_true(const TensorDict& td) {
  for (const Key& k : td.keys(true, true)) {
    const Entry& e = td.entry(k);
    if (!e.is_tensor()) continue;
    Tensor t = e.tensor().contiguous();
    const auto* p = static_cast<const std::byte*>(t.data());
    const size_t component = float_component_bytes(t.dtype());
    for (size_t i = 0; i < t.nbytes(); i += t.itemsize()) {
      bool zero = true;
      for (size_t j = 0; j < t.itemsize() && zero; ++j) {
        std::byte b = p[i + j];
        if (component && (j + 1) % component == 0) b &= std::byte{0x7f};  // the sign bit
        zero = b == std::byte{0};
      }
      if (zero) return false;
    }
  }
  return true;
}

std::string describe(const TensorDict& td) {
  std::ostringstream os;
  size_t leaves = 0, bytes = 0;
  std::function<void(const TensorDict&)> count = [&](const TensorDict& t) {
    for (const auto& [n, e] : t.items()) {
      if (e.is_tensor()) ++leaves, bytes += e.tensor().nbytes();
      if (e.is_tensordict()) count(e.tensordict());
    }
  };
  count(td);
  os << "TensorDict(batch_size=" << shape_str(td.batch_size())
     << ", device=" << (td.device() ? td.device()->str() : "None") << ", " << leaves
     << " tensor leaves, " << human_bytes(bytes);
  if (td.is_consolidated())
    os << ", consolidated in " << human_bytes(td.consolidated()->storage.nbytes());
  os << ")\n";
  describe_into(td, 1, os);
  return os.str();
}

}  // namespace tensorwire
