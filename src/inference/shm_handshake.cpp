#include "shm_handshake.h"

#include "attach.h"
#include "tensorwire/core/json.h"
#include "tensorwire/inference/shared_memory_transport.h"
#include "wire/message_bytes.h"

namespace tensorwire::inference::detail {

namespace {

os::Message expect(os::UnixSocket& socket, Deadline deadline, const char* what) {
  auto m = socket.recv(deadline);
  if (!m)
    throw TimeoutError(std::string("shared-memory transport: no ") + what +
                       " from the owner in time (attach timeout)");
  return std::move(*m);
}

}  // namespace

void send_welcome(os::UnixSocket& socket, const ShmRegion& region, uint32_t client_id) {
  Json hello = {{"protocol", kProtocolVersion},
                {"client_id", client_id},
                {"num_slots", region.num_slots},
                {"owner_pid", region.header->owner_pid}};
  // Bounded: a client that connected and stopped reading must not hold the owner's thread.
  const Deadline deadline = Deadline::after(kWelcomeTimeout);
  if (!socket.send(
          hello.dump(),
          {region.control_segment.fd(), region.request_segment.fd(), region.response_segment.fd()},
          deadline) ||
      !socket.send(wire::encode_structure(region.request.spec()), {}, deadline) ||
      !socket.send(wire::encode_structure(region.response.spec()), {}, deadline))
    throw TimeoutError("shared-memory transport: the client did not take its welcome within " +
                       Timeout(kWelcomeTimeout).str());
}

void send_refusal(os::UnixSocket& socket, const std::string& why, int code) {
  try {
    socket.post(Json{{"refused", why}, {"errno", code}}.dump());
  } catch (const Error&) {
  }
}

Welcome receive_welcome(os::UnixSocket& socket, Deadline deadline) {
  os::Message hello = expect(socket, deadline, "welcome");
  wire::Limits limits;
  Json j = wire::parse_untrusted_json(
      std::as_bytes(std::span<const char>(hello.bytes.data(), hello.bytes.size())), limits,
      "shared-memory welcome");
  if (j.is_object() && j.contains("refused")) {
    const Json& why = j["refused"];
    // Only the codes an owner sends; anything else (an older owner sends none) is EACCES.
    int code = EACCES;
    if (auto it = j.find("errno"); it != j.end() && it->is_number_unsigned()) {
      const uint64_t c = it->get<uint64_t>();
      if (c == EMFILE || c == ENFILE) code = static_cast<int>(c);
    }
    throw SystemError(why.is_string() ? why.get<std::string>() : why.dump(), code);
  }
  auto field = [&](const char* name) -> uint64_t {
    auto it = j.find(name);
    if (it == j.end() || !it->is_number_unsigned())
      throw ProtocolError(std::string("shared-memory welcome: missing or bad \"") + name + "\"");
    return it->get<uint64_t>();
  };
  if (!j.is_object()) throw ProtocolError("shared-memory welcome: not a JSON object");
  if (field("protocol") != kProtocolVersion)
    throw ProtocolError("shared-memory transport speaks protocol " +
                        std::to_string(field("protocol")) + ", this client " +
                        std::to_string(kProtocolVersion));
  const uint64_t num_slots = field("num_slots");
  if (num_slots < 1 || num_slots > static_cast<uint64_t>(kMaxSlots))
    throw ProtocolError("shared-memory welcome: num_slots " + std::to_string(num_slots));
  if (hello.fds.size() != 3)
    throw ProtocolError("shared-memory welcome carries " + std::to_string(hello.fds.size()) +
                        " fds, expected 3");
  os::Message req = expect(socket, deadline, "request spec");
  TensorDict request_spec =
      wire::decode_structure(std::as_bytes(std::span<const char>(req.bytes)), limits);
  os::Message resp = expect(socket, deadline, "response spec");
  TensorDict response_spec =
      wire::decode_structure(std::as_bytes(std::span<const char>(resp.bytes)), limits);
  Welcome w;
  w.region = ShmRegion::map(request_spec, response_spec, static_cast<uint32_t>(num_slots),
                            hello.fds[0].get(), hello.fds[1].get(), hello.fds[2].get());
  w.client_id = static_cast<uint32_t>(field("client_id"));
  w.owner_pid = static_cast<int>(field("owner_pid"));
  if (w.client_id == 0) throw ProtocolError("shared-memory welcome: client id 0");
  return w;
}

}  // namespace tensorwire::inference::detail
