// What every fuzz target checks its library calls with: the limits its decoders run under,
// how a finding is reported, and the rule that bad input may only be refused with
// tensorwire::ProtocolError (naming the field and rule; any other tensorwire::Error means a
// check is missing and a later step caught it).
#pragma once

#include <cerrno>  // program_invocation_short_name (glibc)
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <typeinfo>
#include <vector>

#include "tensorwire/core/error.h"
#include "tensorwire/tensorwire.h"

namespace tensorwire::fuzz {

// Small enough that no input can make the library allocate more than a few MiB.
constexpr wire::Limits limits(uint32_t max_depth = 16) {
  return {.max_metadata_bytes = 1u << 16,
          .max_message_bytes = 1u << 20,
          .max_leaves = 1024,
          .max_depth = max_depth,
          .max_dims = 16};
}
// For re-decoding what a target re-encoded: a header can grow on re-encoding (implicit
// intermediate dicts become entries, numbers print longer), which is not a finding.
constexpr wire::Limits kRoundTripLimits{.max_metadata_bytes = 1u << 22,
                                        .max_message_bytes = 1u << 22,
                                        .max_leaves = 1u << 16,
                                        .max_depth = 16,
                                        .max_dims = 16};

// "fuzz_<target> finding: ..." (the executable's name; run.sh greps for it), then abort so
// libFuzzer keeps the input.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "%s finding: %s\n", program_invocation_short_name, what.c_str());
  std::fflush(stderr);
  std::abort();
}

[[noreturn]] inline void unexpected(const char* step, const Error& e) {
  finding(std::string(step) + ": bad input refused with " + typeid(e).name() +
          " instead of ProtocolError: " + e.what());
}

// Runs fn; a ProtocolError is a refusal (fine), any other tensorwire::Error a finding.
template <class Fn>
void refused_or_ok(Fn&& fn) {
  try {
    fn();
  } catch (const ProtocolError&) {
  } catch (const Error& e) {
    finding(std::string("a non-ProtocolError ") + typeid(e).name() + ": " + e.what());
  }
}

// Reads every byte of every leaf, so a view outside its storage trips ASan.
inline uint64_t touch(const TensorDict& td) {
  uint64_t sum = 0;
  std::vector<std::byte> buf;
  for_each_leaf(td, [&](const Tensor& t) {
    buf.resize(t.nbytes());
    t.copy_to(buf.data());
    for (std::byte b : buf) sum += static_cast<uint8_t>(b);
  });
  return sum + describe(td).size();
}

}  // namespace tensorwire::fuzz
