// Liveness: how long a connection to another host may stay silent before its peer is taken
// for gone. A peer process that dies is noticed at once (its kernel closes the connection);
// a peer whose host vanished, or the link to it (no FIN, no RST), says nothing, and TCP on
// its own notices only after minutes. So connections that cross hosts exchange heartbeats
// (docs/protocol.md) and fail with ClosedError once the peer's stop for longer than the
// liveness timeout.
#pragma once

#include <chrono>
#include <optional>

namespace tensorwire {

// The default liveness timeout: 10 s, or TENSORWIRE_LIVENESS_TIMEOUT (seconds, a number
// >= 0; 0 turns liveness checks off). A malformed value is a ValueError naming the variable.
std::chrono::milliseconds default_liveness_timeout();

// A liveness timeout from Python-style seconds: std::nullopt gives the default above, 0 turns
// checks off, a negative or NaN number is a ValueError naming `what`.
std::chrono::milliseconds liveness_timeout_seconds(std::optional<double> s, const char* what);

// An option's duration, checked where the options are taken: a ValueError naming `what`
// when it is negative (or, unless `zero_allowed`, zero). Unchecked, a liveness bound of
// -1 ms turned the checks off and a handshake bound of -1 ms refused every peer, far from
// the mistake.
std::chrono::milliseconds checked_duration(std::chrono::milliseconds d, const char* what,
                                           bool zero_allowed = true);

}  // namespace tensorwire
