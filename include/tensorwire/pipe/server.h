// TensorDictServer: accepts many clients on one port, each as its own TensorDictPipe.
// close() stops accepting and closes every pipe it handed out.
//
// Thread-safety: accept() from one thread at a time; close() from any thread.
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "tensorwire/pipe/pipe.h"

namespace tensorwire {

class TensorDictServer {
 public:
  explicit TensorDictServer(uint16_t port, const PipeOptions& options = {});
  ~TensorDictServer();  // closes

  uint16_t port() const { return listener_.port(); }
  // The next client (after its handshake); std::nullopt on timeout; ClosedError once closed.
  std::optional<TensorDictPipe> accept(Timeout timeout = Timeout::forever());
  int fd() const { return listener_.fd(); }
  bool arm() { return listener_.arm(); }
  void close();
  bool closed() const;
  size_t refused() const { return listener_.refused(); }
  const std::string& last_refusal() const { return listener_.last_refusal(); }

 private:
  PipeListener listener_;
  mutable std::mutex mu_;
  bool closed_ = false;
  std::vector<std::weak_ptr<detail::PipeImpl>> handed_out_;
};

}  // namespace tensorwire
