// A guard in front of UCX's TCP connection manager (tcp_sockcm), which reads the first
// bytes of every connection to a listening port before tensorwire sees the connection.
//
// UCX 1.13 trusts those bytes: a 16-byte header (the length of what follows, 8 bytes
// little-endian; a status byte; padding) and then that many bytes. A peer that sends more
// in one go than its header announces (24 bytes of zeros, a stray HTTP request, a port
// scanner's probe) trips an assertion in tcp_sockcm_ep.c and aborts the listening process;
// one that announces more than UCX's buffer holds makes UCX's thread read nothing for ever,
// at full CPU. The guard is a socket filter (classic BPF) on the listening socket, which
// every accepted connection inherits; the kernel runs it on each incoming TCP segment and
// drops a segment whose payload is not exactly one such message: a header announcing at
// most what UCX reads, and exactly that much after it. A UCX 1.13 peer sends each message
// in one write (a connection request of 63 bytes here, then a 16-byte notice), which
// leaves in one segment: far under the smallest IPv4 segment size (536 bytes).
//
// A dropped segment is never acknowledged: the junk never reaches UCX, and the peer's TCP
// retries until it gives up. ucx::Listener shuts such connections down (os::
// shut_down_silent). What the guard does not stop is a peer that frames its bytes as UCX
// does: those reach UCX's own parser of the connection request (docs/reliability.md).
//
// TENSORWIRE_UCX_LISTENER_GUARD=0 leaves listeners unguarded (for connection requests
// that would not fit one segment: a UCX that packs many devices into one, a tiny MTU).
#pragma once

#include <cstdint>

namespace tensorwire::ucx {

// UCX's default UCX_TCP_CM_PRIV_DATA_LEN (2048), plus the 16 bytes it adds to it.
inline constexpr uint32_t kUcxDefaultPrivateData = 2048 + 16;
// Whatever the setting, the guard checks that a length's upper six bytes are zero.
inline constexpr uint32_t kGuardMaxPrivateData = 0xffff;

// The most a connection request may announce: UCX's own limit, from
// UCX_TCP_CM_PRIV_DATA_LEN as UCX reads it (2K, 4096, 1m; kGuardMaxPrivateData when it
// cannot be read here).
uint32_t sockcm_max_private_data() noexcept;

// Whether listeners are guarded (unless TENSORWIRE_UCX_LISTENER_GUARD=0).
bool guard_enabled() noexcept;

// Attaches the filter to the socket `fd` (a listening one: inherited by the connections
// accepted on it from then on; an accepted one: from its next segment). False when the
// kernel refused it (errno says why).
bool guard_sockcm_socket(int fd, uint32_t max_private_data) noexcept;

}  // namespace tensorwire::ucx
