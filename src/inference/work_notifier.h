// WorkNotifier (private): the hook by which a transport whose requests are made ready by
// threads of this process (a socket's or a UCX connection's, a caller's) tells a server of
// several transports, asleep on another one, that it has work (Transport::notify_work).
//
// Thread-safety: set() and notify() may be called from any threads; notify() calls the
// hook outside any lock of its own, so the hook may take the other transport's lock.
#pragma once

#include <functional>
#include <memory>
#include <mutex>

namespace tensorwire::inference::detail {

class WorkNotifier {
 public:
  // Replaces the hook (nullptr: none).
  void set(std::function<void()> hook) {
    auto h = hook ? std::make_shared<const std::function<void()>>(std::move(hook)) : nullptr;
    std::lock_guard<std::mutex> lock(mu_);
    hook_ = std::move(h);
  }
  // Calls the hook, if there is one. Call it after the request is visible to has_work().
  void notify() const {
    std::shared_ptr<const std::function<void()>> h;
    {
      std::lock_guard<std::mutex> lock(mu_);
      h = hook_;
    }
    if (h) (*h)();
  }

 private:
  mutable std::mutex mu_;
  std::shared_ptr<const std::function<void()>> hook_;
};

}  // namespace tensorwire::inference::detail
