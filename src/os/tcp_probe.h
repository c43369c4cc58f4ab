// Whether anything accepts TCP connections at an address: what tells a refused connection
// from one that a server took and then ended, where the engine reports both alike (UCX's
// "Endpoint is not connected").
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace tensorwire::os {

enum class TcpProbe { Accepting, Refused, NoAnswer };

// Connects to `ip`:`port` (numeric IPv4 or IPv6) and closes at once, waiting at most
// `timeout`. A listener sees a connection that sends nothing and ends: UCX's drops it
// silently. NoAnswer: no answer in time, or an error other than a refusal.
TcpProbe probe_tcp(const std::string& ip, uint16_t port, std::chrono::milliseconds timeout);

}  // namespace tensorwire::os
