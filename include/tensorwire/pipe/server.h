// TensorDictServer: accepts many clients on one port, each as its own TensorDictPipe.
// close() stops accepting and closes every pipe it handed out.
//
// Thread-safety: accept() from one thread at a time; close() from any thread.
#pragma once

#include <memory>

#include "tensorwire/pipe/pipe.h"

namespace tensorwire {

namespace detail {
struct ServerState;
}

class TensorDictServer {
 public:
  explicit TensorDictServer(uint16_t port, const PipeOptions& options = {});
  TensorDictServer(TensorDictServer&&) noexcept;
  TensorDictServer& operator=(TensorDictServer&&) noexcept;  // closes the server it replaces
  ~TensorDictServer();                                       // closes

  uint16_t port() const;
  // The next client (after its handshake); std::nullopt on timeout; ClosedError once closed.
  std::optional<TensorDictPipe> accept(Timeout timeout = Timeout::forever());
  int fd() const;
  bool arm();
  void close();
  bool closed() const;  // also true when moved from
  size_t refused() const;
  std::string last_refusal() const;

 private:
  detail::ServerState& state() const;  // ClosedError when moved from
  std::unique_ptr<detail::ServerState> s_;
};

}  // namespace tensorwire
