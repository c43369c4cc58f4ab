#include "tensorwire/inference/client.h"

#include <atomic>
#include <string_view>

#include "client_impl.h"
#include "os/fork.h"
#include "runtime/timed_lock.h"
#include "runtime/wait.h"

namespace tensorwire::inference {

namespace {

// Runs the pending request's wait steps until it is ready or `deadline` passes, checking
// for interrupts between steps.
bool wait_for(detail::Pending& p, Deadline deadline) {
  return runtime::wait_until(deadline, [&](Deadline slice) { return p.wait(slice); });
}

detail::ClientImpl& checked(const std::shared_ptr<detail::ClientImpl>& impl, const char* what) {
  if (!impl) throw Error(std::string(what) + " of an empty Client");
  return *impl;
}

}  // namespace

std::string detail::leaf_str(DType dtype, const Shape& shape) {
  std::string s(dtype_name(dtype));
  if (s.rfind("torch.", 0) == 0) s = s.substr(6);
  return s + shape_str(shape);
}

// pending_ is read and reset only under `lock`. done() and state() never wait for it (a
// result() may hold it for as long as its timeout): when it is held they read `outcome`,
// which result() sets before it lets go of pending_, and which state() itself raises to
// Arrived when it saw the response, so that done() never goes back to false.
struct detail::FutureSync {
  enum Outcome : uint8_t { Pending, Arrived, Done, Failed };
  runtime::TimedLock lock;
  std::atomic<Outcome> outcome{Pending};
  uint64_t generation = os::fork_generation();  // of the process that made the Future
};

Future::Future() noexcept = default;
Future::Future(std::unique_ptr<detail::Pending> pending)
    : pending_(std::move(pending)), sync_(std::make_unique<detail::FutureSync>()) {}
Future::Future(Future&&) noexcept = default;
Future& Future::operator=(Future&&) noexcept = default;
Future::~Future() = default;

bool Future::done() {
  return std::string_view(state()) != "pending" && valid();
}

const char* Future::state() {
  if (!sync_) return "empty";
  if (!sync_->lock.try_lock()) {  // another thread is in result()
    switch (sync_->outcome.load()) {
      case detail::FutureSync::Pending:
        return "pending";
      case detail::FutureSync::Failed:
        return "failed";
      default:
        return "done";
    }
  }
  std::lock_guard<runtime::TimedLock> held(sync_->lock, std::adopt_lock);
  if (value_) return "done";
  if (error_) return "failed";
  if (!pending_->ready()) return "pending";
  sync_->outcome = detail::FutureSync::Arrived;
  return "done";
}

TensorDict Future::result(Timeout timeout) {
  const Deadline deadline = Deadline::after(timeout);
  if (!sync_) throw Error("result() of an empty Future");
  // A second thread waits for the first one's result as interruptibly as for a response.
  std::unique_lock<runtime::TimedLock> lock(sync_->lock, std::defer_lock);
  if (sync_->generation != os::fork_generation()) {
    // Held at the fork by a thread of the parent, which the child does not have: it is
    // never let go of here (the wait hung, or timed out saying another thread waits).
    if (!lock.try_lock())
      throw detail::made_before_fork("a thread of the parent process was waiting for it");
  } else if (!runtime::wait_until(deadline,
                                  [&](Deadline s) { return lock.try_lock_until(s.when()); })) {
    throw TimeoutError("no response within " + timeout.str() + " (another thread waits for it)");
  }
  if (value_) return *value_;
  if (error_) std::rethrow_exception(error_);
  // An interrupt (or the timeout) leaves pending_ in place: the request stays in flight.
  if (!wait_for(*pending_, deadline))
    throw TimeoutError("no response within " + timeout.str() +
                       "; the request is still in flight: call result() again");
  try {
    value_ = pending_->take();
    sync_->outcome = detail::FutureSync::Done;
  } catch (...) {
    error_ = std::current_exception();
    sync_->outcome = detail::FutureSync::Failed;
    pending_.reset();
    throw;
  }
  pending_.reset();
  return *value_;
}

Future Client::submit(const TensorDict& request, Timeout timeout) {
  return Future(checked(impl_, "submit()").submit(request, Deadline::after(timeout)));
}

TensorDict Client::operator()(const TensorDict& request, Timeout timeout) {
  detail::ClientImpl& impl = checked(impl_, "call");
  const Deadline deadline = Deadline::after(timeout);
  std::unique_ptr<detail::Pending> p = impl.submit(request, deadline);
  if (!wait_for(*p, deadline))  // dropping p abandons the request: its slot is released
    throw TimeoutError("no response within " + timeout.str());
  return p->take();
}

const char* Client::kind() const {
  return impl_ ? impl_->kind() : "";
}
std::string Client::address() const {
  return impl_ ? impl_->address() : std::string();
}
std::optional<std::vector<Key>> Client::request_keys(Timeout timeout) const {
  auto leaves = checked(impl_, "request_keys()").request_leaves(Deadline::after(timeout));
  if (!leaves) return std::nullopt;
  std::vector<Key> keys;
  keys.reserve(leaves->size());
  for (RequestLeaf& l : *leaves) keys.push_back(std::move(l.key));
  return keys;
}
std::optional<std::vector<RequestLeaf>> Client::request_leaves(Timeout timeout) const {
  return checked(impl_, "request_leaves()").request_leaves(Deadline::after(timeout));
}
void Client::close() noexcept {
  if (impl_) impl_->close();
}

}  // namespace tensorwire::inference
