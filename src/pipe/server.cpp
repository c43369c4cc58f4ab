#include "tensorwire/pipe/server.h"

#include <mutex>
#include <system_error>
#include <thread>
#include <vector>

#include "pipe_impl.h"

namespace tensorwire {

struct detail::ServerState {
  ServerState(uint16_t port, const PipeOptions& options) : listener(port, options) {}
  PipeListener listener;
  mutable std::mutex mu;
  bool closed = false;
  std::vector<std::weak_ptr<detail::PipeImpl>> handed_out;
};

TensorDictServer::TensorDictServer(uint16_t port, const PipeOptions& options)
    : s_(std::make_unique<detail::ServerState>(port, options)) {}

TensorDictServer::TensorDictServer(TensorDictServer&&) noexcept = default;

TensorDictServer& TensorDictServer::operator=(TensorDictServer&& o) noexcept {
  if (this != &o) {
    if (s_) close();
    s_ = std::move(o.s_);
  }
  return *this;
}

TensorDictServer::~TensorDictServer() {
  if (s_) close();
}

detail::ServerState& TensorDictServer::state() const {
  if (!s_) throw ClosedError("this TensorDictServer was moved from");
  return *s_;
}

uint16_t TensorDictServer::port() const {
  return state().listener.port();
}
int TensorDictServer::fd() const {
  return state().listener.fd();
}
bool TensorDictServer::arm() {
  return state().listener.arm();
}
size_t TensorDictServer::refused() const {
  return state().listener.refused();
}
std::string TensorDictServer::last_refusal() const {
  return state().listener.last_refusal();
}

std::optional<TensorDictPipe> TensorDictServer::accept(Timeout timeout) {
  detail::ServerState& s = state();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.closed)
      throw ClosedError("the TensorDictServer on port " + std::to_string(port()) + " is closed");
  }
  auto pipe = s.listener.accept(timeout);
  if (pipe) {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.closed) {  // closed as the handshake ended: close() did not see this pipe
      pipe->close();
      throw ClosedError("the TensorDictServer on port " + std::to_string(port()) + " is closed");
    }
    // Forget pipes that are gone, so a long-running server does not grow this list.
    std::erase_if(s.handed_out, [](const auto& w) { return w.expired(); });
    s.handed_out.push_back(pipe->impl_);
  }
  return pipe;
}

void TensorDictServer::close() {
  if (!s_) return;  // moved from
  detail::ServerState& s = *s_;
  std::vector<std::weak_ptr<detail::PipeImpl>> pipes;
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.closed) return;
    s.closed = true;
    pipes.swap(s.handed_out);
  }
  s.listener.close();
  // A pipe's close may take a second and a half (a flush, then a graceful endpoint close)
  // when its peer stopped answering: side by side, as the listener closes its handshakes,
  // so any number of such peers cost one wait.
  std::vector<std::shared_ptr<detail::PipeImpl>> live;
  for (auto& w : pipes)
    if (auto p = w.lock()) live.push_back(std::move(p));
  std::vector<std::thread> closers;
  for (size_t i = 1; i < live.size(); ++i) {
    try {
      closers.emplace_back([p = live[i]] { p->close(); });
    } catch (const std::system_error&) {  // no thread to be had: here, then
      live[i]->close();
    }
  }
  if (!live.empty()) live[0]->close();
  for (std::thread& t : closers) t.join();
}

bool TensorDictServer::closed() const {
  if (!s_) return true;
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->closed || s_->listener.closed();
}

}  // namespace tensorwire
