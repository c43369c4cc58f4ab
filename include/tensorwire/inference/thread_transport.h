// ThreadTransport: requests of any structure from threads of the server's own process.
//
// A request is copied at submit (so the caller may reuse its buffers at once), queued
// under a mutex, and answered with a view of the batched policy output. Requests of
// different structures are batched separately: one policy call per structure.
// Its clients cannot leave the process (address() is empty).
//
// Thread-safety: all methods may be called from any thread.
#pragma once

#include <memory>

#include "tensorwire/inference/transport.h"

namespace tensorwire::inference {

class ThreadTransport : public Transport {
 public:
  static std::shared_ptr<ThreadTransport> create();
  ~ThreadTransport() override;

  const char* kind() const noexcept override { return "thread"; }
  Client client() override;

  void open_server() override;
  void close_server(const std::string& reason, bool fail_pending) override;
  void release_server() noexcept override;
  void wait_for_work(Deadline deadline) override;
  void interrupt() override;
  bool has_work() override;
  bool notify_work(std::function<void()> on_work) override;
  void drain(size_t max_items, Drained& out) override;
  void collate(const Drained& drained, std::vector<Group>& groups) override;
  void resolve(const Drained& drained, const Group& group, const TensorDict& output,
               const VersionStamp& stamp) override;
  void reject(const Drained& drained, std::span<const size_t> rows,
              const RemoteError& error) override;

  struct Shared;

 private:
  ThreadTransport() = default;
  std::shared_ptr<Shared> s_;
};

}  // namespace tensorwire::inference
