// The attach handshake of a SharedMemoryTransport, over its abstract Unix socket.
//
// The owner speaks first, as soon as it accepts a connection:
//   1. a JSON control message {"protocol", "client_id", "num_slots", "owner_pid"} with
//      three fds: control segment, request bank, response bank
//   2. the request spec and 3. the response spec, each one wire-codec message
// Before that, the owner checks the client's uid (SO_PEERCRED); a client it does not admit
// gets one JSON message {"refused": "<why>"} with no fd instead, and the connection is
// closed: no segment fd and no byte of a spec has travelled. The client checks the owner's
// uid too (its own user or root) before it reads anything.
// The client validates everything (sizes of the segments against the specs, the
// control header) before using the memory. It then keeps the socket open and silent:
// the owner treats EOF on it (or the client's pidfd) as the client's death.
#pragma once

#include <cerrno>

#include <memory>

#include "os/unix_socket.h"
#include "shm_region.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::inference::detail {

void send_welcome(os::UnixSocket& socket, const ShmRegion& region, uint32_t client_id);
// Tells a client it is not admitted (`why` names its uid and who is); never blocks.
// `code`: the errno the client raises (EACCES: not admitted; EMFILE: the owner has no
// descriptor left).
void send_refusal(os::UnixSocket& socket, const std::string& why, int code = EACCES);

struct Welcome {
  std::shared_ptr<ShmRegion> region;
  uint32_t client_id = 0;
  int owner_pid = 0;
};
// Waits for the welcome until `deadline` (TimeoutError), interruptibly.
Welcome receive_welcome(os::UnixSocket& socket, Deadline deadline);

}  // namespace tensorwire::inference::detail
