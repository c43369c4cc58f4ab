#include "ucx/control.h"

#include <string>
#include <thread>
#include <vector>

#include "runtime/wait.h"
#include "wire/control_frame.h"

namespace tensorwire::ucx {

namespace {

// Progresses `worker` until `done()`, sleeping on its fd in slices; ClosedError once the
// endpoint failed or `abandon` is requested, TimeoutError at the deadline.
template <class Done>
void wait_for(Worker& worker, Endpoint& ep, Deadline deadline, const char* what,
              const std::stop_token& abandon, Done&& done) {
  const bool ok = runtime::wait_until(deadline, [&](Deadline slice) {
    while (worker.progress()) {
    }
    if (done()) return true;
    if (abandon.stop_requested())
      throw ClosedError(std::string(what) + " with " + ep.peer() + " abandoned: closing");
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

void throw_foreign_tag(uint64_t tag, const char* what) {
  throw ProtocolError(std::string(what) + ": the peer sent a message on tag " +
                      std::to_string(tag) + ", which is not one of this connection's");
}

Deadline frame_deadline(std::chrono::milliseconds liveness_timeout) {
  return Deadline::after(liveness_timeout.count() > 0 ? liveness_timeout
                                                      : std::chrono::seconds(10));
}

std::vector<std::byte> receive_probed(Worker& worker, Endpoint& ep, ucp_tag_message_h m,
                                      size_t length, Deadline finish, const char* what) {
  // On the heap, with the length UCX writes on completion: both may outlive a receive given up.
  struct Incoming {
    std::vector<std::byte> bytes;
    size_t got = 0;
  };
  auto in = std::make_shared<Incoming>();
  in->bytes.resize(length);
  Request req = ep.recv(m, in->bytes, &in->got);
  for (int idle = 0; !req.done();) {
    if (ep.error() != UCS_OK || finish.passed()) {
      worker.keep_until_destroyed(in);
      throw ClosedError(std::string(what) + ": " + ep.peer() +
                        " stopped in the middle of a message of " + std::to_string(length) +
                        " bytes");
    }
    // The rest is usually microseconds away; a peer that stopped costs no CPU.
    if (worker.progress() != 0)
      idle = 0;
    else if (++idle > 64)
      std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  return std::move(in->bytes);
}

std::optional<Json> take_control(Worker& worker, Endpoint& ep, uint64_t tag, size_t max_bytes,
                                 const wire::Limits& limits, const char* what, Deadline finish) {
  auto m = ep.probe(tag);
  if (!m) return std::nullopt;
  try {
    wire::check_control_length(m->first, max_bytes, what);
  } catch (const ProtocolError&) {
    // Taken off UCX's queue into a few bytes, never the length it announces: UCX ends such a
    // receive as truncated (a rendezvous moves no data then).
    try {
      receive_probed(worker, ep, m->second, 16, finish, what);
    } catch (const Error&) {
    }
    throw;
  }
  return wire::parse_control_frame(receive_probed(worker, ep, m->second, m->first, finish, what),
                                   limits, what);
}

void wait_sent(Worker& worker, Endpoint& ep, Request& req, Deadline deadline, const char* what,
               std::stop_token abandon) {
  wait_for(worker, ep, deadline, what, abandon, [&] { return req.done(); });
}

void send_control(Worker& worker, Endpoint& ep, uint64_t tag, const Json& body, Deadline deadline,
                  std::stop_token abandon) {
  std::vector<std::byte> frame = wire::control_frame(body);
  Request req = ep.send(tag, frame);
  wait_sent(worker, ep, req, deadline, "handshake", abandon);
}

Json recv_control(Worker& worker, Endpoint& ep, uint64_t tag, const wire::Limits& limits,
                  Deadline deadline, const char* what, std::stop_token abandon) {
  Json body;
  wait_for(worker, ep, deadline, what, abandon, [&] {
    std::optional<Json> got =
        take_control(worker, ep, tag, kMaxControlFrame, limits, what, deadline);
    if (got) body = std::move(*got);
    return got.has_value();
  });
  return body;
}

void wait_wired_up(Worker& worker, Endpoint& ep, Deadline deadline, const char* what,
                   std::stop_token abandon) {
  Request flushed = ep.flush();
  wait_for(worker, ep, deadline, what, abandon, [&] { return flushed.done(); });
}

void let_wireup_end(Worker& worker, Endpoint& ep, std::chrono::milliseconds budget) noexcept {
  try {
    if (ep.error() != UCS_OK) return;  // failed: nothing more happens on it
    Request flushed = ep.flush();
    const Deadline deadline = Deadline::after(budget);
    while (!flushed.done() && !deadline.passed())
      if (!worker.progress()) worker.wait(std::chrono::milliseconds(1));
  } catch (...) {  // the flush failed: the wire-up is over
  }
}

}  // namespace tensorwire::ucx
