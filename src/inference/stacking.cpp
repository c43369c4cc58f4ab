#include "stacking.h"

#include <algorithm>
#include <unordered_map>

#include "policy_output.h"

namespace tensorwire::inference::detail {

namespace {

void describe_into(const TensorDict& td, std::string& out) {
  out += shape_str(td.batch_size());
  out += '{';
  for (const auto& [name, e] : td.items()) {
    out += name;
    out += ':';
    if (e.is_tensor()) {
      out += dtype_name(e.tensor().dtype());
      out += shape_str(e.tensor().shape());
    } else if (e.is_tensordict()) {
      describe_into(e.tensordict(), out);
    } else {
      out += "nt";  // non-tensor values stack whatever they hold
    }
    out += ',';
  }
  out += '}';
}

}  // namespace

std::string structure_key(const TensorDict& td) {
  std::string out;
  describe_into(td, out);
  return out;
}

void group_and_stack(const std::vector<const TensorDict*>& requests, std::vector<Group>& groups) {
  groups.clear();
  std::unordered_map<std::string, size_t> index;
  std::vector<std::vector<TensorDict>> members;
  for (size_t i = 0; i < requests.size(); ++i) {
    auto [it, fresh] = index.try_emplace(structure_key(*requests[i]), groups.size());
    if (fresh) {
      groups.emplace_back();
      members.emplace_back();
    }
    groups[it->second].rows.push_back(i);
    members[it->second].push_back(*requests[i]);
  }
  for (size_t g = 0; g < groups.size(); ++g)
    groups[g].input = std::make_shared<const TensorDict>(TensorDict::stack(members[g]));
}

std::vector<TensorDict> split_output(const TensorDict& output, size_t rows,
                                     const VersionStamp& stamp) {
  const int64_t n = static_cast<int64_t>(rows);
  check_output_rows(output, n);
  if (!stamp.key) return output.unbind(0);
  TensorDict stamped = output;
  if (stamped.is_locked()) stamped.unlock_();
  // Of the output's whole batch size, as torchrl stamps (torch.full(batch_size, version)):
  // a request with batch dimensions of its own gets one version per row of it.
  const Shape& batch = output.batch_size();
  Tensor v = Tensor::empty(batch, DType::Int64);
  int64_t* at = v.data<int64_t>();
  std::fill(at, at + v.numel(), stamp.version);
  if (stamp.key->size() > 1 && !stamped.contains(stamp.key->parent()))
    stamped.set(stamp.key->parent(), TensorDict(batch));
  stamped.set(*stamp.key, std::move(v));
  return stamped.unbind(0);
}

}  // namespace tensorwire::inference::detail
