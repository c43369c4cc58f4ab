// A guard in front of UCX's TCP connection manager (tcp_sockcm), which reads the first
// bytes of every connection to a listening port before tensorwire sees the connection.
//
// UCX 1.13 trusts those bytes: a 16-byte header (the length of what follows, 8 bytes
// little-endian; a status byte; padding) and then that many bytes. A peer that sends more
// in one go than its header announces (24 bytes of zeros, a stray HTTP request, a port
// scanner's probe) trips an assertion in tcp_sockcm_ep.c and aborts the listening process.
// The guard is a socket filter (classic BPF) on the listening socket, which every accepted
// connection inherits; the kernel runs it on each incoming TCP segment and drops a segment
// whose payload is not exactly one such message: a header whose length is below 64 KiB
// and exactly the rest of the segment. A UCX peer sends each message in one write of a few
// hundred bytes (its connection request, then a 16-byte notice), one segment each.
//
// A dropped segment is never acknowledged: the junk never reaches UCX, the peer's TCP
// retries until it gives up, and the connection holds one socket in the listening process
// until the listener closes (ucx::Listener's close shuts such connections down). What the
// guard does not stop is a peer that frames its bytes as UCX does: those reach UCX's own
// parser of the connection request (docs/reliability.md, "Known limits").
#pragma once

namespace tensorwire::ucx {

// The largest length a guarded header may announce (UCX's default is 2048 bytes of
// private data; UCX_TCP_CM_PRIV_DATA_LEN may raise it).
inline constexpr unsigned kGuardMaxPrivateData = 0xffff;

// Attaches the filter to the listening socket `fd` (inherited by the connections accepted
// on it from then on). False when the kernel refused it.
bool guard_sockcm_socket(int fd) noexcept;

}  // namespace tensorwire::ucx
