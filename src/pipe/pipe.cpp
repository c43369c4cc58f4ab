// The public TensorDictPipe / PipeListener facades over PipeImpl and ucx::Listener.
#include "tensorwire/pipe/pipe.h"

#include "listener_impl.h"
#include "pipe_impl.h"

namespace tensorwire {

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
  } catch (const TimeoutError& e) {
    // Connected, but nobody took the connection up: a listener not in accept() yet (a
    // program that connects to its own listener before accepting waits here).
    if (!impl->reached_peer())
      throw TimeoutError(std::string(e.what()) + ": nothing at " + host + ":" +
                         std::to_string(port) +
                         " took the connection up (a PipeListener takes connections only in "
                         "accept(), a TensorDictServer while it serves), or the host is "
                         "unreachable");
    throw;
  } catch (const Error&) {
    // The connection failed before UCX reached the listener: refused, or ended early.
    if (!impl->reached_peer()) impl->throw_if_unreached(host, port);
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
  // The caller owns it: of a consolidated pipe, with storage of its own (the next receive
  // rewrites the decoder's in place).
  return std::async(std::launch::async, [impl, timeout] {
    return std::move(*impl->receive(nullptr, timeout, /*copy_always=*/true).copy);
  });
}

bool TensorDictPipe::start_send(const TensorDict& td) {
  return impl_->start_send(td);
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
size_t TensorDictPipe::inline_payload_max() const {
  return impl_->inline_payload_max();
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
