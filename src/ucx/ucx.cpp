#include "ucx.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <sys/socket.h>
#include <ucm/api/ucm.h>
#include <ucs/config/global_opts.h>
#include <ucs/debug/debug.h>
#include <ucs/debug/log_def.h>

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>
#include <mutex>
#include <sstream>
#include <string_view>
#include <thread>
#include <utility>

#include "os/fd_budget.h"
#include "os/fork.h"
#include "os/own_sockets.h"
#include "os/task_budget.h"
#include "os/tcp_probe.h"
#include "tensorwire/runtime/log.h"
#include "tensorwire/runtime/timeout.h"
#include "ucx/sockcm_guard.h"

namespace tensorwire::ucx {

bool inherited(uint64_t generation) noexcept {
  return os::fork_generation() != generation;
}

ClosedError inherited_error(const std::string& what, pid_t owner) {
  return ClosedError(what + " was made by process " + std::to_string(owner) +
                     " and inherited by its forked child (pid " + std::to_string(::getpid()) +
                     "), where it cannot be used: its UCX state belongs to the parent");
}

void throw_status(const std::string& what, ucs_status_t status) {
  std::string msg = what + ": " + ucs_status_string(status);
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_CANCELED:
    case UCS_ERR_REJECTED:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_NOT_CONNECTED:
    // No usable network device: a host whose link has no carrier (cut) has none, and a pipe
    // connecting then cannot reach its peer any more than over a broken connection.
    case UCS_ERR_NO_DEVICE:
      throw ClosedError(msg);
    case UCS_ERR_MESSAGE_TRUNCATED:
      throw ProtocolError(msg);
    case UCS_ERR_TIMED_OUT:
      throw TimeoutError(msg);
    default:
      throw Error(msg);
  }
}

// ---- Context ---------------------------------------------------------------

bool is_local_address(const std::string& ip) {
  in_addr v4{};
  in6_addr v6{};
  const bool is4 = ::inet_pton(AF_INET, ip.c_str(), &v4) == 1;
  const bool is6 = !is4 && ::inet_pton(AF_INET6, ip.c_str(), &v6) == 1;
  if (!is4 && !is6) return false;
  if (is4 && (ntohl(v4.s_addr) >> 24) == 127) return true;
  if (is6 && IN6_IS_ADDR_LOOPBACK(&v6)) return true;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return false;
  bool found = false;
  for (ifaddrs* a = list; a && !found; a = a->ifa_next) {
    if (!a->ifa_addr) continue;
    if (is4 && a->ifa_addr->sa_family == AF_INET)
      found = reinterpret_cast<sockaddr_in*>(a->ifa_addr)->sin_addr.s_addr == v4.s_addr;
    else if (is6 && a->ifa_addr->sa_family == AF_INET6)
      found = std::memcmp(&reinterpret_cast<sockaddr_in6*>(a->ifa_addr)->sin6_addr, &v6,
                          sizeof v6) == 0;
  }
  ::freeifaddrs(list);
  return found;
}

namespace {
// Whether UCX_TLS lets UCX use at least one of the transports `each` (unset: all of them;
// "^a,b": all but those), which `groups` (aliases) each name as a whole.
bool tls_enables(std::initializer_list<std::string_view> groups,
                 std::initializer_list<std::string_view> each) {
  const char* env = std::getenv("UCX_TLS");
  if (env == nullptr || *env == '\0') return true;
  std::string tls = env;
  const bool exclude = tls[0] == '^';
  auto in = [](std::initializer_list<std::string_view> l, const std::string& t) {
    return std::find(l.begin(), l.end(), t) != l.end();
  };
  bool whole = false;
  size_t singles = 0;
  std::stringstream ss(exclude ? tls.substr(1) : tls);
  for (std::string t; std::getline(ss, t, ',');) {
    if (t == "all" || in(groups, t)) whole = true;
    if (in(each, t)) ++singles;
  }
  // "^posix" leaves sysv: shared memory stays on unless every one of them is left out.
  if (exclude) return !whole && singles < each.size();
  return whole || singles > 0;
}

// Whether UCX_TLS lets UCX use TCP (connections by address start over it).
bool tcp_enabled() {
  return tls_enables({}, {"tcp"});
}
}  // namespace

bool shared_memory_enabled() {
  return tls_enables({"sm", "shm", "mm"}, {"posix", "sysv", "xpmem"});
}

namespace {

ucs_log_func_rc_t drop_log(const char*, unsigned, const char*, ucs_log_level_t level,
                           const ucs_log_component_config_t*, const char*, va_list) {
  return level <= UCS_LOG_LEVEL_FATAL ? UCS_LOG_FUNC_RC_CONTINUE : UCS_LOG_FUNC_RC_STOP;
}

// Once per process (a forked child inherits the parent's settings). A flag, not
// std::call_once: a fork() while another thread is inside call_once leaves the child
// waiting for ever on the copied once_flag. A caller racing the first one may go on before
// the logs are quiet: harmless.
void quiet_ucx() {
  static std::atomic<bool> done{false};
  if (done.exchange(true)) return;
  if (std::getenv("UCX_LOG_LEVEL") == nullptr) ucs_log_push_handler(&drop_log);
  if (std::getenv("UCX_ERROR_SIGNALS") == nullptr)
    for (unsigned i = 0; i < ucs_global_opts.error_signals.count; ++i)
      ucs_debug_disable_signal(ucs_global_opts.error_signals.signals[i]);
}

// At load too, not only when the first context is made: libucs installs its crash handlers
// when it is loaded (before this library: it depends on it), so a program that links
// tensorwire and never opens a pipe had UCX's backtrace instead of its own (or ASan's)
// report of a crash.
[[maybe_unused]] const bool g_quiet_at_load = (quiet_ucx(), true);

// Guards the process's context. Held across fork(): a child forked while another thread
// made the context (ucp_init takes milliseconds) would otherwise inherit it locked and wait
// for ever in its first Context::get. Made, and its atfork handlers registered, when the
// library is loaded, not at first use: a fork() while another thread ran a function-local
// static's first initialization leaves the child waiting for ever on the copied guard
// (seen: 1 child in about 1,000, in __cxa_guard_acquire). Never destroyed: atfork handlers
// outlive static destructors.
std::mutex& g_context_mutex = *new std::mutex;
// The process's context while one is alive, under g_context_mutex; made at load like it.
std::weak_ptr<Context>& g_context = *new std::weak_ptr<Context>;

}  // namespace

// libucm's lock around its memory events (a read-write lock: read in every mmap() and
// munmap() under its hooks, written while a handler is added or removed, by ucp_init and
// ucp_cleanup). Exported by UCX 1.13, declared in no installed header; weak, so that a UCX
// that keeps them private still loads (a fork then relies on the child's events being off,
// Context()).
extern "C" {
void ucm_event_enter() __attribute__((weak));
void ucm_event_leave() __attribute__((weak));
}

namespace {

// Taken around fork(), in this order: the context mutex (ucp_init, under it, writes libucm's
// lock), then libucm's lock for reading (the default rwlock prefers readers: never waits for
// a thread that is itself only reading). So fork() waits for a thread that is adding or
// removing a memory-event handler (another thread's ucp_cleanup as its last pipe closes),
// instead of copying that lock held for writing into the child, where every mmap() under the
// hooks (a large malloc) would wait for ever.
bool ucm_lock_reachable() {
  return ucm_event_enter != nullptr && ucm_event_leave != nullptr;
}
void take_ucx_locks() {
  g_context_mutex.lock();
  if (ucm_lock_reachable()) ucm_event_enter();
}
void release_ucx_locks() {
  if (ucm_lock_reachable()) ucm_event_leave();
  g_context_mutex.unlock();
}
const bool g_ucx_locks_held_across_fork = [] {
  ::pthread_atfork(take_ucx_locks, release_ucx_locks, release_ucx_locks);
  return true;
}();

}  // namespace

std::shared_ptr<Context> Context::get() {
  quiet_ucx();
  std::lock_guard<std::mutex> lock(g_context_mutex);
  auto c = g_context.lock();
  if (c && inherited(c->generation_)) {
    // fork() while the parent's context was alive. UCX 1.13 keeps one async thread per
    // process (it drives connection set-up) and does not reset it in a forked child: a
    // context made here would hand its sockets to the parent's thread, which does not exist
    // in this process, and connecting would hang. With no context alive at the fork, the
    // child starts UCX afresh.
    throw Error("UCX cannot start in this process (pid " + std::to_string(::getpid()) +
                "): it was forked while its parent used UCX (a TensorDictPipe, PipeListener, "
                "TensorDictServer, RemoteTransport or remote inference client was open), and "
                "UCX's state does not survive fork(). Start child "
                "processes with the 'spawn' or 'forkserver' method, or fork before opening pipes");
  }
  if (!c) {
    c = std::shared_ptr<Context>(new Context());
    g_context = c;
  }
  return c;
}

Context::Context() : generation_(os::fork_generation()) {
  if (os::forked()) {
    // A forked child. UCX's memory-event hooks (libucm) may be patched into this process
    // with their lock as fork() copied it: held by a thread of the parent that was in an
    // mmap() or munmap() under the hooks, or installing them, at that moment, a holder that
    // does not exist here. ucp_init registers a handler, which takes that lock exclusively
    // and would wait for ever (a child forked while another thread started or closed a
    // listener hung in ucp_init in 6% of forks). Without memory events UCX caches no memory
    // registrations: the same transfers, each registering its memory where the transport
    // needs it (RDMA), nothing to wait for.
    ucm_global_opts.enable_events = 0;
  }
  // A listener restarted on its port (a server that died and comes back at the address its
  // clients know) must not wait for the old connections' TIME_WAIT to end; a port another
  // socket listens on stays taken (Linux's SO_REUSEADDR). The connection manager reads this
  // from the environment only (ucp_config_modify does not reach it); the user's own wins.
  ::setenv("UCX_TCP_CM_REUSEADDR", "y", /*overwrite=*/0);
  ucp_config_t* config = nullptr;
  ucs_status_t st = ucp_config_read(nullptr, nullptr, &config);
  if (st != UCS_OK) throw_status("ucp_config_read", st);
  // tensorwire's defaults, each set only where the user's environment leaves it open.
  auto modify = [&](const char* name, const std::string& value) {
    if (const ucs_status_t s = ucp_config_modify(config, name, value.c_str()); s != UCS_OK) {
      ucp_config_release(config);
      throw_status("ucp_config_modify(" + std::string(name) + ")", s);
    }
  };
  // UCX 1.13 leaves shared memory out of endpoints that detect peer failure (every pipe
  // endpoint does) unless MM_ERROR_HANDLING is on: without it two processes on one host talk
  // over TCP loopback (6x the latency). The user's own UCX_MM_ERROR_HANDLING wins.
  if (std::getenv("UCX_MM_ERROR_HANDLING") == nullptr && shared_memory_enabled())
    modify("MM_ERROR_HANDLING", "y");
  // UCX's posix shared-memory transport makes a 4 MiB file in /dev/shm per worker (each
  // pipe end, each listener), which its sysv sibling, chosen for the data, makes
  // unnecessary: with Docker's default 64 MiB /dev/shm a TensorDictServer refused its fifth
  // local client ("No resources are available"). Left out unless UCX_TLS names transports.
  if (const char* tls = std::getenv("UCX_TLS"); tls == nullptr || *tls == '\0')
    modify("TLS", "^posix");
  if (std::getenv("UCX_RNDV_THRESH") == nullptr) modify("RNDV_THRESH", std::to_string(kEagerMax));
  // UCX 1.22 frees a TCP lane whose blocking connect's peer went away mid-wire-up (a
  // listener's SIGSEGV when a client is killed then; docs/reliability.md, "Closed for
  // clients that die too"). Non-blocking connects hand every such failure to the endpoint's
  // error handler. The user's UCX_TCP_CONN_NB wins (=n reopens it).
  if (std::getenv("UCX_TCP_CONN_NB") == nullptr && tcp_enabled()) modify("TCP_CONN_NB", "y");
  // The rendezvous scheme stays UCX's (between processes of a host: fragments through the
  // shared-memory FIFO). RNDV_SCHEME=put_zcopy moved 1 MiB 1.1-1.9x faster here, but it
  // gives every local endpoint TCP lanes to write over, and with them a peer's close that
  // comes with its exit reads as a broken connection (the lane's reset comes first)
  // (docs/benchmarks.md, 2026-12-07).
  ucp_params_t params{};
  params.field_mask = UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED;
  params.features = UCP_FEATURE_TAG | UCP_FEATURE_WAKEUP;
  params.mt_workers_shared = 1;  // workers of different pipes live on different threads
  st = ucp_init(&params, config, &ctx_);
  ucp_config_release(config);
  if (st != UCS_OK) {
    // Most often a UCX_TLS that names no transport this host has: a setting to fix, not a
    // connection that went away.
    const char* tls = std::getenv("UCX_TLS");
    if (tls != nullptr && *tls != '\0')
      throw Error(std::string("UCX cannot start with UCX_TLS=") + tls + ": " +
                  ucs_status_string(st) +
                  " (it names no transport UCX has here; tcp, sm or tcp,sm work everywhere)");
    throw_status("ucp_init", st);
  }
}

Context::~Context() {
  if (ctx_ && !inherited(generation_)) ucp_cleanup(ctx_);
}

// ---- Worker ----------------------------------------------------------------

namespace {

// Workers alive in this process, and the fork generation they were counted in (a forked
// child starts with none of its own). Atomics, not a mutex: one held at a fork would stay
// locked in the child.
std::atomic<size_t> g_live_workers{0};
std::atomic<uint64_t> g_live_generation{0};

size_t live_workers() noexcept {
  return g_live_generation.load() == os::fork_generation() ? g_live_workers.load() : 0;
}

void count_worker(int change) noexcept {
  const uint64_t now = os::fork_generation();
  if (g_live_generation.exchange(now) != now) g_live_workers.store(0);
  g_live_workers.fetch_add(static_cast<size_t>(change));
}

// UCX's progress thread runs while a worker is alive, one per process: the first worker
// starts it, and UCX aborts the process when it cannot ("Assertion
// `ucs_async_thread_global_context.thread != NULL' failed": a thread or process limit). A
// check for room then, not for every worker (counting a user's threads can take tens of
// milliseconds on a busy machine).
void require_room_for_the_progress_thread() {
  if (live_workers() == 0) os::require_free_tasks(2, "the first UCX worker (its progress thread)");
}

}  // namespace

// UCX aborts the process when it runs out of descriptors while it makes its context or a
// worker (an assertion in its async thread, or "failed to set active message handler"): a
// worker and its first connection take about 45. Checked before the context is made.
Worker::Worker()
    : context_((os::require_free_fds(
                    48, "a UCX worker (one per pipe end, listener and remote connection)"),
                require_room_for_the_progress_thread(), Context::get())),
      generation_(os::fork_generation()) {
  ucp_worker_params_t params{};
  params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
  // SERIALIZED, not SINGLE: a worker is used by more than one thread, one at a time under
  // its owner's mutex (a pipe's callers; a remote connection's thread and the serving thread
  // that answers on it). SINGLE lets a transport assume one thread (mlx5 posts to its
  // BlueFlame register without the ordering several threads need).
  params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
  ucs_status_t st = ucp_worker_create(context_->handle(), &params, &worker_);
  if (st != UCS_OK) throw_status("ucp_worker_create", st);
  st = ucp_worker_get_efd(worker_, &efd_);
  if (st != UCS_OK) {
    ucp_worker_destroy(worker_);
    throw_status("ucp_worker_get_efd", st);
  }
  count_worker(+1);
}

Worker::~Worker() {
  if (inherited(generation_)) {
    new std::shared_ptr<Context>(std::move(context_));  // the parent's: never cleaned up here
    return;
  }
  if (worker_) {
    ucp_worker_destroy(worker_);
    count_worker(-1);
  }
}

bool Worker::arm() {
  ucs_status_t st = ucp_worker_arm(worker_);
  if (st == UCS_ERR_BUSY) return false;
  if (st != UCS_OK) throw_status("ucp_worker_arm", st);
  return true;
}

void Worker::signal() {
  ucs_status_t st = ucp_worker_signal(worker_);
  if (st != UCS_OK) throw_status("ucp_worker_signal", st);
}

void Worker::wait(std::chrono::milliseconds timeout) {
  if (ready_to_sleep()) sleep(timeout);
}

bool Worker::ready_to_sleep() {
  return progress() == 0 && arm();
}

void Worker::sleep(std::chrono::milliseconds timeout) const noexcept {
  struct pollfd p {
    efd_, POLLIN, 0
  };
  ::poll(&p, 1, static_cast<int>(timeout.count()));
}

std::vector<std::byte> Worker::address() const {
  ucp_address_t* addr = nullptr;
  size_t len = 0;
  ucs_status_t st = ucp_worker_get_address(worker_, &addr, &len);
  if (st != UCS_OK) throw_status("ucp_worker_get_address", st);
  const auto* p = reinterpret_cast<const std::byte*>(addr);
  std::vector<std::byte> out(p, p + len);
  ucp_worker_release_address(worker_, addr);
  return out;
}

// ---- Request ---------------------------------------------------------------

Request::Request(ucs_status_ptr_t p, bool is_recv)
    : generation_(os::fork_generation()), is_recv_(is_recv) {
  if (UCS_PTR_IS_ERR(p)) throw_status(is_recv ? "receive" : "send", UCS_PTR_STATUS(p));
  if (p != nullptr) {
    req_ = p;
    done_ = false;
  }
}

Request::Request(Request&& o) noexcept
    : req_(std::exchange(o.req_, nullptr)),
      generation_(o.generation_),
      is_recv_(o.is_recv_),
      done_(std::exchange(o.done_, true)) {}

Request& Request::operator=(Request&& o) noexcept {
  if (this != &o) {
    if (req_ && !inherited(generation_)) ucp_request_free(req_);
    req_ = std::exchange(o.req_, nullptr);
    generation_ = o.generation_;
    is_recv_ = o.is_recv_;
    done_ = std::exchange(o.done_, true);
  }
  return *this;
}

Request::~Request() {
  // A request still in flight is released to UCX, which completes (or cancels) it.
  if (req_ && !inherited(generation_)) ucp_request_free(req_);
}

bool Request::done() {
  if (done_) return true;
  ucs_status_t st = ucp_request_check_status(req_);
  if (st == UCS_INPROGRESS) return false;
  ucp_request_free(req_);
  req_ = nullptr;
  done_ = true;
  if (st != UCS_OK) throw_status(is_recv_ ? "receive" : "send", st);
  return true;
}

void Request::cancel(ucp_worker_h worker) noexcept {
  if (req_ && !done_) ucp_request_cancel(worker, req_);
}

// ---- Listener --------------------------------------------------------------

namespace {
PeerAddress address_of(const sockaddr_storage& ss) {
  auto [host, port] = os::ip_port_of(ss);
  if (host.empty()) host = "?";
  return {host, port};
}
}  // namespace

Listener::Listener(uint16_t port, const std::string& host, std::chrono::milliseconds silent_for)
    : generation_(os::fork_generation()),
      silent_for_(silent_for),
      next_look_(Deadline::after(silent_for)) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = INADDR_ANY;
  addr.sin_port = htons(port);
  if (!host.empty() && host != "0.0.0.0") {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int rc = ::getaddrinfo(host.c_str(), nullptr, &hints, &res);
    if (rc != 0) throw ValueError("cannot resolve host '" + host + "': " + gai_strerror(rc));
    addr.sin_addr = reinterpret_cast<const sockaddr_in*>(res->ai_addr)->sin_addr;
    ::freeaddrinfo(res);
  }
  ucp_listener_params_t params{};
  params.field_mask = UCP_LISTENER_PARAM_FIELD_SOCK_ADDR | UCP_LISTENER_PARAM_FIELD_CONN_HANDLER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&addr);
  params.sockaddr.addrlen = sizeof addr;
  params.conn_handler.cb = &Listener::on_conn;
  params.conn_handler.arg = this;
  ucs_status_t st = ucp_listener_create(worker_.handle(), &params, &listener_);
  // UCX 1.13 reports a taken port as "Device is busy".
  const std::string where =
      "listen on " + (host.empty() ? "0.0.0.0" : host) + ":" + std::to_string(port);
  if (st == UCS_ERR_BUSY) throw SystemError(where, EADDRINUSE);
  if (st != UCS_OK) {
    // UCX says only "Input/output error" for an address that is not this host's: a plain
    // socket bound to the same address tells the real cause (EADDRNOTAVAIL, EACCES).
    const int probe = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in any_port = addr;
    any_port.sin_port = 0;
    const int bound =
        probe < 0 ? 0
                  : ::bind(probe, reinterpret_cast<const sockaddr*>(&any_port), sizeof any_port);
    const int err = errno;
    if (probe >= 0) ::close(probe);
    if (bound != 0) throw SystemError(where, err);
    throw_status(where, st);
  }
  ucp_listener_attr_t attr{};
  attr.field_mask = UCP_LISTENER_ATTR_FIELD_SOCKADDR;
  st = ucp_listener_query(listener_, &attr);
  if (st != UCS_OK) {
    ucp_listener_destroy(listener_);
    throw_status("ucp_listener_query", st);
  }
  port_ = ntohs(reinterpret_cast<const sockaddr_in*>(&attr.sockaddr)->sin_port);
  char ip[INET_ADDRSTRLEN] = {};
  ::inet_ntop(AF_INET, &addr.sin_addr, ip, sizeof ip);
  ip_ = ip;
  mark_ = os::ListenerMark::tcp(ip_, port_);
  guard();
}

// Before anyone learns the port: bytes UCX would abort on never reach it. Connections a
// fixed port completed already (since ucp_listener_create, a few microseconds) are
// guarded too, from their next segment. No TCP socket listens there when UCX uses another
// connection manager (rdmacm): nothing to guard then.
void Listener::guard() {
  if (!guard_enabled()) return;
  const uint32_t max = sockcm_max_private_data();
  int failed = 0;  // the errno of a socket left unguarded
  auto guard_one = [&](int fd) {
    if (!guard_sockcm_socket(fd, max)) failed = errno;
  };
  for (int fd : os::listening_sockets(ip_, port_)) guard_one(fd);
  os::for_each_accepted(ip_, port_, guard_one);
  if (failed != 0)
    log_message(LogLevel::Warning,
                "could not guard the UCX listener on " + ip_ + ":" + std::to_string(port_) +
                    " against malformed connections (SO_ATTACH_FILTER: " + std::strerror(failed) +
                    "): a peer that sends bytes which are not a UCX connection request may "
                    "abort this process (docs/reliability.md; TENSORWIRE_UCX_LISTENER_GUARD=0 "
                    "leaves the guard, and this warning, out)");
}

Listener::~Listener() {
  if (inherited(generation_) || !listener_) return;
  refuse_unanswered();
  reject_pending();
  ucp_listener_destroy(listener_);
}

void Listener::reject(ConnRequest& request) noexcept {
  if (request.handle && !inherited(generation_)) ucp_listener_reject(listener_, request.handle);
  request.handle = nullptr;
}

void Listener::reject_pending() noexcept {
  for (auto& r : pending_) ucp_listener_reject(listener_, r.handle);
  pending_.clear();
}

// UCX (1.13 to at least 1.19: openucx/ucx#11087) keeps each connection its TCP listener
// accepted in a list of the worker's, pointing at the listener, until the client's request
// has arrived whole; ucp_listener_destroy() frees the listener and leaves them there. A
// request that arrives after that, before the worker goes, makes UCX's thread call into the
// freed listener: a crash, seen when a server closed just as a client connected. So before
// the listener goes, and within kRefuseFor:
// 1. the kernel completes no new connection on its socket, and UCX's thread accepts the
//    ones it completed before. Nothing is refused meanwhile: a refusal (ucp_listener_reject)
//    while UCX still accepts can leave an event of the refused connection's fd queued in
//    UCX, which it then hands to the next connection accepted on the same fd number (an
//    assertion that aborts the process);
// 2. every accepted connection not yet answered is shut down (its client is refused, as it
//    would be now anyway), and UCX's thread drops each at its end of file, or hands its
//    request over if it had arrived whole (refused here). Until two looks a few
//    milliseconds apart find none: an accept half done in the kernel at the first (the
//    connection out of the queue, its fd not yet there) shows at the second.
// Requests handed over and still in UCX's queue are refused by ucp_listener_destroy().
void Listener::refuse_unanswered() noexcept {
  constexpr auto kRefuseFor = std::chrono::seconds(2);
  constexpr auto kLookAgainAfter = std::chrono::milliseconds(2);
  try {
    const Deadline until = Deadline::after(kRefuseFor);
    const std::vector<int> listening = os::listening_sockets(ip_, port_);
    for (int fd : listening) os::drop_new_connections(fd);
    for (bool queued = true; queued && !until.passed();) {
      queued = false;
      for (int fd : listening) {
        pollfd p{fd, POLLIN, 0};
        queued = ::poll(&p, 1, 0) > 0 || queued;
      }
      if (queued) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    for (int empty_looks = 0;;) {
      empty_looks = os::shut_down_unanswered(ip_, port_) == 0 ? empty_looks + 1 : 0;
      if (empty_looks == 2) return;
      if (until.passed()) {
        log_message(LogLevel::Warning,
                    "the listener on port " + std::to_string(port_) +
                        " closes with a connection UCX has not let go of after " +
                        std::to_string(kRefuseFor.count()) + " s");
        return;
      }
      if (empty_looks == 1) std::this_thread::sleep_for(kLookAgainAfter);
      worker_.wait(std::chrono::milliseconds(1));
      reject_pending();  // requests that arrived whole meanwhile
    }
  } catch (const std::exception&) {
    // Out of memory or a worker error while closing: the listener goes as it did before.
  }
}

void Listener::on_conn(ucp_conn_request_h req, void* arg) {
  auto* self = static_cast<Listener*>(arg);
  ConnRequest r{req, {}};
  ucp_conn_request_attr_t attr{};
  attr.field_mask = UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR;
  if (ucp_conn_request_query(req, &attr) == UCS_OK) r.address = address_of(attr.client_address);
  self->pending_.push_back(r);
}

std::optional<ConnRequest> Listener::poll(std::vector<std::string>* warnings) {
  // A look at every fd of the process: seldom (a fraction of a millisecond per hundred fds).
  if (next_look_.passed()) {
    if (const std::vector<std::string> peers = os::shut_down_silent(ip_, port_, silent_for_);
        !peers.empty()) {
      // Junk the guard dropped (a scanner, a client of another protocol), or a UCX peer
      // whose request never arrived whole: said, so that the second can be told.
      std::string w = "the listener on port " + std::to_string(port_) + " shut down " +
                      std::to_string(peers.size()) + " connection(s) that sent nothing it " +
                      "could read for " + std::to_string(silent_for_.count()) + " ms (from " +
                      peers.front() + (peers.size() > 1 ? " and others" : "") +
                      "): not UCX connection requests (docs/reliability.md)";
      if (warnings)
        warnings->push_back(std::move(w));
      else
        log_message(LogLevel::Warning, w);
    }
    next_look_ = Deadline::after(
        std::min<std::chrono::milliseconds>(silent_for_ / 2, std::chrono::seconds(5)));
  }
  worker_.progress();
  if (pending_.empty()) return std::nullopt;
  ConnRequest r = pending_.front();
  pending_.pop_front();
  return r;
}

// ---- Endpoint --------------------------------------------------------------

void Endpoint::on_error(void* arg, ucp_ep_h, ucs_status_t status) {
  auto* self = static_cast<Endpoint*>(arg);
  if (self->error_ == UCS_OK) self->error_ = status;
}

// UCX reports a client's refused socket (nothing listens at the address) as "not
// connected" (UCX 1.13), or as "connection reset" or "unreachable" (UCX 1.22, by the state
// its connection manager had reached), or, where the refused connect was a TCP data lane's
// and connects are non-blocking (Context), as "endpoint timeout"; and so too a connection
// the server's side took and closed before answering (its handshake timed out, it closed;
// or what listens is not a tensorwire server): a probe of the address tells them apart.
// Any other failure before the wire-up completed means the connection ended early too, or
// the host could not be reached. A refusal's hint ("is a ... listening there?") would
// misdescribe all of those.
void Endpoint::throw_if_unreached(const std::string& what, const std::string& host, uint16_t port,
                                  const std::string& listener) const {
  if (error_ == UCS_OK) return;
  if (error_ == UCS_ERR_REJECTED)  // the server could not make its end (Listener::reject)
    throw ClosedError(what + ": " + listener + " at " + host + ":" + std::to_string(port) +
                      " refused the connection: it could not take another client (its log "
                      "says why: too few file descriptors, threads or memory)");
  if ((error_ == UCS_ERR_NOT_CONNECTED || error_ == UCS_ERR_CONNECTION_RESET ||
       error_ == UCS_ERR_UNREACHABLE || error_ == UCS_ERR_ENDPOINT_TIMEOUT) &&
      os::probe_tcp(peer_address_.host, peer_address_.port, std::chrono::milliseconds(500)) ==
          os::TcpProbe::Refused)
    throw ConnectionRefused(host, port, listener);
  // Connections by address start over TCP: a UCX_TLS without it cannot make one.
  std::string setting = tcp_enabled() ? ""
                                      : " (and UCX_TLS=" + std::string(std::getenv("UCX_TLS")) +
                                            " has no tcp, which connecting by address needs)";
  // Two processes of different users on one host: UCX picks its shared-memory transports,
  // which the kernel refuses between users (segments, cross-memory attach), and the wire-up
  // fails with this, whatever the server is.
  if (error_ == UCS_ERR_SHMEM_SEGMENT)
    setting +=
        " (if the server runs as another user on this host: UCX's shared memory does not "
        "work between users; run both as one user, or set UCX_TLS=tcp on both sides)";
  throw ClosedError(what + ": the connection to " + host + ":" + std::to_string(port) +
                    " ended before the server took it up (" + ucs_status_string(error_) +
                    "): the server ended its handshake (its timeout, a close), what listens "
                    "there is not " +
                    listener + ", or the host is unreachable" + setting);
}

Endpoint::Endpoint(Worker& worker, const std::string& host, uint16_t port)
    : worker_(worker), generation_(os::fork_generation()) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
  if (rc != 0) throw ValueError("cannot resolve host '" + host + "': " + gai_strerror(rc));
  sockaddr_storage ss{};
  std::memcpy(&ss, res->ai_addr, res->ai_addrlen);
  socklen_t len = res->ai_addrlen;
  ::freeaddrinfo(res);
  peer_address_ = address_of(ss);
  peer_ = peer_address_.str();
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_FLAGS | UCP_EP_PARAM_FIELD_SOCK_ADDR |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.flags = UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
  params.sockaddr.addr = reinterpret_cast<const sockaddr*>(&ss);
  params.sockaddr.addrlen = len;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Endpoint::on_error;
  params.err_handler.arg = this;
  ucs_status_t st = ucp_ep_create(worker_.handle(), &params, &ep_);
  if (st != UCS_OK) throw_status("connect to " + peer_, st);
}

Endpoint::Endpoint(Worker& worker, ConnRequest& request)
    : worker_(worker),
      generation_(os::fork_generation()),
      peer_address_(request.address),
      peer_(request.address.str()) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_CONN_REQUEST | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.conn_request = request.handle;
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Endpoint::on_error;
  params.err_handler.arg = this;
  request.handle = nullptr;  // consumed, whatever happens
  ucs_status_t st = ucp_ep_create(worker_.handle(), &params, &ep_);
  if (st != UCS_OK) throw_status("accept from " + peer_, st);
}

Endpoint::Endpoint(Worker& worker, std::span<const std::byte> address, const Endpoint& same_peer)
    : worker_(worker),
      generation_(os::fork_generation()),
      peer_address_(same_peer.peer_address_),
      peer_(same_peer.peer_) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLER |
                      UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  params.err_handler.cb = &Endpoint::on_error;
  params.err_handler.arg = this;
  ucs_status_t st = ucp_ep_create(worker_.handle(), &params, &ep_);
  if (st != UCS_OK) throw_status("connect to the worker address of " + peer_, st);
}

Endpoint::~Endpoint() {
  if (inherited(generation_)) return;
  close(true, std::chrono::milliseconds(1000));
}

namespace {

// Every buffer tensorwire hands UCX is host memory (a TensorDict's leaves are on the CPU,
// checked where they are made). Said on every send and receive, so UCX never asks what
// memory a buffer is in: it asks its memory-type cache, which needs the memory events
// that tensorwire turns off (docs/pipe.md, "Process start"), and without it a UCX that has
// its CUDA modules loaded asks the CUDA driver on every call.
ucp_request_param_t host_param() {
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_MEMORY_TYPE;
  param.memory_type = UCS_MEMORY_TYPE_HOST;
  return param;
}

ucs_status_ptr_t tag_send(ucp_ep_h ep, const void* buffer, size_t count, uint64_t tag,
                          const ucp_request_param_t& param, Endpoint::Done done) {
  return done == Endpoint::Done::Matched ? ucp_tag_send_sync_nbx(ep, buffer, count, tag, &param)
                                         : ucp_tag_send_nbx(ep, buffer, count, tag, &param);
}

}  // namespace

Request Endpoint::send(uint64_t tag, std::span<const std::span<const std::byte>> pieces,
                       std::vector<ucp_dt_iov_t>& iov, Done done) {
  iov.clear();
  for (auto p : pieces)
    if (!p.empty()) iov.push_back({const_cast<std::byte*>(p.data()), p.size()});
  ucp_request_param_t param = host_param();
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_iov();
  return Request(tag_send(ep_, iov.data(), iov.size(), tag, param, done), false);
}

Request Endpoint::send(uint64_t tag, std::span<const std::byte> bytes, Done done) {
  return Request(tag_send(ep_, bytes.data(), bytes.size(), tag, host_param(), done), false);
}

std::optional<std::pair<size_t, ucp_tag_message_h>> Endpoint::probe(uint64_t tag) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker_.handle(), tag, ~uint64_t{0}, 1, &info);
  if (!msg) return std::nullopt;
  return std::make_pair(info.length, msg);
}

std::optional<Endpoint::Probed> Endpoint::probe(uint64_t tag, uint64_t mask) {
  ucp_tag_recv_info_t info{};
  ucp_tag_message_h msg = ucp_tag_probe_nb(worker_.handle(), tag, mask, 1, &info);
  if (!msg) return std::nullopt;
  return Probed{info.length, msg, info.sender_tag};
}

std::optional<uint64_t> Worker::oldest_unexpected_tag() {
  ucp_tag_recv_info_t info{};
  // A mask of 0 matches any tag: UCX then walks its list of every unexpected message from
  // the oldest, and the first one matches.
  if (!ucp_tag_probe_nb(worker_, 0, 0, /*remove=*/0, &info)) return std::nullopt;
  return info.sender_tag;
}

bool Endpoint::has_message(uint64_t tag, uint64_t mask) {
  ucp_tag_recv_info_t info{};
  return ucp_tag_probe_nb(worker_.handle(), tag, mask, 0, &info) != nullptr;
}

namespace {
// Completion of a receive that did not finish at once: record the length where asked.
void on_recv(void*, ucs_status_t status, const ucp_tag_recv_info_t* info, void* user_data) {
  if (status == UCS_OK) *static_cast<size_t*>(user_data) = info->length;
}

// UCX 1.13 fills recv_info on immediate completion only when no callback is set, and
// ucp_tag_recv_request_test() reports length 0 for some completed requests; so every
// receive completes through the callback (no immediate completion), which always has it.
ucp_request_param_t recv_param(size_t* length) {
  ucp_request_param_t param = host_param();
  param.op_attr_mask |=
      UCP_OP_ATTR_FIELD_CALLBACK | UCP_OP_ATTR_FIELD_USER_DATA | UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
  param.cb.recv = &on_recv;
  param.user_data = length;
  return param;
}
}  // namespace

Request Endpoint::recv(ucp_tag_message_h msg, std::span<std::byte> into, size_t* length) {
  ucp_request_param_t param = recv_param(length);
  *length = 0;
  return Request(ucp_tag_msg_recv_nbx(worker_.handle(), into.data(), into.size(), msg, &param),
                 true);
}

Request Endpoint::recv(uint64_t tag, std::span<std::byte> into, size_t* length) {
  ucp_request_param_t param = recv_param(length);
  *length = 0;
  return Request(
      ucp_tag_recv_nbx(worker_.handle(), into.data(), into.size(), tag, ~uint64_t{0}, &param),
      true);
}

namespace {

// A scattered receive: the non-empty pieces as UCX's iov (kept by the caller until the
// request completes) and the parameters that say so.
ucp_request_param_t iov_recv_param(std::span<const std::span<std::byte>> pieces,
                                   std::vector<ucp_dt_iov_t>& iov, size_t* length) {
  iov.clear();
  for (auto p : pieces)
    if (!p.empty()) iov.push_back({p.data(), p.size()});
  ucp_request_param_t param = recv_param(length);
  param.op_attr_mask |= UCP_OP_ATTR_FIELD_DATATYPE;
  param.datatype = ucp_dt_make_iov();
  *length = 0;
  return param;
}

}  // namespace

Request Endpoint::recv(ucp_tag_message_h msg, std::span<const std::span<std::byte>> pieces,
                       std::vector<ucp_dt_iov_t>& iov, size_t* length) {
  ucp_request_param_t param = iov_recv_param(pieces, iov, length);
  return Request(ucp_tag_msg_recv_nbx(worker_.handle(), iov.data(), iov.size(), msg, &param), true);
}

Request Endpoint::recv(uint64_t tag, std::span<const std::span<std::byte>> pieces,
                       std::vector<ucp_dt_iov_t>& iov, size_t* length) {
  ucp_request_param_t param = iov_recv_param(pieces, iov, length);
  return Request(
      ucp_tag_recv_nbx(worker_.handle(), iov.data(), iov.size(), tag, ~uint64_t{0}, &param), true);
}

void Endpoint::discard_unexpected() {
  std::vector<std::byte> scratch;
  for (int i = 0; i < 1024; ++i) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h msg = ucp_tag_probe_nb(worker_.handle(), 0, 0, 1, &info);
    if (!msg) return;
    scratch.resize(info.length);
    size_t got = 0;
    ucp_request_param_t param = recv_param(&got);
    ucs_status_ptr_t p =
        ucp_tag_msg_recv_nbx(worker_.handle(), scratch.data(), scratch.size(), msg, &param);
    if (UCS_PTR_IS_ERR(p)) return;
    if (p) {
      auto until = Clock::now() + std::chrono::milliseconds(100);
      while (ucp_request_check_status(p) == UCS_INPROGRESS && Clock::now() < until)
        worker_.progress();
      if (ucp_request_check_status(p) == UCS_INPROGRESS) ucp_request_cancel(worker_.handle(), p);
      ucp_request_free(p);
    }
  }
}

std::string Endpoint::transports() const {
  if (!ep_) return "";
  char* buf = nullptr;
  size_t len = 0;
  FILE* f = ::open_memstream(&buf, &len);
  if (!f) return "";
  ucp_ep_print_info(ep_, f);
  std::fclose(f);
  std::string info(buf, len);
  std::free(buf);
  // Lane lines look like "#   lane[1]:  2:sysv/memory.0 md[1] ... am am_bw#0 keepalive";
  // keep each distinct "name/device", in lane order, minus the ".N" suffix.
  std::string out;
  std::istringstream lines(info);
  for (std::string line; std::getline(lines, line);) {
    auto lane = line.find("lane[");
    if (lane == std::string::npos) continue;
    auto colon = line.find(':', line.find(']', lane));
    if (colon == std::string::npos) continue;
    std::istringstream words(line.substr(colon + 1));
    std::string word;
    while (words >> word)
      if (auto c = word.find(':'); c != std::string::npos && word.find('/') != std::string::npos) {
        std::string tl = word.substr(c + 1);
        tl = tl.substr(0, tl.rfind('.'));
        if ((" " + out + " ").find(" " + tl + " ") == std::string::npos)
          out += (out.empty() ? "" : " ") + tl;
        break;
      }
  }
  return out;
}

Request Endpoint::flush() {
  ucp_request_param_t param{};
  return Request(ucp_ep_flush_nbx(ep_, &param), false);
}

void Endpoint::close(bool force, std::chrono::milliseconds timeout, bool drain_failed) {
  if (!ep_) return;
  if (error_ != UCS_OK && drain_failed) {
    // UCX 1.13 aborts ("pending request ... should have been flushed") when a failed
    // endpoint is closed while requests still wait in its wireup queue: let them fail
    // first.
    auto until = Clock::now() + std::chrono::milliseconds(200);
    while (Clock::now() < until)
      if (!worker_.progress()) std::this_thread::yield();
  }
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
  param.flags = (force || error_ != UCS_OK) ? UCP_EP_CLOSE_FLAG_FORCE : 0;
  ucs_status_ptr_t req = ucp_ep_close_nbx(ep_, &param);
  ep_ = nullptr;
  if (req == nullptr || UCS_PTR_IS_ERR(req)) return;
  auto deadline = Clock::now() + timeout;
  while (ucp_request_check_status(req) == UCS_INPROGRESS && Clock::now() < deadline)
    worker_.wait(std::chrono::milliseconds(10));
  if (ucp_request_check_status(req) == UCS_INPROGRESS) {
    // The peer is not answering: give up on a graceful close.
    ucp_request_cancel(worker_.handle(), req);
    worker_.progress();
  }
  ucp_request_free(req);
}

}  // namespace tensorwire::ucx
