// libFuzzer target: one frame of the inference socket transport (src/wire/socket_frame.h)
// as each side reads it from its peer.
//
//   owner:  parse_socket_frame -> a request: decode_owned with the connection's decoder,
//           or, refused, the failure frame the owner answers with ("bad request: ...");
//   client: parse_socket_frame -> a response: decode_owned; a failure:
//           parse_socket_failure (both as a request's failure and as a connection's refusal).
//
// A bad frame may only be refused with tensorwire::ProtocolError; another tensorwire::Error
// is a finding, and anything else (a JSON exception, std::bad_alloc) escapes and libFuzzer
// reports it. Whatever the owner answers must itself be a valid failure frame that the
// client reads back as sent. An accepted TensorDict is read in full (ASan checks the
// views) and must survive a re-encode/decode round trip unchanged.
#include <string>
#include <string_view>

#include "check.h"
#include "tensorwire/runtime/remote_error.h"
#include "tensorwire/tensorwire.h"
#include "wire/message_bytes.h"
#include "wire/socket_frame.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

constexpr wire::Limits kLimits = tw::fuzz::limits();
using tw::fuzz::finding;
using tw::fuzz::kRoundTripLimits;
using tw::fuzz::touch;
using tw::fuzz::unexpected;

// As the sending side frames it (non-consolidated, the transport's mode), then read back.
void round_trip(const tw::TensorDict& td, wire::SocketFrameKind kind, uint64_t id) {
  try {
    wire::Encoder enc(wire::Mode::NonConsolidated);
    std::string bytes = wire::socket_frame(kind, id);
    wire::append_encoded(enc.encode(td), bytes);
    const auto f = wire::parse_socket_frame(bytes);
    if (!f || f->kind != kind || f->id != id) finding("a frame does not read back as built");
    wire::Decoder dec(kRoundTripLimits);
    const tw::TensorDict back = wire::decode_owned(dec, f->body);
    std::string why;
    if (!tw::equal(td, back, &why)) finding("round trip changed the TensorDict: " + why);
  } catch (const tw::Error& e) {
    finding(std::string("an accepted body does not round-trip: ") + e.what());
  }
}

// The owner: a client's frame. Its decoder lives as long as the connection, so one is kept.
void as_owner(std::string_view input) {
  static wire::Decoder decoder(kLimits);
  const auto f = wire::parse_socket_frame(input);
  if (!f || f->kind != wire::SocketFrameKind::Request) return;  // the connection is closed
  std::string answer;
  try {
    tw::TensorDict td = wire::decode_owned(decoder, f->body);
    touch(td);
    round_trip(td, wire::SocketFrameKind::Request, f->id);
    return;
  } catch (const tw::ProtocolError& e) {
    answer = wire::socket_failure_frame(
        f->id, {"RuntimeError", std::string("bad request: ") + e.what(), false});
  } catch (const tw::Error& e) {
    unexpected("owner, request", e);
  }
  // The client must read the owner's answer back.
  const auto back = wire::parse_socket_frame(answer);
  if (!back || back->kind != wire::SocketFrameKind::Failure || back->id != f->id)
    finding("the owner's failure frame does not parse");
  try {
    const wire::SocketFailure failure = wire::parse_socket_failure(back->body, "failure");
    if (failure.type != "RuntimeError" || failure.closed)
      finding("the owner's failure frame reads back changed");
  } catch (const tw::Error& e) {
    finding(std::string("the owner's failure frame is refused by the client: ") + e.what());
  }
}

// The client: an owner's frame (a response, a failure, the welcome or a refusal).
void as_client(std::string_view input) {
  static wire::Decoder decoder(kLimits);
  const auto f = wire::parse_socket_frame(input);
  if (!f) return;
  try {
    switch (f->kind) {
      case wire::SocketFrameKind::Response: {
        tw::TensorDict td = wire::decode_owned(decoder, f->body);
        touch(td);
        round_trip(td, wire::SocketFrameKind::Response, f->id);
        break;
      }
      case wire::SocketFrameKind::Failure: {
        const wire::SocketFailure failure = wire::parse_socket_failure(f->body, "failure");
        // What the client makes of it, as socket_transport.cpp does.
        if (failure.closed)
          (void)tw::ClosedError(failure.message);
        else
          (void)tw::RemoteError(failure.type, failure.message);
        break;
      }
      default:
        break;
    }
  } catch (const tw::ProtocolError&) {
  } catch (const tw::Error& e) {
    unexpected("client", e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  as_owner(input);
  as_client(input);
  return 0;
}
