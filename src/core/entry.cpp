#include "tensorwire/core/tensordict.h"

#include <utility>

namespace tensorwire {

Entry::Entry(Tensor t) : value_(std::move(t)) {}
Entry::Entry(NonTensor v) : value_(std::move(v)) {}
Entry::Entry(NonTensorStack v) : value_(std::move(v)) {}
Entry::Entry(TensorDict td) : value_(std::make_unique<TensorDict>(std::move(td))) {}
Entry::~Entry() = default;

Entry::Entry(const Entry& o) : value_(Tensor{}) {
  *this = o;
}

// A moved-from Entry holds an undefined tensor, not a null TensorDict pointer that still
// says "TensorDict" (copying or reading one crashed).
Entry::Entry(Entry&& o) noexcept : value_(std::exchange(o.value_, Value(Tensor{}))) {}
Entry& Entry::operator=(Entry&& o) noexcept {
  if (this != &o) value_ = std::exchange(o.value_, Value(Tensor{}));
  return *this;
}

Entry& Entry::operator=(const Entry& o) {
  if (this == &o) return *this;
  if (o.is_tensordict())
    value_ = std::make_unique<TensorDict>(o.tensordict());
  else if (o.is_tensor())
    value_ = o.tensor();
  else if (o.is_non_tensor())
    value_ = o.non_tensor();
  else
    value_ = o.non_tensor_stack();
  return *this;
}

const char* Entry::kind_name() const noexcept {
  switch (value_.index()) {
    case 0:
      return "tensor";
    case 1:
      return "non-tensor value";
    case 2:
      return "non-tensor stack";
    default:
      return "TensorDict";
  }
}

namespace {
[[noreturn]] void wrong_kind(const Entry& e, const char* wanted) {
  throw TypeError(std::string("entry is a ") + e.kind_name() + ", not a " + wanted);
}
}  // namespace

const Tensor& Entry::tensor() const {
  if (!is_tensor()) wrong_kind(*this, "tensor");
  return std::get<0>(value_);
}
Tensor& Entry::tensor() {
  if (!is_tensor()) wrong_kind(*this, "tensor");
  return std::get<0>(value_);
}
const NonTensor& Entry::non_tensor() const {
  if (!is_non_tensor()) wrong_kind(*this, "non-tensor value");
  return std::get<1>(value_);
}
const NonTensorStack& Entry::non_tensor_stack() const {
  if (!is_non_tensor_stack()) wrong_kind(*this, "non-tensor stack");
  return std::get<2>(value_);
}
const TensorDict& Entry::tensordict() const {
  if (!is_tensordict()) wrong_kind(*this, "TensorDict");
  return *std::get<3>(value_);
}
TensorDict& Entry::tensordict() {
  if (!is_tensordict()) wrong_kind(*this, "TensorDict");
  return *std::get<3>(value_);
}

}  // namespace tensorwire
