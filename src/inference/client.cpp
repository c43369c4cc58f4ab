#include "tensorwire/inference/client.h"

namespace tensorwire::inference {

Clock::time_point deadline_after(Timeout timeout) noexcept {
  if (timeout.count() < 0) return Clock::time_point::max();
  const auto now = Clock::now();
  if (timeout > Clock::time_point::max() - now) return Clock::time_point::max();
  return now + std::chrono::duration_cast<Clock::duration>(timeout);
}

bool Future::done() {
  if (!pending_) return valid();
  return pending_->ready();
}

TensorDict Future::result(Timeout timeout) {
  if (value_) return *value_;
  if (error_) std::rethrow_exception(error_);
  if (!pending_) throw Error("result() of an empty Future");
  if (!pending_->wait(deadline_after(timeout)))
    throw TimeoutError("no response within the timeout; the request is still in flight");
  try {
    value_ = pending_->take();
  } catch (...) {
    error_ = std::current_exception();
    pending_.reset();
    throw;
  }
  pending_.reset();
  return *value_;
}

Future Client::submit(const TensorDict& request, Timeout timeout) {
  if (!impl_) throw Error("submit() on an empty Client");
  return Future(impl_->submit(request, deadline_after(timeout)));
}

TensorDict Client::operator()(const TensorDict& request, Timeout timeout) {
  if (!impl_) throw Error("call of an empty Client");
  const auto deadline = deadline_after(timeout);
  std::unique_ptr<detail::Pending> p = impl_->submit(request, deadline);
  if (!p->wait(deadline))
    throw TimeoutError("no response within the timeout");  // the request is dropped: slot released
  return p->take();
}

const char* Client::kind() const {
  return impl_ ? impl_->kind() : "";
}
std::string Client::address() const {
  return impl_ ? impl_->address() : std::string();
}

}  // namespace tensorwire::inference
