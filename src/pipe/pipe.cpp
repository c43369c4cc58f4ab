// The public TensorDictPipe / PipeListener facades over PipeImpl and ucx::Listener.
#include "tensorwire/pipe/pipe.h"

#include <poll.h>

#include "pipe_impl.h"

namespace tensorwire {

namespace detail {

class ListenerImpl {
 public:
  ListenerImpl(uint16_t port, const PipeOptions& options)
      : options_(options),
        listener_(std::make_unique<ucx::Listener>(port)),
        port_(listener_->port()) {}

  std::optional<TensorDictPipe> accept(
      TensorDictPipe::Millis timeout, bool throw_on_refusal,
      const std::function<TensorDictPipe(std::shared_ptr<PipeImpl>)>& wrap) {
    const auto deadline = timeout.count() < 0 ? Clock::time_point::max() : Clock::now() + timeout;
    while (true) {
      std::optional<ucx::ConnRequest> req;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!listener_) throw ClosedError("the listener is closed");
        req = listener_->poll();
      }
      if (req) {
        auto impl = std::make_shared<PipeImpl>(*req, options_, port_);
        try {
          impl->handshake(/*as_server=*/true);
          return wrap(std::move(impl));
        } catch (const wire::HandshakeError& e) {
          std::lock_guard<std::mutex> lock(mu_);
          ++refused_;
          last_refusal_ = e.what();
          if (throw_on_refusal) throw;
        } catch (const Error& e) {
          // A client that vanished mid-handshake is not the listener's failure.
          std::lock_guard<std::mutex> lock(mu_);
          ++refused_;
          last_refusal_ = e.what();
          if (throw_on_refusal) throw;
        }
        continue;
      }
      if (Clock::now() >= deadline) return std::nullopt;
      int efd;
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (!listener_) throw ClosedError("the listener is closed");
        if (listener_->worker().progress() || !listener_->worker().arm()) continue;
        efd = listener_->worker().efd();
      }
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      struct pollfd p {
        efd, POLLIN, 0
      };
      ::poll(&p, 1, static_cast<int>(std::clamp<int64_t>(left.count(), 0, 100)));
    }
  }

  uint16_t port() const { return port_; }
  int fd() {
    std::lock_guard<std::mutex> lock(mu_);
    return listener_ ? listener_->worker().efd() : -1;
  }
  bool arm() {
    std::lock_guard<std::mutex> lock(mu_);
    return listener_ && !listener_->worker().progress() && listener_->worker().arm();
  }
  // Releases the port at once: later clients are refused by the operating system.
  void close() {
    std::lock_guard<std::mutex> lock(mu_);
    listener_.reset();
  }
  size_t refused() const { return refused_; }
  const std::string& last_refusal() const { return last_refusal_; }

 private:
  using Clock = std::chrono::steady_clock;
  PipeOptions options_;
  std::mutex mu_;
  std::unique_ptr<ucx::Listener> listener_;  // null once closed
  uint16_t port_;
  size_t refused_ = 0;
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
  impl->handshake(/*as_server=*/false);
  return TensorDictPipe(std::move(impl));
}

TensorDictPipe TensorDictPipe::listen(uint16_t port, const PipeOptions& options,
                                      const std::function<void(uint16_t)>& on_listening) {
  PipeListener listener(port, options);
  if (on_listening) on_listening(listener.port());
  // One client only: a refused handshake is this call's failure. The listener closes on
  // return, so later clients are refused by the operating system.
  return std::move(*listener.accept(kForever, /*throw_on_refusal=*/true));
}

void TensorDictPipe::send(const TensorDict& td, Millis timeout) {
  impl_->send(td, timeout);
}
TensorDict& TensorDictPipe::recv(TensorDict* into, Millis timeout) {
  return impl_->recv(into, timeout);
}
bool TensorDictPipe::last_recv_was_new_schema() const {
  return impl_->last_new_schema();
}

std::future<void> TensorDictPipe::send_async(TensorDict td) {
  auto impl = impl_;
  return std::async(std::launch::async, [impl, td = std::move(td)] { impl->send(td, kForever); });
}

std::future<TensorDict> TensorDictPipe::recv_async() {
  auto impl = impl_;
  // A copy of the structure: the caller owns it, its tensors share the received storage.
  return std::async(std::launch::async,
                    [impl] { return TensorDict(impl->recv(nullptr, kForever)); });
}

void TensorDictPipe::start_send(const TensorDict& td) {
  impl_->start_send(td);
}
bool TensorDictPipe::poll_send(std::chrono::microseconds spin) {
  return impl_->poll_send(spin);
}
TensorDict* TensorDictPipe::poll_recv(TensorDict* into, std::chrono::microseconds spin) {
  return impl_->poll_recv(into, spin);
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
std::optional<TensorDictPipe> PipeListener::accept(TensorDictPipe::Millis timeout,
                                                   bool throw_on_refusal) {
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
size_t PipeListener::refused() const {
  return impl_->refused();
}
const std::string& PipeListener::last_refusal() const {
  return impl_->last_refusal();
}

}  // namespace tensorwire
