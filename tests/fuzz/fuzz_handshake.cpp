// libFuzzer target: the pipe's connection handshake (src/wire/handshake.h) against a peer
// that sends arbitrary control messages.
//
// The input is up to three control messages separated by "\n--\n"; each one's JSON goes
// through parse_untrusted_json (what the pipe's take_control does with a control frame's
// body, after the frame header that fuzz_decoder covers), and the handshake's recv() hands
// them out in order; once they run out, recv() throws ClosedError as the pipe's does when
// the peer goes away. Both roles run, with and without an auth key, with and without
// heartbeats.
//
// A bad peer may only end the handshake with HandshakeError (or the ClosedError of recv
// itself, or a ProtocolError of the JSON parser); any other tensorwire::Error is a finding,
// and anything else (a JSON type_error, say) escapes and libFuzzer reports it. What this
// side sends must encode as a control frame. An identity accepted from the peer must be
// usable: a pid that is -1 (unknown) or a valid pid, a heartbeat period that is -1 or
// within the documented range.
#include <span>
#include <string>
#include <string_view>
#include <typeinfo>
#include <vector>

#include "check.h"
#include "tensorwire/core/error.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "wire/handshake.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

constexpr wire::Limits kLimits = tw::fuzz::limits();
constexpr int64_t kMaxHeartbeatMs = 3600 * 1000;  // wire/handshake.cpp
using tw::fuzz::finding;

struct PeerClosed : tw::ClosedError {
  using tw::ClosedError::ClosedError;
};

void run(bool as_server, const wire::HandshakeConfig& config, const std::vector<tw::Json>& peer) {
  size_t next = 0;
  auto recv = [&]() -> tw::Json {
    if (next == peer.size()) throw PeerClosed("the peer closed the connection");
    return peer[next++];
  };
  auto send = [](const tw::Json& j) {
    // What the pipe does with it (PipeImpl::control_frame).
    (void)wire::Encoder::control(j);
  };
  try {
    const wire::PeerIdentity id = as_server ? wire::handshake_as_server(config, send, recv)
                                            : wire::handshake_as_client(config, send, recv);
    if (id.pid != -1 && id.pid <= 0)
      finding("accepted a peer pid of " + std::to_string(id.pid) + " (not a process id)");
    if (id.heartbeat_ms < -1 || id.heartbeat_ms > kMaxHeartbeatMs)
      finding("accepted a heartbeat period of " + std::to_string(id.heartbeat_ms) + " ms");
  } catch (const wire::HandshakeError&) {
  } catch (const PeerClosed&) {
  } catch (const tw::Error& e) {
    finding(std::string("a bad peer ended the handshake with ") + typeid(e).name() +
            " instead of HandshakeError: " + e.what());
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view rest(reinterpret_cast<const char*>(data), size);
  std::vector<tw::Json> peer;
  constexpr std::string_view kSeparator = "\n--\n";
  while (peer.size() < 3) {
    const size_t cut = rest.find(kSeparator);
    const std::string_view piece = rest.substr(0, cut);
    try {
      peer.push_back(
          wire::parse_untrusted_json(std::as_bytes(std::span(piece)), kLimits, "control message"));
    } catch (const tw::ProtocolError&) {
      break;  // the pipe fails there: the handshake sees the messages before this one
    }
    if (cut == std::string_view::npos) break;
    rest.remove_prefix(cut + kSeparator.size());
  }
  for (bool as_server : {true, false})
    for (const char* key : {"", "secret"})
      for (int64_t heartbeat : {int64_t{-1}, int64_t{0}, int64_t{2000}})
        run(as_server, {"pipe", "consolidated", key, heartbeat}, peer);
  return 0;
}
