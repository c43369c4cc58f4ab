#include "listener_impl.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "os/fork.h"
#include "pipe_impl.h"
#include "runtime/wait.h"
#include "tensorwire/runtime/log.h"

namespace tensorwire::detail {

ListenerImpl::ListenerImpl(uint16_t port, const PipeOptions& options)
    : options_(checked_options(options)),
      generation_(os::fork_generation()),
      owner_pid_(::getpid()),
      listener_(open(port)),
      port_(listener_->port()) {}

ListenerImpl::~ListenerImpl() {
  close();
}

void ListenerImpl::leave_inherited_handshakes() noexcept {
  if (!running_.empty()) (void)new std::list<Handshake>(std::move(running_));
}

void ListenerImpl::check_not_inherited() const {
  if (ucx::inherited(generation_))
    throw ucx::inherited_error("this listener on port " + std::to_string(port_), owner_pid_);
}

std::shared_ptr<ucx::Listener> ListenerImpl::open(uint16_t port) {
  try {
    return std::make_shared<ucx::Listener>(port);
  } catch (const SystemError& e) {
    if (e.code() == EADDRINUSE) throw PortInUse(port);
    throw;
  }
}

void ListenerImpl::check_usable() const {
  if (!listener_) throw_closed();
}

void ListenerImpl::throw_closed() const {
  throw ClosedError("the listener on port " + std::to_string(port_) + " is closed");
}

std::optional<TensorDictPipe> ListenerImpl::accept(
    Timeout timeout, bool throw_on_refusal,
    const std::function<TensorDictPipe(std::shared_ptr<PipeImpl>)>& wrap) {
  check_not_inherited();
  std::shared_ptr<PipeImpl> accepted;
  runtime::wait_until(Deadline::after(timeout), [&](Deadline slice) {
    std::vector<std::string> warnings;
    std::list<Handshake> over;
    std::exception_ptr refusal;
    std::shared_ptr<ucx::Listener> keep;  // its worker's fd stays open while we sleep on it
    {
      std::lock_guard<std::mutex> lock(mu_);
      check_usable();
      over = finished();
      // A few at a time: each makes a UCX worker (milliseconds), and accept(0) runs on an
      // event loop that has other work; the rest are started by the next call, at once.
      for (size_t n = 0; n < kStartsPerCall && running_.size() < kMaxHandshakes; ++n) {
        std::optional<ucx::ConnRequest> req = listener_->poll(&warnings);
        if (!req) break;
        start_handshake(std::move(*req), warnings);
      }
      // A client that failed or abandoned its handshake is that client's failure, not the
      // listener's: it is counted and accept() goes on (unless told to throw).
      while (!ready_.empty() && !accepted && !refusal) {
        Outcome o = std::move(ready_.front());
        ready_.pop_front();
        if (o.pipe) {
          accepted = std::move(o.pipe);
        } else {
          ++refused_;
          last_refusal_ = std::move(o.refusal);
          if (throw_on_refusal) refusal = o.error;
        }
      }
      if (!accepted && !refusal && !can_start() && !listener_->worker().progress() &&
          listener_->worker().arm())
        keep = listener_;
    }
    over.clear();  // joins their threads (Handshake's destructor), without mu_
    for (const std::string& w : warnings) log_message(LogLevel::Warning, w);
    if (refusal) std::rethrow_exception(refusal);
    if (accepted) return true;
    if (keep) {
      struct pollfd p {
        keep->worker().efd(), POLLIN, 0
      };
      ::poll(&p, 1, slice.poll_ms());
    }
    return false;
  });
  if (!accepted) return std::nullopt;
  return wrap(std::move(accepted));
}

ListenerImpl::Outcome ListenerImpl::refused(const std::string& peer, const std::string& why,
                                            std::exception_ptr error) {
  return {nullptr, "client " + peer + ": " + why, std::move(error)};
}

// The pipe is made here, under mu_: its endpoint comes from the listener's connection
// request, which belongs to the listener's worker (no other thread progresses it meanwhile).
void ListenerImpl::start_handshake(ucx::ConnRequest request, std::vector<std::string>& warnings) {
  const std::string peer = request.address.str();
  std::shared_ptr<PipeImpl> pipe;
  try {
    pipe = std::make_shared<PipeImpl>(request, options_, port_);
  } catch (const std::exception& e) {  // a tensorwire::Error, or std::bad_alloc
    // The client told at once rather than left to its connect timeout (a no-op when the
    // endpoint took the request). A client that went away (ClosedError) is its own doing;
    // anything else is this process's want (descriptors, threads, memory): a warning.
    listener_->reject(request);
    if (!dynamic_cast<const ClosedError*>(&e))
      warnings.push_back("the listener on port " + std::to_string(port_) + " refused client " +
                         peer + ": it could not make its end: " + e.what());
    ready_.push_back(refused(peer, e.what(), std::current_exception()));
    return;
  }
  Handshake& h = running_.emplace_back();
  h.pipe = pipe;
  try {
    h.thread = std::thread([this, &h, keep = listener_, peer] { run_handshake(h, keep, peer); });
  } catch (const std::system_error& e) {  // no thread to be had: this client is refused
    running_.pop_back();
    pipe->close();
    ready_.push_back(refused(peer, std::string("no thread for its handshake: ") + e.what(),
                             std::make_exception_ptr(Error(e.what()))));
  }
}

void ListenerImpl::run_handshake(Handshake& h, std::shared_ptr<ucx::Listener> keep,
                                 const std::string& peer) {
  Outcome o;
  try {
    h.pipe->handshake(/*as_server=*/true);
    o.pipe = h.pipe;
  } catch (const std::exception& e) {
    h.pipe->close();
    o = refused(peer, e.what(), std::current_exception());
  }
  std::shared_ptr<PipeImpl> unclaimed;  // closed without mu_ (a graceful close takes time)
  {
    std::lock_guard<std::mutex> lock(mu_);
    h.done = true;
    if (!listener_) {  // closed meanwhile: no pipe comes out
      unclaimed = std::move(o.pipe);
    } else {
      ready_.push_back(std::move(o));
      // Under mu_, as arm() checks ready_ and arms under it: either it saw this outcome, or
      // the fd it armed is readable now.
      try {
        keep->worker().signal();
      } catch (const Error&) {
      }
    }
  }
  if (unclaimed) unclaimed->close();
}

bool ListenerImpl::can_start() const {
  return running_.size() < kMaxHandshakes && listener_->has_pending();
}

std::list<ListenerImpl::Handshake> ListenerImpl::finished() {
  std::list<Handshake> over;
  for (auto it = running_.begin(); it != running_.end();) {
    auto next = std::next(it);
    if (it->done) over.splice(over.end(), running_, it);
    it = next;
  }
  return over;
}

int ListenerImpl::fd() {
  check_not_inherited();
  std::lock_guard<std::mutex> lock(mu_);
  check_usable();
  return listener_->worker().efd();
}

bool ListenerImpl::arm() {
  check_not_inherited();
  std::lock_guard<std::mutex> lock(mu_);
  check_usable();
  if (listener_->worker().progress() || !ready_.empty() || can_start()) return false;
  // With kMaxHandshakes running, a queued request waits: the first to end signals the fd.
  return listener_->worker().arm();
}

void ListenerImpl::close() {
  if (ucx::inherited(generation_)) {
    leave_inherited_handshakes();
    return;
  }
  std::shared_ptr<ucx::Listener> gone;  // destroyed last, once no handshake holds it
  std::list<Handshake> running;
  std::deque<Outcome> unclaimed;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (listener_) {
      try {
        listener_->worker().signal();  // an accept() asleep on its fd looks again
      } catch (const Error&) {
      }
    }
    gone = std::move(listener_);
    running.splice(running.end(), running_);
    unclaimed.swap(ready_);
  }
  // Their waits end with ClosedError at once; each thread then closes its own pipe (up to
  // a second of graceful close each), all side by side.
  for (Handshake& h : running) h.pipe->abandon();
  running.clear();  // joins
  for (Outcome& o : unclaimed)
    if (o.pipe) o.pipe->close();
}

std::string ListenerImpl::last_refusal() {
  std::lock_guard<std::mutex> lock(mu_);
  return last_refusal_;
}

bool ListenerImpl::closed() {
  if (ucx::inherited(generation_)) return true;
  std::lock_guard<std::mutex> lock(mu_);
  return !listener_;
}

}  // namespace tensorwire::detail
