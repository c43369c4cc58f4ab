#include "shm_owner.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <optional>

#include "os/fork.h"
#include "os/process.h"
#include "shm_handshake.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::inference::detail {

namespace {

struct Peer {
  uint32_t id = 0;
  os::UnixSocket socket;
  std::optional<os::ProcessWatch> watch;
};

}  // namespace

ShmOwner::ShmOwner(std::shared_ptr<ShmRegion> region, const std::string& name, os::PeerPolicy peers)
    : doorbell_wait(region->max_spin),
      region_(std::move(region)),
      name_(name),
      listener_(name),
      peers_(std::move(peers)),
      fork_generation_(os::fork_generation()) {
  int fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (fd < 0) throw SystemError("eventfd", errno);
  stop_ = os::Fd(fd);
  taken.resize(region_->num_slots);
  order.reserve(region_->num_slots);
  thread_ = std::thread([this] { run(); });
}

std::string ShmOwner::last_refusal() const {
  std::lock_guard<std::mutex> lock(refusal_mu_);
  return last_refusal_;
}

void ShmOwner::refuse(os::UnixSocket& s, const std::string& why, int code) {
  refused_.fetch_add(1, std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(refusal_mu_);
    last_refusal_ = why;
  }
  send_refusal(s, why, code);
}

bool ShmOwner::here() const noexcept {
  return fork_generation_ == os::fork_generation();
}

ShmOwner::~ShmOwner() {
  if (!here()) {
    // A forked copy: the watcher thread is the parent's and does not exist here. Leak
    // the handle (destroying a joinable std::thread would abort); closing our copies of
    // the fds leaves the parent's listener as it is.
    new std::thread(std::move(thread_));
    return;
  }
  uint64_t one = 1;
  [[maybe_unused]] ssize_t n = ::write(stop_.get(), &one, sizeof one);
  if (thread_.joinable()) thread_.join();
}

void ShmOwner::run() noexcept {
  std::vector<Peer> peers;
  std::vector<pollfd> fds;
  while (true) {
    fds.clear();
    fds.push_back({stop_.get(), POLLIN, 0});
    fds.push_back({listener_.poll_fd(), POLLIN, 0});
    for (const Peer& p : peers) {
      fds.push_back({p.socket.fd(), POLLIN, 0});
      fds.push_back({p.watch ? p.watch->fd() : -1, POLLIN, 0});
    }
    int r = ::poll(fds.data(), fds.size(), listener_.poll_timeout_ms());
    if (r < 0) {
      if (errno == EINTR) continue;
      log_message(LogLevel::Error, "shared-memory transport watcher: poll failed (errno " +
                                       std::to_string(errno) +
                                       "); dead clients are no longer noticed");
      return;
    }
    if (fds[0].revents) return;
    // Departures first (fds index into the current peers).
    std::vector<bool> gone(peers.size(), false);
    for (size_t i = 0; i < peers.size(); ++i) {
      const pollfd& s = fds[2 + 2 * i];
      const pollfd& w = fds[3 + 2 * i];
      if (w.revents) gone[i] = true;
      if (s.revents) {
        try {
          // Clients send nothing: readable means EOF (or a misbehaving peer; drop it).
          peers[i].socket.recv(os::Millis{0});
          gone[i] = true;
        } catch (const Error&) {
          gone[i] = true;
        }
      }
    }
    for (size_t i = peers.size(); i-- > 0;) {
      if (!gone[i]) continue;
      region_->reclaim(peers[i].id);
      peers.erase(peers.begin() + static_cast<std::ptrdiff_t>(i));
      attached_.fetch_sub(1, std::memory_order_relaxed);
    }
    if (fds[1].revents) {
      std::optional<os::UnixSocket> s;
      try {
        s = listener_.accept(os::Millis{0});
        // Who it is, before a client id, a byte or a segment fd is handed over.
        if (s) {
          const os::PeerCredentials who = os::peer_credentials(s->fd());
          if (std::string why = peers_.refusal(who, name_); !why.empty()) {
            refuse(*s, why);
            s.reset();
          }
        }
        if (s) {
          Peer p;
          p.watch.emplace(s->peer_pid());  // a descriptor: the first step that may lack one
          p.socket = std::move(*s);
          s.reset();
          p.id = region_->header->next_client_id.fetch_add(1);
          send_welcome(p.socket, *region_, p.id);
          peers.push_back(std::move(p));
          attached_.fetch_add(1, std::memory_order_relaxed);
        }
      } catch (const SystemError& e) {
        auto why =
            os::descriptor_refusal(e, "shared-memory transport '" + name_ + "'", listener_, !!s);
        if (why && s) refuse(*s, *why, e.code());
      } catch (const Error&) {
        // A client that vanished during its handshake: nothing was handed out to it
        // that needs reclaiming (it never owned a slot).
      }
    }
  }
}

}  // namespace tensorwire::inference::detail
