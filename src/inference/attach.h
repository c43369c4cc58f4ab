// Attaching a client to a transport by name (the shared-memory attach handshake and the
// socket transport's clients connect with os::UnixSocket::connect, which tries again while
// nothing listens yet: a client may be made before its transport).
#pragma once

#include <chrono>

namespace tensorwire::inference::detail {

// How long a client waits for its transport to accept it on first use.
inline constexpr std::chrono::seconds kConnectTimeout{3};

// How long an owner waits for a client that just connected to take its welcome (a few
// hundred bytes, which the socket buffer takes at once): a client that connects and then
// stops (SIGSTOP) or never reads cannot hold the owner's thread longer than this.
inline constexpr std::chrono::seconds kWelcomeTimeout{2};

}  // namespace tensorwire::inference::detail
