// The receiver allocates nothing in the steady state. Every way tensorwire allocates
// (operator new: containers, shared state; aligned_alloc: storages) is counted on the
// receiving thread while storage messages arrive. UCX's own memory pools (plain malloc
// inside libucs) are not counted: they may still grow a chunk now and then as the engine's
// unexpected-message buffers warm up, which is UCX's business, not the receive path's.
// (Built only without sanitizers, which replace these functions themselves.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "peer_process.h"
#include "tensorwire/core/consolidate.h"
#include "tensorwire/pipe/pipe.h"

namespace {
thread_local bool counting = false;
thread_local size_t allocations = 0;
}  // namespace

extern "C" void* __libc_memalign(size_t, size_t);

void* operator new(size_t n) {
  if (counting) ++allocations;
  if (void* p = std::malloc(n ? n : 1)) return p;
  throw std::bad_alloc();
}
void* operator new[](size_t n) {
  return operator new(n);
}
void operator delete(void* p) noexcept {
  std::free(p);
}
void operator delete[](void* p) noexcept {
  std::free(p);
}
void operator delete(void* p, size_t) noexcept {
  std::free(p);
}
void operator delete[](void* p, size_t) noexcept {
  std::free(p);
}

extern "C" void* aligned_alloc(size_t alignment, size_t n) {
  if (counting) ++allocations;
  return __libc_memalign(alignment, n);
}
extern "C" int posix_memalign(void** out, size_t alignment, size_t n) {
  if (counting) ++allocations;
  *out = __libc_memalign(alignment, n);
  return *out ? 0 : ENOMEM;
}

using namespace tensorwire;
using namespace std::chrono_literals;

// Ping-pong with an echo peer: one message in flight, so UCX's own pools reach their
// steady size during the warm-up (a sender running ahead would make them grow, which is
// UCX's unexpected-message buffering, not the receive path).
TEST(PipeAllocation, TheCounterSeesTensorwireAllocations) {
  allocations = 0;
  counting = true;
  {
    TensorDict td({2});
    td.set("x", Tensor::zeros({2}, DType::Float32));
  }  // new + aligned_alloc
  counting = false;
  EXPECT_GE(allocations, 2u);
}

TEST(PipeAllocation, SteadyStateReceivesAllocateNothing) {
  for (const char* tls : {"sm,tcp", "tcp"}) {
    ::setenv("UCX_TLS", tls, 1);
    for (int64_t big : {int64_t{0}, int64_t{1000000}}) {  // inline payloads and out-of-line ones
      PipeListener listener(0);
      test_support::PeerProcess p(
          {PIPE_PEER, "echo", "127.0.0.1", std::to_string(listener.port()), "60"},
          {std::string("UCX_TLS=") + tls});
      auto pipe = listener.accept(20s);
      ASSERT_TRUE(pipe);
      TensorDict td({4});
      td.set("x", Tensor::zeros({4}, DType::Float32));
      if (big) td.set("big", Tensor::zeros({4, big / 4}, DType::UInt8));
      td = consolidate(td);
      float* x = td.get("x").data<float>();
      const float* back = nullptr;
      allocations = 0;
      for (int i = 0; i < 60; ++i) {
        *x = static_cast<float>(i);
        pipe->send(td, 20s);
        counting = i >= 10;  // after the schema and a warm-up
        TensorDict& got = pipe->recv(nullptr, 20s);
        counting = false;
        if (!back) back = got.get("x").data<float>();
        ASSERT_EQ(*back, static_cast<float>(i)) << "the same storage holds message " << i;
      }
      EXPECT_EQ(allocations, 0u) << "UCX_TLS=" << tls << " big=" << big;
      EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
    }
  }
}
