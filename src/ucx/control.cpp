#include "ucx/control.h"

#include <string>
#include <vector>

#include "runtime/wait.h"
#include "wire/control_frame.h"

namespace tensorwire::ucx {

namespace {

// Progresses `worker` until `done()`, sleeping on its fd in slices; ClosedError once the
// endpoint failed, TimeoutError at the deadline.
template <class Done>
void wait_for(Worker& worker, Endpoint& ep, Deadline deadline, const char* what, Done&& done) {
  const bool ok = runtime::wait_until(deadline, [&](Deadline slice) {
    while (worker.progress()) {
    }
    if (done()) return true;
    if (ep.error() != UCS_OK)
      throw ClosedError(std::string(what) + ": connection to " + ep.peer() +
                        " lost: " + ucs_status_string(ep.error()));
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(slice.left());
    worker.wait(std::max(left, std::chrono::milliseconds(1)));
    return false;
  });
  if (!ok) throw TimeoutError(std::string(what) + " timed out (peer " + ep.peer() + ")");
}

}  // namespace

std::optional<Json> take_control(Worker& worker, Endpoint& ep, uint64_t tag, size_t max_bytes,
                                 const wire::Limits& limits, const char* what) {
  auto m = ep.probe(tag);
  if (!m) return std::nullopt;
  std::vector<std::byte> buf;
  try {
    wire::check_control_length(m->first, max_bytes, what);
    buf.resize(m->first);
  } catch (...) {
    // Received into a scratch buffer and dropped, so it does not stay in UCX's queue.
    std::vector<std::byte> scratch(m->first);
    size_t got = 0;
    Request req = ep.recv(m->second, scratch, &got);
    while (!req.done()) worker.progress();
    throw;
  }
  size_t got = 0;
  Request req = ep.recv(m->second, buf, &got);
  while (!req.done()) worker.progress();
  return wire::parse_control_frame(buf, limits, what);
}

void send_control(Worker& worker, Endpoint& ep, uint64_t tag, const Json& body, Deadline deadline) {
  std::vector<std::byte> frame = wire::control_frame(body);
  Request req = ep.send(tag, frame);
  wait_for(worker, ep, deadline, "handshake", [&] { return req.done(); });
}

Json recv_control(Worker& worker, Endpoint& ep, uint64_t tag, const wire::Limits& limits,
                  Deadline deadline, const char* what) {
  Json body;
  wait_for(worker, ep, deadline, what, [&] {
    std::optional<Json> got = take_control(worker, ep, tag, kMaxControlFrame, limits, what);
    if (got) body = std::move(*got);
    return got.has_value();
  });
  return body;
}

void wait_wired_up(Worker& worker, Endpoint& ep, Deadline deadline, const char* what) {
  Request flushed = ep.flush();
  wait_for(worker, ep, deadline, what, [&] { return flushed.done(); });
}

}  // namespace tensorwire::ucx
