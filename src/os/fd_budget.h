// How many more file descriptors this process may open, checked before work that needs
// many at once. libzmq and UCX abort the process (an assertion in their own threads) when
// they meet EMFILE halfway through setting up a socket, a listener or a worker; a check
// beforehand turns a low `ulimit -n` (a container's, a batch job's) into an error that
// names the limit, with nothing half-made.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

namespace tensorwire::os {

// File descriptors this process can still open below its limit (RLIMIT_NOFILE's soft
// limit): std::nullopt when the limit is infinite or the count cannot be read (no /proc).
std::optional<size_t> free_fds();

// SystemError (EMFILE) when fewer than `needed` are free: "<what> needs about N free file
// descriptors; this process has M of its limit (RLIMIT_NOFILE) L free: raise it ...".
// Cheap where many are free (one fcntl per number of the `needed` just below the limit);
// it counts the open ones only where one of those is open.
void require_free_fds(size_t needed, const std::string& what);

}  // namespace tensorwire::os
