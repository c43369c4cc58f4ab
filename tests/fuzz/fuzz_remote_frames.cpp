// libFuzzer target: what a remote inference peer controls (wire/remote_frames.h), through the
// checks the transport runs on it:
//
//   the first 8 bytes: a message length -> check_request_length (a bank of 16-byte rows);
//   the rest: a received control frame -> parse_control_frame -> parse_failure and
//   parse_num_slots (the client's side) and the heartbeat check; and a spec's structure
//   (decode_structure, the shared-memory and remote clients' side), laid out as a client
//   does (SlotLayout).
//
// A bad input may only be refused with tensorwire::ProtocolError; another tensorwire::Error
// is a finding, anything else escapes and libFuzzer reports it. Seeds: valid frames of every
// kind, written by fuzz_make_corpus into remote_corpus/ at run time (run.sh).
#include <cstring>
#include <span>

#include "check.h"
#include "inference/slot_layout.h"
#include "wire/control_frame.h"
#include "wire/message_bytes.h"
#include "wire/remote_frames.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

constexpr wire::Limits kLimits = tw::fuzz::limits(/*max_depth=*/64);
using tw::fuzz::finding;
using tw::fuzz::refused_or_ok;

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 8) return 0;
  uint64_t length = 0;
  std::memcpy(&length, data, 8);
  refused_or_ok([&] { wire::remote::check_request_length(length, 16); });
  const auto frame = std::as_bytes(std::span(data + 8, size - 8));
  refused_or_ok([&] {
    wire::check_control_length(frame.size(), 64 * 1024, "control message");
    tw::Json body = wire::parse_control_frame(frame, kLimits, "control message");
    refused_or_ok([&] {
      wire::remote::Failure f = wire::remote::parse_failure(body);
      if (f.type.empty()) finding("a failure without a type was accepted");
    });
    refused_or_ok([&] {
      const uint32_t n = wire::remote::parse_num_slots(body);
      if (n < 1 || n > (1u << 24)) finding("num_slots out of range accepted");
    });
  });
  refused_or_ok([&] {
    const tw::TensorDict spec = wire::decode_structure(frame, kLimits);
    try {
      (void)tw::inference::detail::SlotLayout::from_spec(spec, 1, "the server's spec");
    } catch (const tw::ValueError&) {  // a spec of no leaf, a bank that overflows: the
    } catch (const tw::TypeError&) {   // client refuses it by name
    }
  });
  return 0;
}
