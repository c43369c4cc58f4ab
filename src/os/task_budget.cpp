#include "os/task_budget.h"

#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <sstream>
#include <vector>

#include "tensorwire/core/error.h"

namespace tensorwire::os {

namespace {

// The first number in the file, or std::nullopt (none, or "max": no limit).
std::optional<size_t> read_number(const std::string& path) {
  std::ifstream f(path);
  size_t n = 0;
  if (!(f >> n)) return std::nullopt;
  return n;
}

// Threads of the whole machine: /proc/loadavg's "running/total" field. 0 when unknown.
size_t machine_tasks() {
  std::ifstream f("/proc/loadavg");
  std::string load1, load5, load15, counts;
  if (!(f >> load1 >> load5 >> load15 >> counts)) return 0;
  const size_t slash = counts.find('/');
  return slash == std::string::npos ? 0 : std::strtoull(counts.c_str() + slash + 1, nullptr, 10);
}

// Threads of the processes whose real uid is `uid`: what RLIMIT_NPROC counts. Processes
// this one cannot look into (hidepid) are left out.
size_t user_tasks(uid_t uid) {
  DIR* dir = ::opendir("/proc");
  if (dir == nullptr) return 0;
  size_t n = 0;
  while (const dirent* e = ::readdir(dir)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    std::ifstream status(std::string("/proc/") + e->d_name + "/status");
    std::optional<uid_t> real;
    std::string line;
    while (std::getline(status, line)) {
      if (line.rfind("Uid:", 0) == 0)
        real = static_cast<uid_t>(std::strtoul(line.c_str() + 4, nullptr, 10));
      if (line.rfind("Threads:", 0) == 0) {
        if (real == uid) n += std::strtoull(line.c_str() + 8, nullptr, 10);
        break;
      }
    }
  }
  ::closedir(dir);
  return n;
}

// The directories of the pids cgroups this process is in, innermost first: cgroup v2's
// unified hierarchy ("0::/path") or v1's pids controller ("N:pids:/path"). In a container
// with its own cgroup namespace the path is "/" and the container's own cgroup is what is
// mounted at /sys/fs/cgroup.
std::vector<std::string> pids_cgroups() {
  std::ifstream f("/proc/self/cgroup");
  std::string line;
  std::vector<std::string> dirs;
  while (std::getline(f, line)) {
    const size_t a = line.find(':'), b = line.find(':', a + 1);
    if (a == std::string::npos || b == std::string::npos) continue;
    const std::string id = line.substr(0, a), controllers = line.substr(a + 1, b - a - 1);
    std::string path = line.substr(b + 1);
    std::string base;
    if (id == "0" && controllers.empty()) {
      base = "/sys/fs/cgroup";
    } else {
      std::stringstream list(controllers);
      for (std::string c; std::getline(list, c, ',');)
        if (c == "pids") base = "/sys/fs/cgroup/pids";
    }
    if (base.empty() || path.find("..") != std::string::npos) continue;
    while (!path.empty() && path.back() == '/') path.pop_back();
    for (;;) {
      dirs.push_back(base + path);
      if (path.empty()) break;
      path.erase(path.rfind('/'));
    }
  }
  return dirs;
}

// Whether the kernel lets this process pass RLIMIT_NPROC: root of the machine's own user
// namespace, or a process with CAP_SYS_ADMIN or CAP_SYS_RESOURCE there. Root of a user
// namespace (a rootless container) is not.
bool exempt_from_nproc() {
  std::ifstream map("/proc/self/uid_map");
  uint64_t inside = 1, outside = 1, count = 0;
  if (!(map >> inside >> outside >> count) || inside != 0 || outside != 0 || count != 4294967295u)
    return false;
  if (::getuid() == 0) return true;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("CapEff:", 0) == 0) {
      const uint64_t caps = std::strtoull(line.c_str() + 7, nullptr, 16);
      return (caps & ((1ull << 21) | (1ull << 24))) != 0;  // CAP_SYS_ADMIN, CAP_SYS_RESOURCE
    }
  return false;
}

}  // namespace

void require_free_tasks(size_t needed, const std::string& what) {
  const std::string head =
      what + " needs about " + std::to_string(needed) + " more threads or processes, and ";
  rlimit l{};
  if (::getrlimit(RLIMIT_NPROC, &l) == 0 && l.rlim_cur != RLIM_INFINITY && !exempt_from_nproc()) {
    const auto limit = static_cast<size_t>(l.rlim_cur);
    const size_t machine = machine_tasks();
    if (machine == 0 || machine + needed > limit) {
      const size_t used = user_tasks(::getuid());
      if (used + needed > limit)
        throw SystemError(
            head + "user " + std::to_string(::getuid()) + " has " + std::to_string(used) +
                " of its limit (RLIMIT_NPROC, which counts "
                "threads) of " +
                std::to_string(limit) + ": raise it (ulimit -u, or resource.setrlimit in Python)",
            EAGAIN);
    }
  }
  for (const std::string& dir : pids_cgroups()) {
    const std::optional<size_t> max = read_number(dir + "/pids.max");
    const std::optional<size_t> current = read_number(dir + "/pids.current");
    if (max && current && *current + needed > *max)
      throw SystemError(head + "the cgroup " + dir + " has " + std::to_string(*current) +
                            " of its limit (pids.max) of " + std::to_string(*max) +
                            ": raise it (docker run --pids-limit; the container's pids.max)",
                        EAGAIN);
  }
}

}  // namespace tensorwire::os
