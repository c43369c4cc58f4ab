#include "dataflow/fork_server.h"

#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <tuple>

#include "dataflow/workers.h"
#include "tensorwire/core/error.h"

namespace tensorwire::dataflow::detail {

namespace {

using namespace std::chrono_literals;

// The link carries fixed-size records between two processes of one program (a fork of it),
// so they are copied as they are in memory. Orders go to the server, reports come back.
struct Order {
  int32_t index, num_workers;  // index -1: quit (close())
  uint64_t seed;
  uint32_t tag;
};
enum class Kind : char { Spawned = 'P', Failed = 'F', Ended = 'E' };
struct Report {
  Kind kind;
  int32_t pid;    // Spawned, Ended
  int32_t value;  // Failed: errno; Ended: the wait status, -1 when it could not be reaped
};

template <class T>
std::string record(const T& t) {
  return std::string(reinterpret_cast<const char*>(&t), sizeof t);
}
template <class T>
T read_record(const std::string& bytes) {
  T t;
  if (bytes.size() != sizeof t) throw ProtocolError("fork server: a record of the wrong size");
  std::memcpy(&t, bytes.data(), sizeof t);
  return t;
}

// The server's reports are sent with this bound: the main process reads them promptly, and
// one that stopped reading is waited for no longer (it is then gone or stopped).
constexpr auto kSendBound = 10s;

}  // namespace

ForkServer::ForkServer(std::string owner, ForkHooks hooks, const std::function<void()>& in_server,
                       Body body)
    : owner_(std::move(owner)), hooks_(std::move(hooks)), body_(std::move(body)) {
  os::UnixSocket theirs;
  std::tie(link_, theirs) = os::UnixSocket::pair();
  // The server is no worker: current_worker() stays unset in it (nullptr info).
  pid_ = fork_process(hooks_, nullptr, owner_ + ": fork of its fork server", [&]() -> int {
    link_ = std::move(theirs);  // and the main process's end closed
    // Named apart from the workers (ps, top, /proc/PID/comm): a tool that picks the runner's
    // workers among its descendants must not take this process for one. The workers it
    // forks get the main process's name back.
    ::prctl(PR_GET_NAME, worker_name_);
    ::prctl(PR_SET_NAME, kProcessName);
    serve(in_server);
  });
  owner_pid_ = ::getpid();
}

void ForkServer::serve(const std::function<void()>& in_server) {
  try {
    in_server();
  } catch (...) {
    ::_exit(1);
  }
  std::map<int, os::ProcessWatch> children;
  std::vector<pollfd> fds;
  while (true) {
    fds.assign(1, pollfd{link_.fd(), POLLIN, 0});
    for (auto& [pid, watch] : children) fds.push_back({watch.fd(), POLLIN, 0});
    // Not interruptible on purpose: SIGINT is ignored here, and the main process ends the
    // server by closing the link (or by dying: PR_SET_PDEATHSIG).
    if (::poll(fds.data(), fds.size(), -1) < 0 && errno != EINTR) break;
    try {
      for (size_t i = 1; i < fds.size(); ++i) {
        if (!(fds[i].revents & (POLLIN | POLLHUP))) continue;
        const auto it = std::next(children.begin(), static_cast<long>(i - 1));
        int status = -1;
        if (!os::reap(it->first, 1s, &status)) status = -1;
        link_.send(record(Report{Kind::Ended, it->first, status}), {}, Deadline::after(kSendBound));
        fds[i].fd = -1;
        children.erase(it);
        break;  // the iterators moved: poll again
      }
      if (fds[0].revents) {
        bool quit = false;
        while (!quit)
          if (auto m = link_.recv(os::Millis(0)))
            quit = !fork_worker(std::move(*m), children);
          else
            break;
        if (quit) break;
      }
    } catch (...) {
      break;  // the main process closed the link (ClosedError) or stopped reading
    }
  }
  // The runner is closing (or gone): what the server forked goes with it.
  for (auto& [pid, watch] : children)
    if (::syscall(SYS_pidfd_send_signal, watch.fd(), SIGKILL, nullptr, 0) != 0)
      ::kill(pid, SIGKILL);
  for (auto& [pid, watch] : children) os::reap(pid, 10s);
  ::_exit(0);
}

bool ForkServer::fork_worker(os::Message m, std::map<int, os::ProcessWatch>& children) {
  const auto o = read_record<Order>(m.bytes);
  if (o.index < 0) return false;  // quit
  const WorkerInfo info{o.index, o.num_workers, o.seed};
  int pid = -1;
  try {
    pid = fork_process(hooks_, &info, owner_ + ": fork of worker " + std::to_string(o.index),
                       [&]() -> int {
                         ::prctl(PR_SET_NAME, worker_name_);
                         link_.close();  // the worker has no business with the main process's link
                         children.clear();
                         return body_(info, o.tag, std::move(m.fds));
                       });
  } catch (const SystemError& e) {
    link_.send(record(Report{Kind::Failed, -1, e.code()}), {}, Deadline::after(kSendBound));
    return true;
  }
  os::ProcessWatch watch(pid);  // our child, not reaped: it is this process whatever happened
  link_.send(record(Report{Kind::Spawned, pid, 0}), {watch.fd()}, Deadline::after(kSendBound));
  children.emplace(pid, std::move(watch));
  return true;
}

std::optional<os::Message> ForkServer::next_report(Deadline deadline) {
  // Not interruptible (recv(Millis) never checks for Ctrl-C): an exchange given up halfway
  // would read this order's late answer as the next one's. It is bounded by `deadline`.
  while (true) {
    const auto left = std::chrono::ceil<os::Millis>(deadline.left());
    if (auto m = link_.recv(std::min(left, os::Millis(100)))) return m;
    if (deadline.passed()) return std::nullopt;
  }
}

ForkServer::Spawned ForkServer::spawn(const WorkerInfo& info, uint32_t tag,
                                      const std::vector<int>& fds) {
  const std::string what = owner_ + ": fork of worker " + std::to_string(info.index);
  const Deadline deadline = Deadline::after(kSendBound);
  // Only the server's own fork failing is a SystemError: any failure of the link says that
  // the server is gone (ClosedError), which the caller survives.
  auto on_link = [&](auto step) {
    try {
      if (!link_.valid()) throw ClosedError(what + ": the fork server is closed");
      return step();
    } catch (const SystemError& e) {
      throw ClosedError(what + ": the fork server's link failed (" + e.what() + ")");
    }
  };
  const std::string order = record(Order{info.index, info.num_workers, info.seed, tag});
  // (A send this small fits in the socket's buffer: it never waits, so never sees Ctrl-C.)
  if (!on_link([&] { return link_.send(order, fds, deadline); }))
    throw TimeoutError(what + ": the fork server took no order for 10 s");
  while (true) {
    std::optional<os::Message> m = on_link([&] { return next_report(deadline); });
    if (!m) throw TimeoutError(what + ": the fork server did not answer within 10 s");
    const auto r = read_record<Report>(m->bytes);
    if (r.kind == Kind::Ended) {
      ended_[r.pid] = r.value;
    } else if (r.kind == Kind::Failed) {
      throw SystemError(what + " (by the fork server)", r.value);
    } else {
      if (m->fds.size() != 1) throw ProtocolError(what + ": the fork server sent no pidfd");
      return Spawned{r.pid, std::move(m->fds[0])};
    }
  }
}

std::optional<int> ForkServer::status_of(int pid, Deadline deadline) {
  try {
    while (!ended_.count(pid)) {
      if (!link_.valid()) return std::nullopt;
      auto m = next_report(deadline);
      if (!m) return std::nullopt;
      const auto r = read_record<Report>(m->bytes);
      if (r.kind == Kind::Ended) ended_[r.pid] = r.value;
    }
  } catch (const Error&) {
    return std::nullopt;  // the server is gone: nobody knows the status any more
  }
  const int status = ended_[pid];
  ended_.erase(pid);
  if (status < 0) return std::nullopt;  // the server could not reap it
  return status;
}

void ForkServer::close() noexcept {
  if (pid_ < 0 || owner_pid_ != ::getpid()) {  // a forked copy: not our child
    link_.close();
    return;
  }
  // Told, not only closed: a process forked from this one since (another runner's workers, a
  // multiprocessing child) holds this end too, and the server would never read end-of-file.
  try {
    link_.send(record(Order{-1, 0, 0, 0}), {}, Deadline::after(100ms));
  } catch (const Error&) {
  }
  link_.close();  // and end-of-file for a server that missed the order
  // It exits as soon as it has reaped what it forked (killed by then); one that does not is
  // stopped (SIGSTOP) or stuck, and is killed (its workers go with it: PR_SET_PDEATHSIG).
  if (!os::reap(pid_, 2s, &exit_status_)) {
    ::kill(pid_, SIGKILL);
    os::reap(pid_, 10s, &exit_status_);
  }
  pid_ = -1;
}

}  // namespace tensorwire::dataflow::detail
