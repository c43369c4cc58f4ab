// A TCP port written as text ("5555" in "host:5555" or "tcp://host:5555"): the one parser
// for every address a user types, so a typo is refused the same way everywhere.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tensorwire::os {

// The port `text` names: decimal digits only, 0 to 65535. None for anything else (empty,
// a sign, a letter, a value out of range), whatever its length.
std::optional<uint16_t> parse_port(std::string_view text) noexcept;

}  // namespace tensorwire::os
