#include "tensorwire/pipe/server.h"

#include <system_error>
#include <thread>

#include "pipe_impl.h"

namespace tensorwire {

TensorDictServer::TensorDictServer(uint16_t port, const PipeOptions& options)
    : listener_(port, options) {}

TensorDictServer::~TensorDictServer() {
  close();
}

std::optional<TensorDictPipe> TensorDictServer::accept(Timeout timeout) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_)
      throw ClosedError("the TensorDictServer on port " + std::to_string(port()) + " is closed");
  }
  auto pipe = listener_.accept(timeout);
  if (pipe) {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) {  // closed as the handshake ended: close() did not see this pipe
      pipe->close();
      throw ClosedError("the TensorDictServer on port " + std::to_string(port()) + " is closed");
    }
    // Forget pipes that are gone, so a long-running server does not grow this list.
    std::erase_if(handed_out_, [](const auto& w) { return w.expired(); });
    handed_out_.push_back(pipe->impl_);
  }
  return pipe;
}

void TensorDictServer::close() {
  std::vector<std::weak_ptr<detail::PipeImpl>> pipes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    pipes.swap(handed_out_);
  }
  listener_.close();
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
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ || listener_.closed();
}

}  // namespace tensorwire
