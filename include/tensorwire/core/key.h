// Keys: a string, or a path of strings into nested TensorDicts ({"info", "reward"}).
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

namespace tensorwire {

class Key {
 public:
  Key(const char* s) : parts_{s} {}
  Key(std::string s) : parts_{std::move(s)} {}
  Key(std::initializer_list<std::string> parts) : parts_(parts) {}
  explicit Key(std::vector<std::string> parts) : parts_(std::move(parts)) {}

  const std::vector<std::string>& parts() const noexcept { return parts_; }
  size_t size() const noexcept { return parts_.size(); }
  const std::string& back() const { return parts_.back(); }
  Key parent() const { return Key(std::vector<std::string>(parts_.begin(), parts_.end() - 1)); }
  Key child(const std::string& name) const;
  std::string str() const;  // "info.reward" for messages, 'a' for a single key
  friend bool operator==(const Key&, const Key&) = default;

 private:
  std::vector<std::string> parts_;
};

}  // namespace tensorwire
