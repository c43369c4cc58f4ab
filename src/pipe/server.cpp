#include "tensorwire/pipe/server.h"

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
  for (auto& w : pipes)
    if (auto p = w.lock()) p->close();
}

bool TensorDictServer::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_ || listener_.closed();
}

}  // namespace tensorwire
