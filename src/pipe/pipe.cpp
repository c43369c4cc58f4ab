// The public TensorDictPipe / PipeListener facades over PipeImpl and ucx::Listener.
#include "tensorwire/pipe/pipe.h"

#include <poll.h>
#include <unistd.h>

#include <cerrno>

#include "os/fork.h"
#include "pipe_impl.h"
#include "runtime/wait.h"

namespace tensorwire {

namespace detail {

class ListenerImpl {
 public:
  ListenerImpl(uint16_t port, const PipeOptions& options)
      : options_(options),
        generation_(os::fork_generation()),
        owner_pid_(::getpid()),
        listener_(open(port)),
        port_(listener_->port()) {}

  std::optional<TensorDictPipe> accept(
      Timeout timeout, bool throw_on_refusal,
      const std::function<TensorDictPipe(std::shared_ptr<PipeImpl>)>& wrap) {
    std::optional<TensorDictPipe> accepted;
    runtime::wait_until(Deadline::after(timeout), [&](Deadline slice) {
      std::shared_ptr<ucx::Listener> keep;  // the request is the listener's: it must outlive it
      std::optional<ucx::ConnRequest> req;
      int efd = -1;
      {
        std::lock_guard<std::mutex> lock(mu_);
        check_usable();
        req = listener_->poll();
        if (req) {
          keep = listener_;
        } else {
          if (listener_->worker().progress() || !listener_->worker().arm()) return false;
          efd = listener_->worker().efd();
        }
      }
      if (req) {
        accepted = handshake(*req, throw_on_refusal, wrap);
        return accepted.has_value();
      }
      struct pollfd p {
        efd, POLLIN, 0
      };
      ::poll(&p, 1, slice.poll_ms());
      return false;
    });
    return accepted;
  }

  uint16_t port() const { return port_; }
  int fd() {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable();
    return listener_->worker().efd();
  }
  bool arm() {
    std::lock_guard<std::mutex> lock(mu_);
    check_usable();
    return !listener_->worker().progress() && !listener_->has_pending() &&
           listener_->worker().arm();
  }
  // Releases the port (at once, unless an accept() in another thread is in a client's
  // handshake: then when that ends, which this makes immediate): later clients are refused
  // by the operating system. The handshake's accept() throws ClosedError. In a forked
  // child, the parent's listener is left alone (ucx::Listener leaks it there).
  void close() {
    std::shared_ptr<ucx::Listener> gone;  // destroyed here unless an accept still holds it
    std::shared_ptr<PipeImpl> in_handshake;
    {
      std::lock_guard<std::mutex> lock(mu_);
      gone = std::move(listener_);
      in_handshake = handshaking_;
    }
    if (in_handshake) in_handshake->close();  // its waits end with ClosedError
  }
  bool closed() {
    std::lock_guard<std::mutex> lock(mu_);
    return !listener_ || ucx::inherited(generation_);
  }
  size_t refused() const { return refused_; }
  const std::string& last_refusal() const { return last_refusal_; }

 private:
  static std::shared_ptr<ucx::Listener> open(uint16_t port) {
    try {
      return std::make_shared<ucx::Listener>(port);
    } catch (const SystemError& e) {
      if (e.code() == EADDRINUSE) throw PortInUse(port);
      throw;
    }
  }

  void check_usable() const {  // under mu_
    if (!listener_)
      throw ClosedError("the listener on port " + std::to_string(port_) + " is closed");
    if (ucx::inherited(generation_))
      throw ClosedError("this listener on port " + std::to_string(port_) + " was made by process " +
                        std::to_string(owner_pid_) + " and inherited by its forked child (pid " +
                        std::to_string(::getpid()) +
                        "), where it cannot be used: its UCX state belongs to the parent");
  }

  // A client that fails the handshake, or gives up or vanishes during it, is that
  // client's failure, not the listener's: it is counted and accept() goes on. A close()
  // meanwhile ends the handshake and the accept: ClosedError, and no pipe comes out.
  std::optional<TensorDictPipe> handshake(
      ucx::ConnRequest& req, bool throw_on_refusal,
      const std::function<TensorDictPipe(std::shared_ptr<PipeImpl>)>& wrap) {
    std::shared_ptr<PipeImpl> impl;
    try {
      impl = std::make_shared<PipeImpl>(req, options_, port_);
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!listener_) throw_closed();
        handshaking_ = impl;
      }
      impl->handshake(/*as_server=*/true);
      std::lock_guard<std::mutex> lock(mu_);
      handshaking_.reset();
      if (!listener_) throw_closed();  // closed at the very end of the handshake
    } catch (const Interrupted&) {
      forget(impl);
      throw;
    } catch (const Error& e) {
      forget(impl);
      std::lock_guard<std::mutex> lock(mu_);
      if (!listener_) throw_closed();
      ++refused_;
      last_refusal_ = "client " + req.peer + ": " + e.what();
      if (throw_on_refusal) throw;
      return std::nullopt;
    }
    return wrap(std::move(impl));
  }

  // After a failed or abandoned handshake: no longer the one close() ends, and closed.
  void forget(const std::shared_ptr<PipeImpl>& impl) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (handshaking_ == impl) handshaking_.reset();
    }
    if (impl) impl->close();
  }

  [[noreturn]] void throw_closed() const {
    throw ClosedError("the listener on port " + std::to_string(port_) + " is closed");
  }

  PipeOptions options_;
  uint64_t generation_;
  pid_t owner_pid_;
  std::mutex mu_;
  // Null once closed. Shared with an accept() in a client's handshake, whose connection
  // request belongs to it: destroying it under that handshake freed the request UCX was
  // still using (a crash, or a spin for ever, when a server closed during a handshake).
  std::shared_ptr<ucx::Listener> listener_;
  std::shared_ptr<PipeImpl> handshaking_;  // the pipe an accept() is handshaking, if any
  uint16_t port_;
  std::atomic<size_t> refused_{0};
  std::string last_refusal_;
};

}  // namespace detail

TensorDictPipe::TensorDictPipe(std::shared_ptr<detail::PipeImpl> impl) : impl_(std::move(impl)) {}
TensorDictPipe::TensorDictPipe(TensorDictPipe&&) noexcept = default;
TensorDictPipe& TensorDictPipe::operator=(TensorDictPipe&&) noexcept = default;
TensorDictPipe::~TensorDictPipe() {
  if (impl_) impl_->close();
}

TensorDictPipe TensorDictPipe::connect(const std::string& host, uint16_t port,
                                       const PipeOptions& options) {
  auto impl = std::make_shared<detail::PipeImpl>(host, port, options);
  try {
    impl->handshake(/*as_server=*/false);
  } catch (const ClosedError&) {
    // The connection failed before UCX could reach any listener there.
    if (!impl->reached_peer()) throw ConnectionRefused(host, port);
    throw;
  }
  return TensorDictPipe(std::move(impl));
}

TensorDictPipe TensorDictPipe::listen(uint16_t port, const PipeOptions& options,
                                      const std::function<void(uint16_t)>& on_listening) {
  PipeListener listener(port, options);
  if (on_listening) on_listening(listener.port());
  // One client only: a refused handshake is this call's failure. The listener closes on
  // return, so later clients are refused by the operating system.
  return std::move(*listener.accept(Timeout::forever(), /*throw_on_refusal=*/true));
}

void TensorDictPipe::send(const TensorDict& td, Timeout timeout) {
  impl_->send(td, timeout);
}
TensorDict& TensorDictPipe::recv(TensorDict* into, Timeout timeout) {
  return impl_->recv(into, timeout);
}
bool TensorDictPipe::last_recv_was_new_schema() const {
  return impl_->last_new_schema();
}

std::future<void> TensorDictPipe::send_async(TensorDict td, Timeout timeout) {
  auto impl = impl_;
  return std::async(std::launch::async,
                    [impl, td = std::move(td), timeout] { impl->send(td, timeout); });
}

std::future<TensorDict> TensorDictPipe::recv_async(Timeout timeout) {
  auto impl = impl_;
  // A copy of the structure: the caller owns it, its tensors share the received storage.
  return std::async(std::launch::async, [impl, timeout] {
    return std::move(*impl->receive(nullptr, timeout, /*copy_always=*/true).copy);
  });
}

void TensorDictPipe::start_send(const TensorDict& td) {
  impl_->start_send(td);
}
bool TensorDictPipe::poll_send(std::chrono::microseconds spin) {
  return impl_->poll_send(spin);
}

bool TensorDictPipe::receiving_into(const TensorDict& td) {
  return impl_->receiving_into(td);
}

bool TensorDictPipe::sending(const TensorDict& td) {
  return impl_->sending(td);
}
TensorDict* TensorDictPipe::poll_recv(TensorDict* into, std::chrono::microseconds spin) {
  return impl_->poll_recv(into, spin);
}
TensorDictPipe::Received TensorDictPipe::receive(TensorDict* into, Timeout timeout,
                                                 bool copy_always) {
  return impl_->receive(into, timeout, copy_always);
}
TensorDictPipe::Received TensorDictPipe::poll_receive(TensorDict* into,
                                                      std::chrono::microseconds spin) {
  return impl_->poll_receive(into, spin);
}
int TensorDictPipe::fd() const {
  return impl_->fd();
}
bool TensorDictPipe::arm() {
  return impl_->arm();
}
int TensorDictPipe::peer_fd() const {
  return impl_->peer_fd();
}
void TensorDictPipe::close() {
  impl_->close();
}
bool TensorDictPipe::closed() const {
  return impl_->closed();
}
bool TensorDictPipe::failed() const {
  return impl_->failed();
}
bool TensorDictPipe::closed_by_peer() const {
  return impl_->closed_by_peer();
}
uint16_t TensorDictPipe::local_port() const {
  return impl_->local_port();
}
uint64_t TensorDictPipe::events() const {
  return impl_->events();
}
std::string TensorDictPipe::transports() const {
  return impl_->transports();
}
const std::string& TensorDictPipe::peer() const {
  return impl_->peer();
}
const PipeOptions& TensorDictPipe::options() const {
  return impl_->options();
}

PipeListener::PipeListener(uint16_t port, const PipeOptions& options)
    : impl_(std::make_unique<detail::ListenerImpl>(port, options)) {}
PipeListener::~PipeListener() = default;
uint16_t PipeListener::port() const {
  return impl_->port();
}
std::optional<TensorDictPipe> PipeListener::accept(Timeout timeout, bool throw_on_refusal) {
  return impl_->accept(timeout, throw_on_refusal,
                       [](auto impl) { return TensorDictPipe(std::move(impl)); });
}
int PipeListener::fd() const {
  return impl_->fd();
}
bool PipeListener::arm() {
  return impl_->arm();
}
void PipeListener::close() {
  impl_->close();
}
bool PipeListener::closed() const {
  return impl_->closed();
}
size_t PipeListener::refused() const {
  return impl_->refused();
}
const std::string& PipeListener::last_refusal() const {
  return impl_->last_refusal();
}

}  // namespace tensorwire
