// The public TensorDictPipe / PipeListener facades over PipeImpl and ucx::Listener.
#include "tensorwire/pipe/pipe.h"

#include "listener_impl.h"
#include "pipe_impl.h"

namespace tensorwire {

TensorDictPipe::TensorDictPipe(std::shared_ptr<detail::PipeImpl> impl) : impl_(std::move(impl)) {}
TensorDictPipe::TensorDictPipe(TensorDictPipe&&) noexcept = default;
// The pipe replaced is closed, as its destructor would: a future of it (recv_async) holds
// its impl, and nothing else could ever close it.
TensorDictPipe& TensorDictPipe::operator=(TensorDictPipe&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->close();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
TensorDictPipe::~TensorDictPipe() {
  if (impl_) impl_->close();
}

detail::PipeImpl& TensorDictPipe::impl() const {
  if (!impl_) throw ClosedError("this TensorDictPipe was moved from");
  return *impl_;
}

TensorDictPipe TensorDictPipe::connect(const std::string& host, uint16_t port,
                                       const PipeOptions& options) {
  auto impl = std::make_shared<detail::PipeImpl>(host, port, options);
  try {
    try {
      impl->handshake(/*as_server=*/false);
    } catch (const TimeoutError& e) {
      // Connected, but nobody took the connection up: a listener not in accept() yet (a
      // program that connects to its own listener before accepting waits here).
      if (!impl->reached_peer())
        throw TimeoutError(std::string(e.what()) + ": nothing at " + host + ":" +
                           std::to_string(port) +
                           " took the connection up (a PipeListener takes connections only "
                           "in accept(), a TensorDictServer while it serves), or the host is "
                           "unreachable");
      throw;
    } catch (const Error&) {
      // The connection failed before UCX reached the listener: refused, or ended early.
      if (!impl->reached_peer()) impl->throw_if_unreached(host, port);
      throw;
    }
  } catch (...) {
    // A handshake given up (timeout, interrupt, error) closes once the wire-up has ended
    // (PipeImpl::close_abandoned), as the remote inference client's does.
    impl->close_abandoned();
    throw;
  }
  return TensorDictPipe(std::move(impl));
}

TensorDictPipe TensorDictPipe::listen(uint16_t port, const PipeOptions& options,
                                      const std::function<void(uint16_t)>& on_listening,
                                      Timeout timeout) {
  PipeListener listener(port, options);
  if (on_listening) on_listening(listener.port());
  // One client only: a refused handshake is this call's failure. The listener closes on
  // return, so later clients are refused by the operating system.
  std::optional<TensorDictPipe> got = listener.accept(timeout, /*throw_on_refusal=*/true);
  if (!got)
    throw TimeoutError("TensorDictPipe::listen: no client connected to port " +
                       std::to_string(listener.port()) + " within " + timeout.str());
  return std::move(*got);
}

void TensorDictPipe::send(const TensorDict& td, Timeout timeout) {
  impl().send(td, timeout);
}
TensorDict& TensorDictPipe::recv(TensorDict* into, Timeout timeout) {
  return impl().recv(into, timeout);
}
bool TensorDictPipe::last_recv_was_new_schema() const {
  return impl().last_new_schema();
}

std::future<void> TensorDictPipe::send_async(TensorDict td, Timeout timeout) {
  auto impl = impl_;
  this->impl();  // a moved-from pipe: ClosedError now, not in the future
  return std::async(std::launch::async,
                    [impl, td = std::move(td), timeout] { impl->send(td, timeout); });
}

std::future<TensorDict> TensorDictPipe::recv_async(Timeout timeout) {
  auto impl = impl_;
  this->impl();  // a moved-from pipe: ClosedError now, not in the future
  // The caller owns it: of a consolidated pipe, with storage of its own (the next receive
  // rewrites the decoder's in place).
  return std::async(std::launch::async, [impl, timeout] {
    return std::move(*impl->receive(nullptr, timeout, /*copy_always=*/true).copy);
  });
}

bool TensorDictPipe::start_send(const TensorDict& td) {
  return impl().start_send(td);
}
bool TensorDictPipe::poll_send(std::chrono::microseconds spin) {
  return impl().poll_send(spin);
}

bool TensorDictPipe::receiving_into(const TensorDict& td) {
  return impl().receiving_into(td);
}

bool TensorDictPipe::sending(const TensorDict& td) {
  return impl().sending(td);
}
TensorDict* TensorDictPipe::poll_recv(TensorDict* into, std::chrono::microseconds spin) {
  return impl().poll_recv(into, spin);
}
TensorDictPipe::Received TensorDictPipe::receive(TensorDict* into, Timeout timeout,
                                                 bool copy_always) {
  return impl().receive(into, timeout, copy_always);
}
TensorDictPipe::Received TensorDictPipe::poll_receive(TensorDict* into,
                                                      std::chrono::microseconds spin) {
  return impl().poll_receive(into, spin);
}
int TensorDictPipe::fd() const {
  return impl().fd();
}
bool TensorDictPipe::arm() {
  return impl().arm();
}
int TensorDictPipe::peer_fd() const {
  return impl().peer_fd();
}
void TensorDictPipe::close() {
  if (impl_) impl().close();
}
bool TensorDictPipe::closed() const {
  return !impl_ || impl().closed();
}
// The state queries answer for a moved-from pipe too, as closed() does (it can carry no
// data, and its peer closed nothing): they are what a caller asks before using it.
bool TensorDictPipe::failed() const {
  return !impl_ || impl_->failed();
}
bool TensorDictPipe::closed_by_peer() const {
  return impl_ && impl_->closed_by_peer();
}
uint16_t TensorDictPipe::local_port() const {
  return impl().local_port();
}
uint64_t TensorDictPipe::events() const {
  return impl().events();
}
size_t TensorDictPipe::inline_payload_max() const {
  return impl().inline_payload_max();
}

std::string TensorDictPipe::transports() const {
  return impl().transports();
}
const std::string& TensorDictPipe::peer() const {
  return impl().peer();
}
const PipeOptions& TensorDictPipe::options() const {
  return impl().options();
}

PipeListener::PipeListener(uint16_t port, const PipeOptions& options)
    : impl_(std::make_unique<detail::ListenerImpl>(port, options)) {}
PipeListener::PipeListener(PipeListener&&) noexcept = default;
PipeListener& PipeListener::operator=(PipeListener&& o) noexcept {
  if (this != &o) {
    if (impl_) impl_->close();
    impl_ = std::move(o.impl_);
  }
  return *this;
}
PipeListener::~PipeListener() = default;
detail::ListenerImpl& PipeListener::impl() const {
  if (!impl_) throw ClosedError("this PipeListener was moved from");
  return *impl_;
}
uint16_t PipeListener::port() const {
  return impl().port();
}
std::optional<TensorDictPipe> PipeListener::accept(Timeout timeout, bool throw_on_refusal) {
  return impl().accept(timeout, throw_on_refusal,
                       [](auto impl) { return TensorDictPipe(std::move(impl)); });
}
int PipeListener::fd() const {
  return impl().fd();
}
bool PipeListener::arm() {
  return impl().arm();
}
void PipeListener::close() {
  if (impl_) impl_->close();
}
bool PipeListener::closed() const {
  return !impl_ || impl_->closed();
}
size_t PipeListener::refused() const {
  return impl().refused();
}
std::string PipeListener::last_refusal() const {
  return impl().last_refusal();
}

}  // namespace tensorwire
