#include "tensorwire/core/key.h"

namespace tensorwire {

Key Key::child(const std::string& name) const {
  std::vector<std::string> parts = parts_;
  parts.push_back(name);
  return Key(std::move(parts));
}

std::string Key::str() const {
  if (parts_.size() == 1) return "'" + parts_[0] + "'";
  std::string out = "(";
  for (size_t i = 0; i < parts_.size(); ++i) {
    if (i) out += ", ";
    out += "'" + parts_[i] + "'";
  }
  return out + ")";
}

}  // namespace tensorwire
