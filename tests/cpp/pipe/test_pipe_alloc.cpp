// The receiver allocates nothing in the steady state: malloc is interposed in this test
// binary and counted on the receiving thread while storage messages arrive. (Built only
// without sanitizers, which interpose malloc themselves.)
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>

#include "peer_process.h"
#include "tensorwire/pipe/pipe.h"

extern "C" void* __libc_malloc(size_t);
extern "C" void* __libc_calloc(size_t, size_t);
extern "C" void* __libc_realloc(void*, size_t);

namespace {
thread_local bool counting = false;
thread_local size_t allocations = 0;
}  // namespace

extern "C" void* malloc(size_t n) {
  if (counting) ++allocations;
  return __libc_malloc(n);
}
extern "C" void* calloc(size_t a, size_t b) {
  if (counting) ++allocations;
  return __libc_calloc(a, b);
}
extern "C" void* realloc(void* p, size_t n) {
  if (counting) ++allocations;
  return __libc_realloc(p, n);
}

using namespace tensorwire;
using namespace std::chrono_literals;

TEST(PipeAllocation, SteadyStateReceivesAllocateNothing) {
  for (const char* tls : {"sm,tcp", "tcp"}) {
    ::setenv("UCX_TLS", tls, 1);
    for (const char* big : {"0", "1000000"}) {  // inline payloads and out-of-line ones
      PipeListener listener(0);
      test_support::PeerProcess p({PIPE_PEER, "send", "127.0.0.1", std::to_string(listener.port()), "60", "--big", big},
                             {std::string("UCX_TLS=") + tls});
      auto pipe = listener.accept(20s);
      ASSERT_TRUE(pipe);
      for (int i = 0; i < 10; ++i) pipe->recv(nullptr, 20s);  // schema, warm-up of UCX's pools
      allocations = 0;
      const float* x = nullptr;  // looked up outside the counted window (a Key allocates)
      for (int i = 10; i < 60; ++i) {
        counting = true;
        TensorDict& td = pipe->recv(nullptr, 20s);
        counting = false;
        if (!x) x = td.get("x").data<float>();
        ASSERT_EQ(*x, static_cast<float>(i)) << "the same storage holds message " << i;
      }
      EXPECT_EQ(allocations, 0u) << "UCX_TLS=" << tls << " big=" << big;
      EXPECT_EQ(p.exit_code(), 0) << p.stderr_text();
    }
  }
}
