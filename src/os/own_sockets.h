// This process's own TCP sockets, found among its fds: the sockets of a library that does
// not hand them out (UCX's listener and the connections it accepted), for the few things
// tensorwire must do to them that the library has no call for (os/listeners.h,
// ucx::Listener's close).
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace tensorwire::os {

// Calls `fn(fd)` for each fd open in this process, read from /proc/self/fd (not the one
// that reading it uses). Nothing when /proc is not there.
void for_each_fd(const std::function<void(int)>& fn);

// Whether `fd` is a socket (of any kind).
bool is_socket(int fd);

// Whether `fd` is a listening socket.
bool is_listening(int fd);

// The numeric address and port of a TCP socket's address (IPv4 or IPv6), or {"", 0}.
std::pair<std::string, uint16_t> ip_port_of(const sockaddr_storage& s);

// The listening TCP sockets bound to `ip`:`port` ("0.0.0.0" as bound for every address).
std::vector<int> listening_sockets(const std::string& ip, uint16_t port);

// Calls `fn(fd)` for each connection accepted on `ip`:`port` (any local address where
// `ip` is "0.0.0.0"), `fd` a duplicate of the connection's fd, closed when `fn` returns: a
// number reused meanwhile by another thread's socket is never acted on by a stale look.
void for_each_accepted(const std::string& ip, uint16_t port, const std::function<void(int)>& fn);

// Shuts down (both ways) every connection accepted on `ip`:`port` (any local address where
// `ip` is "0.0.0.0") on which this process has sent nothing: connections whose server has
// not answered. Returns how many such sockets are still open, shut down before or now,
// counting those whose client has closed too (what the client sent may still be unread).
// Looked at as for_each_accepted does.
size_t shut_down_unanswered(const std::string& ip, uint16_t port);

// Shuts down (both ways) every connection accepted on `ip`:`port` on which nothing was
// received or sent for `silent_for` since it was made: a peer that connected and never sent
// a byte its server accepted (ucx/sockcm_guard.h drops junk unread). Returns their peers'
// addresses ("ip:port").
std::vector<std::string> shut_down_silent(const std::string& ip, uint16_t port,
                                          std::chrono::milliseconds silent_for);

// Makes the listening socket `fd` take no new connection: a socket filter that drops every
// packet, so the kernel completes no handshake from here on (a client's SYN goes
// unanswered, and is refused once the socket is closed). Connections the kernel completed
// already stay queued for accept(). False when the kernel refused the filter.
bool drop_new_connections(int fd) noexcept;

}  // namespace tensorwire::os
