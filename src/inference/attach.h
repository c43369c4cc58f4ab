// Connecting to a transport's abstract Unix socket by name, for the shared-memory attach
// handshake and the socket transport's clients: retried while nothing listens yet (a
// client may be made before its transport), interruptibly, until `deadline`.
#pragma once

#include <string>

#include "os/unix_socket.h"
#include "tensorwire/runtime/timeout.h"

namespace tensorwire::inference::detail {

// SystemError (connection refused) when nothing listens on `name` by the deadline.
os::UnixSocket connect_by_name(const std::string& name, Deadline deadline);

// Receives one message, waiting interruptibly until `deadline`; std::nullopt on timeout,
// ClosedError when the peer closed.
std::optional<os::Message> recv_until(os::UnixSocket& socket, Deadline deadline);

// How long a client waits for its transport to accept it on first use.
inline constexpr std::chrono::seconds kConnectTimeout{3};

}  // namespace tensorwire::inference::detail
