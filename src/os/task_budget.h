// How many more threads and processes this process may start, checked before work that
// starts several. libzmq and UCX abort the process (an assertion) when a thread of theirs
// cannot be started; a check beforehand turns a thread or process limit (RLIMIT_NPROC, a
// container's pids.max) into an error that names the limit, with nothing half-made.
#pragma once

#include <cstddef>
#include <string>

namespace tensorwire::os {

// SystemError (EAGAIN) when `needed` more threads or processes would pass this user's
// RLIMIT_NPROC (which counts threads; root and CAP_SYS_RESOURCE are exempt) or pids.max of
// a cgroup this process sees itself in (a container sees its own and those below; a limit
// set above it, a Kubernetes pod's, is not visible there): "<what> needs about N more threads or
// processes, and ...: raise it". Cheap where there is room: a machine with fewer threads in all
// than the limit settles RLIMIT_NPROC (one read of /proc/loadavg; only otherwise are the user's
// threads counted), and each cgroup level is two small reads.
void require_free_tasks(size_t needed, const std::string& what);

}  // namespace tensorwire::os
