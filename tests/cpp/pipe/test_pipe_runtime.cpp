// The pipe on the shared runtime: Timeout, interrupts, resumable sends, error kinds, and
// fork(). Both ends live in this process (the accepting end on a helper thread).
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <ucm/api/ucm.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "core/dlpack_dtype.h"
#include "os/fd_budget.h"
#include "peer_process.h"
#include "pipe/pipe_impl.h"
#include "tensorwire/pipe/pipe.h"
#include "tensorwire/pipe/server.h"
#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/tensorwire.h"
#include "ucx/ucx.h"

using namespace tensorwire;
using namespace std::chrono_literals;

// LeakSanitizer asks this at exit. A forked child leaves its parent's UCX state alone on
// purpose (it is leaked, never torn down in the child): not a leak to report there.
namespace {
bool g_in_forked_child = false;  // set by in_forked_child() in the child
}  // namespace
extern "C" int __lsan_is_turned_off() {
  return g_in_forked_child ? 1 : 0;
}

namespace {

struct Pair {
  PipeListener listener{0};
  std::optional<TensorDictPipe> accepted;
  std::optional<TensorDictPipe> connected;
  Pair() {
    std::thread t([&] { accepted = listener.accept(20s); });
    connected = TensorDictPipe::connect("127.0.0.1", listener.port());
    t.join();
  }
};

TensorDict big() {  // 8 MiB: a rendezvous, completed only when the peer receives it
  std::vector<double> v(1 << 20);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i);
  TensorDict td;
  td.set("x", Tensor::from_vector<double>(v, {static_cast<int64_t>(v.size())}));
  return td;
}

TensorDict small(float x) {
  TensorDict td({2});
  td.set("v", Tensor::from_vector<float>({x, x}, {2}));
  return td;
}

std::atomic<bool> g_interrupt{false};
void interrupt_when_asked() {
  if (g_interrupt.exchange(false)) throw Interrupted("test interrupt");
}

// Interrupts the calling test's blocking call after `after`; returns how long it took.
template <class Call>
Clock::duration interrupted_after(Clock::duration after, Call&& call) {
  set_interrupt_check(&interrupt_when_asked);
  std::thread t([after] {
    std::this_thread::sleep_for(after);
    g_interrupt = true;
  });
  const auto start = Clock::now();
  EXPECT_THROW(call(), Interrupted);
  const auto took = Clock::now() - start - after;
  t.join();
  set_interrupt_check(nullptr);
  return took;
}

// Runs `child` in a forked child; its exit code (it exits with std::exit, so static and
// library destructors run there too).
template <class Child>
int in_forked_child(Child&& child) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    g_in_forked_child = true;  // see __lsan_is_turned_off above
    std::exit(child());
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

}  // namespace

TEST(PipeRuntime, ASendThatTimedOutResumesWithTheSameDictAndArrivesOnce) {
  Pair p;
  TensorDict td = big();
  EXPECT_FALSE(p.connected->sending(td));
  EXPECT_THROW(p.connected->send(td, 50ms), TimeoutError);
  EXPECT_TRUE(p.connected->sending(td));  // what an event loop asks before a retry
  TensorDict same_leaves_elsewhere = td;
  EXPECT_FALSE(p.connected->sending(same_leaves_elsewhere));  // identity, not contents
  EXPECT_FALSE(p.connected->sending(big()));
  std::thread receiver([&] {
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("x").data<double>()[(1 << 20) - 1], (1 << 20) - 1);
  });
  p.connected->send(td, 20s);
  receiver.join();
  EXPECT_FALSE(p.connected->sending(td));
  EXPECT_THROW(p.accepted->recv(nullptr, 300ms), TimeoutError);  // no second copy
}

// A receive that timed out in the middle of a message still writes into the dict it was
// given: receiving_into() says so (the binding keeps that dict alive), and the receive that
// completes it returns that dict.
TEST(PipeRuntime, AReceiveThatTimedOutMidMessageStillWritesIntoItsTarget) {
  ::setenv("UCX_TLS", "tcp", 1);  // over TCP a payload moves only while the sender progresses
  Pair p;
  TensorDict first = big();
  std::thread sender([&] { p.connected->send(first, 20s); });
  p.accepted->recv(nullptr, 20s);  // the structure
  sender.join();
  TensorDict into = consolidate(big());  // of the received layout: the payload lands in it
  TensorDict second = big();
  second.get("x").data<double>()[0] = 7.0;
  EXPECT_FALSE(p.accepted->receiving_into(into));
  EXPECT_THROW(p.connected->send(second, 0ms), TimeoutError);  // its payload waits for us
  EXPECT_THROW(p.accepted->recv(&into, 200ms), TimeoutError);  // takes the frame: into `into`
  EXPECT_TRUE(p.accepted->receiving_into(into));
  EXPECT_FALSE(p.accepted->receiving_into(first));
  sender = std::thread([&] { p.connected->send(second, 20s); });
  TensorDict& got = p.accepted->recv(nullptr, 20s);
  sender.join();
  EXPECT_EQ(&got, &into);
  EXPECT_EQ(into.get("x").data<double>()[0], 7.0);
  EXPECT_FALSE(p.accepted->receiving_into(into));
}

// Threads sharing a consolidated pipe keep what receive(copy_always) gives them: a copy
// with storage of its own. It shared the decoder's storage, which the next receive (the
// other thread's) rewrites in place: messages were seen twice and others never.
TEST(PipeRuntime, ThreadsSharingAConsolidatedPipeKeepWholeMessagesEachOnce) {
  Pair p;
  constexpr int kMessages = 600;
  std::mutex mu;
  std::vector<TensorDict> kept;
  auto receiver = [&] {
    for (;;) {
      {
        std::lock_guard<std::mutex> lock(mu);
        if (kept.size() >= kMessages) return;
      }
      TensorDictPipe::Received r;
      try {
        r = p.accepted->receive(nullptr, 200ms, /*copy_always=*/true);
      } catch (const TimeoutError&) {
        continue;
      }
      std::lock_guard<std::mutex> lock(mu);
      kept.push_back(std::move(*r.copy));
    }
  };
  std::thread a(receiver), b(receiver);
  for (int i = 0; i < kMessages; ++i) p.connected->send(small(static_cast<float>(i)), 20s);
  a.join();
  b.join();
  std::vector<int> seen(kMessages, 0);
  for (const TensorDict& td : kept) ++seen.at(static_cast<size_t>(td.get("v").at<float>({1})));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), kMessages);
  // recv_async's results, kept together, too.
  p.connected->send(small(1), 20s);
  p.connected->send(small(2), 20s);
  TensorDict one = p.accepted->recv_async(5s).get();
  TensorDict two = p.accepted->recv_async(5s).get();
  EXPECT_EQ(one.get("v").at<float>({0}), 1);
  EXPECT_EQ(two.get("v").at<float>({0}), 2);
}

// Two threads' receives (or sends) on one pipe take turns; one waiting for its turn still
// ends at its own timeout (it waited for the other call, however long that one's was).
TEST(PipeRuntime, ACallWaitingForAnotherThreadsTurnEndsAtItsOwnTimeout) {
  ::setenv("UCX_TLS", "tcp", 1);  // a rendezvous that waits for the receiver: a held send
  Pair p;
  std::thread first_receiver(
      [&] { EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 1.f); });
  std::this_thread::sleep_for(100ms);  // the first receive holds the receiving side
  auto start = Clock::now();
  try {
    p.accepted->recv(nullptr, 300ms);
    ADD_FAILURE() << "no TimeoutError";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("another thread's recv"), std::string::npos) << e.what();
  }
  EXPECT_LT(Clock::now() - start, 5s);
  p.connected->send(small(1.f), 20s);
  first_receiver.join();

  Pair q;
  TensorDict held = big();
  std::thread first_sender([&] { q.connected->send(held, 20s); });
  std::this_thread::sleep_for(100ms);
  start = Clock::now();
  EXPECT_THROW(q.connected->send(small(2.f), 300ms), TimeoutError);
  EXPECT_LT(Clock::now() - start, 5s);
  EXPECT_EQ(q.accepted->recv(nullptr, 20s).get("x").numel(), 1 << 20);
  first_sender.join();
  EXPECT_THROW(q.accepted->recv(nullptr, 300ms), TimeoutError);  // the second was never sent
}

TEST(PipeRuntime, AfterATimedOutSendAnotherDictFollowsIt) {
  Pair p;
  TensorDict first = big();
  EXPECT_THROW(p.connected->send(first, 50ms), TimeoutError);
  std::thread receiver([&] {
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("x").numel(), 1 << 20);
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 9.f);
  });
  p.connected->send(small(9.f), 20s);
  receiver.join();
}

// The non-blocking form takes one send at a time: a start while another send is in flight
// (an earlier start not yet completed by poll_send, or a blocking send of another thread
// holding the pipe's turn) sends nothing and says so, and each dict arrives once, in order.
TEST(PipeRuntime, AStartWhileAnotherSendIsInFlightSendsNothingAndSaysSo) {
  Pair p;
  TensorDict first = big(), second = small(2.f), third = small(3.f);
  ASSERT_TRUE(p.connected->start_send(first));
  EXPECT_FALSE(p.connected->start_send(second));  // the 8 MiB are still going out
  std::atomic<bool> checked{false};
  std::thread receiver([&] {
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("x").numel(), 1 << 20);
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 2.f);
    while (!checked) std::this_thread::yield();  // `again` waits for this receive
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("x").numel(), 1 << 20);
    EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 3.f);
  });
  const auto until = Clock::now() + 20s;
  while (!p.connected->poll_send() && Clock::now() < until) {
  }
  ASSERT_TRUE(p.connected->start_send(second));
  while (!p.connected->poll_send() && Clock::now() < until) {
  }
  // A blocking send of another thread, waiting for its 8 MiB to go out, holds the turn.
  TensorDict again = big();
  std::thread blocking([&] { p.connected->send(again, 20s); });
  while (!p.connected->sending(again) && Clock::now() < until) std::this_thread::yield();
  EXPECT_FALSE(p.connected->start_send(third));
  checked = true;
  blocking.join();
  EXPECT_TRUE(p.connected->start_send(third));
  while (!p.connected->poll_send() && Clock::now() < until) {
  }
  receiver.join();
  EXPECT_THROW(p.accepted->recv(nullptr, 300ms), TimeoutError);  // nothing twice
}

// The bytes of a send that timed out belong to the pipe until they are out: the caller may
// drop the dict (its storage freed and handed out again) and the peer still receives what
// was sent, whole, then the next dict. Both for a dict sent from its own storage (a
// consolidated one) and, on a non-consolidated pipe, from its leaves.
// Over shared memory a message bigger than the receiver's FIFO waits at the sender until
// the receiver takes it, and the close message waits behind it: a close that dropped it
// with the endpoint after its 500 ms left a receiver that came later waiting for ever (the
// sender lives, and one host has no heartbeats). The close lingers until it is delivered.
TEST(PipeRuntime, AReceiverThatComesAfterTheSendersCloseIsToldOfIt) {
  PipeOptions o;
  o.liveness_timeout = 3s;  // what bounds a lingering close (the receiver comes at 1.5 s)
  PipeListener listener(0, o);
  std::optional<TensorDictPipe> accepted;
  std::thread t([&] { accepted = listener.accept(20s); });
  TensorDictPipe connected = TensorDictPipe::connect("127.0.0.1", listener.port(), o);
  t.join();
  ASSERT_NE(connected.transports().find("sysv"), std::string::npos)
      << "not over shared memory: " << connected.transports();
  auto bytes = std::make_shared<std::vector<uint8_t>>(size_t{32} << 20);
  auto released = std::make_shared<std::atomic<bool>>(false);
  {
    TensorDict td;
    td.set("x", detail::external_view(bytes->data(), {32 << 20}, {}, DType::UInt8,
                                      [bytes, released] { *released = true; }));
    EXPECT_THROW(connected.send(td, 50ms), TimeoutError);
  }  // dropped: the lingering close holds its storage
  connected.close();
  EXPECT_FALSE(*released);
  std::this_thread::sleep_for(1500ms);  // past the close's own 500 ms
  const auto start = Clock::now();
  try {
    // The message whole (its rest went before the close message), then the close.
    EXPECT_EQ(accepted->recv(nullptr, 20s).get("x").nbytes(), size_t{32} << 20);
    EXPECT_THROW(accepted->recv(nullptr, 20s), ClosedError);
  } catch (const ClosedError& e) {
    EXPECT_NE(std::string(e.what()).find("the peer closed the pipe"), std::string::npos)
        << e.what();
  }
  EXPECT_LT(Clock::now() - start, 10s);
  // The linger ends within its bound and lets go of the message's storage.
  for (int i = 0; i < 500 && !*released; ++i) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(*released);
}

TEST(PipeRuntime, ADictDroppedAfterItsSendTimedOutStillArrivesWhole) {
  for (const bool consolidated : {true, false}) {
    SCOPED_TRACE(consolidated ? "consolidated" : "non-consolidated");
    PipeOptions o;
    o.consolidated = consolidated;
    PipeListener listener(0, o);
    std::optional<TensorDictPipe> accepted;
    std::thread t([&] { accepted = listener.accept(20s); });
    TensorDictPipe connected = TensorDictPipe::connect("127.0.0.1", listener.port(), o);
    t.join();
    {
      TensorDict first = consolidated ? consolidate(big()) : big();
      EXPECT_THROW(connected.send(first, 50ms), TimeoutError);
    }
    // Freed blocks of this size come back from the storage cache: overwrite them.
    std::vector<TensorDict> reuse;
    for (int i = 0; i < 4; ++i) {
      TensorDict td;
      Tensor x = Tensor::empty({1 << 20}, DType::Float64);
      std::fill_n(x.data<double>(), 1 << 20, -1.0);
      td.set("x", x);
      reuse.push_back(consolidated ? consolidate(td) : td);
    }
    std::thread receiver([&] {
      TensorDict got = accepted->recv(nullptr, 20s);
      const double* x = got.get("x").data<double>();
      size_t wrong = 0;
      for (size_t i = 0; i < (1u << 20); ++i) wrong += x[i] != static_cast<double>(i);
      EXPECT_EQ(wrong, 0u);
      EXPECT_EQ(accepted->recv(nullptr, 20s).get("v").data<float>()[0], 9.f);
    });
    connected.send(small(9.f), 20s);
    receiver.join();
  }
}

// A PipeListener or a TensorDictServer (the two tests below run with each), and a client
// that connects and never says a word, on a thread of its own until the end of the scope.
struct AcceptorWithASilentClient {
  std::optional<PipeListener> listener;
  std::optional<TensorDictServer> server;
  std::atomic<bool> stop{false};
  std::thread silent;

  explicit AcceptorWithASilentClient(bool is_server) {
    PipeOptions o;
    o.connect_timeout = std::chrono::seconds(60);
    if (is_server)
      server.emplace(0, o);
    else
      listener.emplace(0, o);
    silent = std::thread([this, p = port()] {
      ucx::Worker w;
      ucx::Endpoint ep(w, "127.0.0.1", p);
      while (!stop.load()) w.progress();
    });
  }
  ~AcceptorWithASilentClient() {
    stop = true;
    silent.join();
  }
  uint16_t port() const { return server ? server->port() : listener->port(); }
  std::optional<TensorDictPipe> accept(Timeout t) {
    return server ? server->accept(t) : listener->accept(t);
  }
  void close() { server ? server->close() : listener->close(); }
};

// close() while another thread's accept() is in a client's handshake (a client that
// connects and never says a word): the accept ends at once with ClosedError, and the
// listener's connection request, still in use by that handshake, is not freed under it
// (that was a crash, or a spin for ever in UCX, for a server closed during a handshake).
TEST(PipeRuntime, ClosingDuringAClientsHandshakeEndsTheAcceptAtOnce) {
  for (const bool server : {false, true}) {
    SCOPED_TRACE(server ? "TensorDictServer" : "PipeListener");
    AcceptorWithASilentClient a(server);
    std::thread closer([&] {
      std::this_thread::sleep_for(500ms);
      a.close();
    });
    const auto start = Clock::now();
    EXPECT_THROW(a.accept(30s), ClosedError);
    EXPECT_LT(Clock::now() - start, 10s);  // the handshake's own limit is 60 s
    closer.join();
  }
}

// Each client's handshake runs on its own: one that connects and says nothing (a stalled,
// slow or hostile process) holds up nobody else until its connect timeout, for a listener
// as for a server. Before, accept() ran one handshake at a time and the next client waited
// the silent one's whole timeout (here 60 s).
TEST(PipeRuntime, AClientSilentInItsHandshakeHoldsUpNoOtherClient) {
  for (const bool server : {false, true}) {
    SCOPED_TRACE(server ? "TensorDictServer" : "PipeListener");
    AcceptorWithASilentClient a(server);
    // The silent client's request is taken (its handshake started) before the next client.
    EXPECT_FALSE(a.accept(300ms));
    std::thread honest([&] {
      try {
        TensorDictPipe::connect("127.0.0.1", a.port(), {.connect_timeout = 20s}).send(small(7.f));
      } catch (const Error& e) {
        ADD_FAILURE() << "the other client: " << e.what();
      }
    });
    std::optional<TensorDictPipe> pipe = a.accept(20s);
    EXPECT_TRUE(pipe);
    if (pipe) {
      EXPECT_EQ(pipe->recv(nullptr, 20s).get("v").data<float>()[0], 7.f);
    }
    honest.join();
    // Closing ends the silent handshake at once (its thread is joined).
    const auto start = Clock::now();
    a.close();
    EXPECT_LT(Clock::now() - start, 10s);
  }
}

// More clients at once than one accept() step starts handshakes for (kStartsPerCall): the
// rest are started by the next steps without waiting for a wake-up, and all get in.
TEST(PipeRuntime, ManyClientsConnectingAtOnceAreAllAccepted) {
  TensorDictServer server(0);
  constexpr int kClients = 10;
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      try {
        TensorDictPipe::connect("127.0.0.1", server.port(), {.connect_timeout = 30s})
            .send(small(static_cast<float>(i)));
      } catch (const Error& e) {
        ADD_FAILURE() << "client " << i << ": " << e.what();
      }
    });
  std::vector<bool> seen(kClients, false);
  for (int i = 0; i < kClients; ++i) {
    std::optional<TensorDictPipe> pipe = server.accept(30s);
    if (!pipe) {
      ADD_FAILURE() << "only " << i << " clients accepted";
      break;
    }
    seen[static_cast<size_t>(pipe->recv(nullptr, 20s).get("v").data<float>()[0])] = true;
  }
  for (auto& c : clients) c.join();
  EXPECT_EQ(std::count(seen.begin(), seen.end(), true), kClients);
  EXPECT_EQ(server.refused(), 0u);
}

// 64 KiB of `i`, sent eagerly (UCX copies it into the peer's shared-memory FIFO).
TensorDict eager(uint8_t i) {
  TensorDict td;
  td.set("x", Tensor::from_vector<uint8_t>(std::vector<uint8_t>(64 * 1024, i), {64 * 1024}));
  return td;
}

struct ThreadUsage {
  double cpu_s;
  long voluntary_switches;
};
ThreadUsage thread_usage() {
  struct rusage r {};
  ::getrusage(RUSAGE_THREAD, &r);
  return {static_cast<double>(r.ru_utime.tv_sec + r.ru_stime.tv_sec) +
              static_cast<double>(r.ru_utime.tv_usec + r.ru_stime.tv_usec) / 1e6,
          r.ru_nvcsw};
}

// A peer that does not receive: eager sends fill its FIFO, then a send waits for room that
// UCX frees without a signal (and will not arm the worker meanwhile). The sender sleeps in
// that wait (voluntary context switches; little CPU) instead of polling for it, and
// everything arrives in order once the peer receives.
TEST(PipeRuntime, ASendStalledOnAPeerThatDoesNotReceiveSleepsAndResumes) {
  // A FIFO (256 elements of 8 KiB by default) smaller than what a sender may send ahead
  // (kUnmatchedBytes), so that the FIFO fills before the acknowledgement is waited for.
  ::setenv("UCX_MM_FIFO_SIZE", "64", 1);
  Pair p;
  std::vector<TensorDict> sent;
  for (int i = 0; i < 1000; ++i) {
    sent.push_back(eager(static_cast<uint8_t>(i)));
    try {
      p.connected->send(sent.back(), Timeout::poll());
    } catch (const TimeoutError&) {
      break;  // stalled: this one is still in flight
    }
  }
  ASSERT_LT(sent.size(), 1000u) << "sends never waited for the peer";
  const ThreadUsage before = thread_usage();
  const auto start = Clock::now();
  EXPECT_THROW(p.connected->send(sent.back(), 300ms), TimeoutError);
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const ThreadUsage after = thread_usage();
  EXPECT_GE(after.voluntary_switches - before.voluntary_switches, 10)
      << "the stalled send never slept";
  EXPECT_LT(after.cpu_s - before.cpu_s, 0.5 * wall) << "the stalled send kept a CPU busy";

  std::thread receiver([&] {
    for (size_t i = 0; i < sent.size(); ++i) {
      TensorDict& got = p.accepted->recv(nullptr, 20s);
      ASSERT_EQ(got.get("x").data<uint8_t>()[64 * 1024 - 1], static_cast<uint8_t>(i))
          << "message " << i;
    }
  });
  p.connected->send(sent.back(), 20s);  // completes the one in flight
  receiver.join();
  EXPECT_THROW(p.accepted->recv(nullptr, 100ms), TimeoutError);  // each arrived once
}

// How far a sender runs ahead of a receiver slower than itself (kUnmatchedBytes): about a
// MiB of 64 KiB messages, 256 small ones. Before, each receive's progress took whatever had
// come into UCX's unexpected queue, so a slow receiver freed its FIFO for the sender at once
// and held every message not asked for yet (a TensorDictServer grew by GiBs). Each arrives
// once, in order.
TEST(PipeRuntime, ASenderRunsAtMostAMebibyteOrTwoHundredFiftySixMessagesAhead) {
  for (const bool large : {true, false}) {
    SCOPED_TRACE(large ? "64 KiB messages" : "small messages");
    Pair p;
    const size_t n = large ? 120 : 1200;
    const size_t bound = large ? detail::kUnmatchedBytes / (64 * 1024) : detail::kUnmatchedMessages;
    std::atomic<size_t> sent{0};
    std::thread sender([&] {
      for (size_t i = 0; i < n; ++i) {
        p.connected->send(large ? eager(static_cast<uint8_t>(i)) : small(static_cast<float>(i)),
                          20s);
        sent.store(i + 1);
      }
    });
    size_t ahead = 0;
    bool in_order = true;
    for (size_t i = 0; i < n && in_order; ++i) {
      if (i % (large ? 1 : 10) == 0) {
        // Slower than the sender: a pause, then (where sends are slow: a TSan build) up to
        // 50 ms more until the sender is a few messages ahead.
        std::this_thread::sleep_for(2ms);
        for (const auto until = std::chrono::steady_clock::now() + 50ms;
             sent.load() < std::min(i + 3, n) && std::chrono::steady_clock::now() < until;)
          std::this_thread::sleep_for(1ms);
      }
      TensorDict& got = p.accepted->recv(nullptr, 20s);
      in_order = large ? got.get("x").data<uint8_t>()[64 * 1024 - 1] == static_cast<uint8_t>(i)
                       : got.get("v").data<float>()[1] == static_cast<float>(i);
      EXPECT_TRUE(in_order) << "message " << i;
      // Sent and returned, not received yet (this one counted as received); read once: the
      // sender may count its next one meanwhile.
      const size_t s = sent.load();
      ahead = std::max(ahead, s > i + 1 ? s - (i + 1) : 0);
    }
    if (!in_order) p.connected->close();  // ends the sender's wait
    sender.join();
    // The message that reaches the bound is sent synchronously: its send returns once the
    // receiver matched it, and the sender is then at most bound - 1 messages ahead.
    EXPECT_LE(ahead, bound);
    EXPECT_GE(ahead, 2u) << "the sender never ran ahead: the test measured nothing";
    EXPECT_THROW(p.accepted->recv(nullptr, 100ms), TimeoutError);  // each arrived once
  }
}

// A close while a message sent synchronously waits for the receiver's match (its send timed
// out): the close returns at once, and a receiver that comes later gets every message, then
// ClosedError. (The close lingers until the match rather than closing by force, which can
// reset a TCP connection under bytes just sent; this run over TCP lost nothing either way.)
TEST(PipeRuntime, ACloseWithAnUnmatchedSynchronousSendLosesNoMessage) {
  ::setenv("UCX_TLS", "tcp", 1);
  Pair p;
  size_t sent = 0;
  for (; sent < detail::kUnmatchedMessages; ++sent) {
    try {
      p.connected->send(small(static_cast<float>(sent)), 200ms);
    } catch (const TimeoutError&) {
      ++sent;  // the synchronous one, in flight
      break;
    }
  }
  ASSERT_EQ(sent, detail::kUnmatchedMessages);
  const auto t0 = Clock::now();
  p.connected->close();
  EXPECT_LT(Clock::now() - t0, 2s) << "close() waited for the receiver";
  std::this_thread::sleep_for(300ms);  // the receiver comes later
  for (size_t i = 0; i < sent; ++i)
    ASSERT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], static_cast<float>(i))
        << "message " << i;
  EXPECT_THROW(p.accepted->recv(nullptr, 20s), ClosedError);
}

TEST(PipeRuntime, AnInterruptEndsABlockingRecvWithinASliceAndThePipeStaysUsable) {
  Pair p;
  auto took = interrupted_after(200ms, [&] { p.accepted->recv(); });
  EXPECT_LT(took, 1s);
  p.connected->send(small(2.f), 20s);
  EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 2.f);
}

TEST(PipeRuntime, AnInterruptEndsABlockingAcceptAndTheListenerStillAccepts) {
  TensorDictServer server(0);
  auto took = interrupted_after(200ms, [&] { server.accept(); });
  EXPECT_LT(took, 1s);
  std::thread client([&] { TensorDictPipe::connect("127.0.0.1", server.port()).send(small(1.f)); });
  auto pipe = server.accept(20s);
  ASSERT_TRUE(pipe);
  EXPECT_EQ(pipe->recv(nullptr, 20s).get("v").data<float>()[0], 1.f);
  client.join();
}

TEST(PipeRuntime, ZeroPollsOnceAndNegativeTimeoutsAreRefused) {
  Pair p;
  const auto start = Clock::now();
  EXPECT_THROW(p.accepted->recv(nullptr, Timeout::poll()), TimeoutError);
  EXPECT_FALSE(p.listener.accept(Timeout::poll()));
  EXPECT_LT(Clock::now() - start, 1s);
  EXPECT_THROW(p.accepted->recv(nullptr, -1ms), ValueError);
}

TEST(PipeRuntime, NothingListeningIsConnectionRefusedNamingHostAndPort) {
  uint16_t port;
  {
    PipeListener l(0);
    port = l.port();
  }
  try {
    TensorDictPipe::connect("127.0.0.1", port);
    FAIL() << "connected to a closed port";
  } catch (const ConnectionRefused& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(port)), std::string::npos);
  }
}

// A moved-from pipe crashed (a null implementation) in any method.
TEST(PipeRuntime, AMovedFromPipeIsClosed) {
  Pair p;
  TensorDictPipe taken = std::move(*p.accepted);
  EXPECT_TRUE(p.accepted->closed());
  EXPECT_TRUE(p.accepted->failed());  // the queries answer (they threw ClosedError)
  EXPECT_FALSE(p.accepted->closed_by_peer());
  EXPECT_THROW(p.accepted->send(small(1), 1s), ClosedError);
  EXPECT_THROW(p.accepted->recv(nullptr, 1s), ClosedError);
  EXPECT_THROW(p.accepted->recv_async(1s), ClosedError);
  EXPECT_NO_THROW(p.accepted->close());
  p.connected->send(small(3), 5s);
  EXPECT_EQ(taken.recv(nullptr, 5s).get("v").at<float>({0}), 3);
}

// Like every blocking call, listen() takes a timeout (it waited for ever).
TEST(PipeRuntime, ListenEndsAtItsTimeoutWhenNoClientComes) {
  uint16_t port = 0;
  try {
    TensorDictPipe::listen(
        0, {}, [&](uint16_t p) { port = p; }, 100ms);
    FAIL() << "listen() returned without a client";
  } catch (const TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("port " + std::to_string(port)), std::string::npos)
        << e.what();
  }
}

TEST(PipeRuntime, ANegativeLivenessTimeoutIsAValueErrorWhereTheOptionsAreTaken) {
  EXPECT_THROW(PipeListener(0, {.liveness_timeout = -1ms}), ValueError);
  EXPECT_THROW(TensorDictPipe::connect("127.0.0.1", 1, {.liveness_timeout = -1ms}), ValueError);
}

// Something listens, takes the connection and gives up on its handshake at once (its
// timeout 0): the client is told the connection ended, not that nothing listens there.
TEST(PipeRuntime, AServerThatEndsTheHandshakeEarlyIsNotCalledARefusal) {
  PipeListener listener(0, {.connect_timeout = 0ms});
  std::atomic<bool> done{false};
  std::thread server([&] {
    const auto until = Clock::now() + 10s;
    while (!done && Clock::now() < until) {
      try {
        listener.accept(100ms);
      } catch (const Error&) {
      }
    }
  });
  try {
    TensorDictPipe::connect("127.0.0.1", listener.port(), {.connect_timeout = 10s});
    ADD_FAILURE() << "connected through a handshake the server gave up";
  } catch (const ConnectionRefused& e) {
    ADD_FAILURE() << "called a refusal: " << e.what();
  } catch (const ClosedError& e) {
    // Before the wire-up completed ("ended before the server took it up") or after ("lost").
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(listener.port())),
              std::string::npos)
        << e.what();
  }
  done = true;
  server.join();
}

// A client that starts a control frame larger than any (1 MiB: a rendezvous, whose data
// comes only as the client progresses) and then stops: a hostile client, a SIGSTOP, a link
// cut. The listener refuses it without allocating what the frame announces, and neither
// accept() nor close() waits for the rest (both did, for ever).
TEST(PipeRuntime, AClientThatStopsInTheMiddleOfAnOversizedHandshakeFrameHoldsNothing) {
  ::setenv("UCX_TLS", "tcp", 1);  // over TCP the rendezvous needs the sender
  PipeListener listener(0, {.connect_timeout = 2s});
  std::promise<std::optional<TensorDictPipe>> accepted;
  auto got = accepted.get_future();
  std::thread acceptor([&] {
    try {
      accepted.set_value(listener.accept(4s));
    } catch (...) {
      accepted.set_exception(std::current_exception());
    }
  });
  ucx::Worker worker;
  ucx::Endpoint ep(worker, "127.0.0.1", listener.port());
  ucx::Request flushed = ep.flush();
  for (auto until = Clock::now() + 5s; !flushed.done() && Clock::now() < until;) worker.progress();
  std::vector<std::byte> frame(1 << 20);
  // The client moves its worker until the listener has seen the rendezvous' announcement
  // and refused it by its size alone (it never asks for the data, so none moves). A fixed
  // 20 progress calls did not always send the announcement on a loaded machine: the
  // listener then saw nothing and refused "handshake timed out". From here on the client
  // does nothing.
  ucx::Request sent = ep.send(detail::kControlTag, frame);
  for (auto until = Clock::now() + 10s; listener.refused() == 0 && Clock::now() < until;)
    worker.progress();
  if (got.wait_for(10s) != std::future_status::ready) {
    ADD_FAILURE() << "accept() still waits for the rest of the frame";
    std::fflush(nullptr);
    std::_Exit(1);  // the acceptor cannot be joined
  }
  acceptor.join();
  EXPECT_FALSE(got.get().has_value());
  EXPECT_EQ(listener.refused(), 1u);
  EXPECT_NE(listener.last_refusal().find("control"), std::string::npos) << listener.last_refusal();
  const auto start = Clock::now();
  listener.close();
  EXPECT_LT(Clock::now() - start, 2s);
  sent.cancel(worker.handle());
}

// A future's destructor waits for its operation (std::async): a timeout bounds it, and a
// close() from another thread ends it.
TEST(PipeRuntime, AsyncFormsEndAtTheirTimeoutOrWhenThePipeCloses) {
  Pair p;
  auto timed = p.connected->recv_async(200ms);
  ASSERT_EQ(timed.wait_for(5s), std::future_status::ready);
  EXPECT_THROW(timed.get(), TimeoutError);
  auto pending = p.connected->recv_async();
  EXPECT_EQ(pending.wait_for(100ms), std::future_status::timeout);
  p.connected->close();
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  EXPECT_THROW(pending.get(), ClosedError);
  auto refused = p.connected->send_async(small(1.f), 1s);
  ASSERT_EQ(refused.wait_for(5s), std::future_status::ready);
  EXPECT_THROW(refused.get(), ClosedError);
  // To a peer that closed: sent into UCX's buffers or failed, either way in time.
  auto sent = p.accepted->send_async(small(2.f), 5s);
  ASSERT_EQ(sent.wait_for(10s), std::future_status::ready);
  try {
    sent.get();
  } catch (const ClosedError&) {
  }
}

// A receive that timed out after it matched the peer's rendezvous (a sender that started
// a large send and then stopped moving it: busy elsewhere, or an event loop that dropped the
// send): closing and destroying either end ends it. Destroying the receiving end aborted
// the process in UCX ("proto_reqs" not empty).
TEST(PipeRuntime, APipeWhoseReceiveTimedOutInTheMiddleOfARendezvousClosesCleanly) {
  for (const bool receiver_first : {true, false}) {
    Pair p;
    const TensorDict td = big();
    (void)p.connected->start_send(td);
    EXPECT_THROW((void)p.accepted->recv(nullptr, 300ms), TimeoutError);
    (void)p.connected->poll_send();  // the announcement goes; the data never moves after it
    EXPECT_THROW((void)p.accepted->recv(nullptr, 300ms), TimeoutError);
    const auto start = Clock::now();
    std::optional<TensorDictPipe>& first = receiver_first ? p.accepted : p.connected;
    std::optional<TensorDictPipe>& second = receiver_first ? p.connected : p.accepted;
    first->close();
    first.reset();
    second->close();
    second.reset();
    EXPECT_LT(Clock::now() - start, 5s);
  }
}

// Assigning over a pipe closes it, as destroying it does: a pending recv_async of the pipe
// replaced ended never (its future held it open, and nothing could close it).
TEST(PipeRuntime, MoveAssigningOverAPipeClosesIt) {
  Pair p, q;
  auto pending = p.connected->recv_async();
  *p.connected = std::move(*q.connected);
  ASSERT_EQ(pending.wait_for(5s), std::future_status::ready);
  EXPECT_THROW(pending.get(), ClosedError);
  p.accepted.reset();            // the other end of the closed pipe
  q.accepted->send(small(3.f));  // the pipe moved in works
  EXPECT_EQ(p.connected->recv(nullptr, 5s).get("v").data<float>()[0], 3.f);
}

// A listener and a server can be returned by value (a factory) and assigned: assigning
// over one closes it; a moved-from one is closed and says so.
PipeListener listener_on_any_port() {
  PipeListener l(0);
  return l;
}

TEST(PipeRuntime, ListenersAndServersMoveAndAssigningOverOneClosesIt) {
  PipeListener listener = listener_on_any_port();
  PipeListener moved = std::move(listener);
  EXPECT_TRUE(listener.closed());
  EXPECT_THROW((void)listener.accept(10ms), ClosedError);
  EXPECT_NO_THROW(listener.close());
  const uint16_t port = moved.port();
  std::thread client([port] { (void)TensorDictPipe::connect("127.0.0.1", port); });
  EXPECT_TRUE(moved.accept(20s).has_value());
  client.join();
  moved = PipeListener(0);  // the first listener closes: its port is free again
  EXPECT_NO_THROW(PipeListener again(port));

  TensorDictServer server(0);
  const uint16_t server_port = server.port();
  TensorDictServer taken = std::move(server);
  EXPECT_TRUE(server.closed());
  EXPECT_THROW((void)server.accept(10ms), ClosedError);
  EXPECT_EQ(taken.port(), server_port);
  taken = TensorDictServer(0);
  EXPECT_NO_THROW(TensorDictServer again(server_port));
}

TEST(PipeRuntime, ASecondListenerOnABusyPortIsPortInUse) {
  PipeListener first(0);
  try {
    PipeListener second(first.port());
    FAIL() << "two listeners on one port";
  } catch (const PortInUse& e) {
    EXPECT_EQ(e.port(), first.port());
    EXPECT_NE(std::string(e.what()).find("is in use"), std::string::npos);
  }
}

TEST(PipeRuntime, ClosedObjectsThrowClosedError) {
  Pair p;
  p.accepted->close();
  EXPECT_THROW(p.accepted->send(small(1.f)), ClosedError);
  EXPECT_THROW(p.accepted->recv(), ClosedError);
  EXPECT_THROW(p.connected->recv(nullptr, 20s), ClosedError);
  EXPECT_TRUE(p.connected->closed_by_peer());
  p.listener.close();
  EXPECT_TRUE(p.listener.closed());
  EXPECT_THROW(p.listener.accept(1s), ClosedError);
  TensorDictServer server(0);
  server.close();
  EXPECT_THROW(server.accept(1s), ClosedError);
}

TEST(PipeRuntime, AForkedChildRefusesInheritedObjectsExitsCleanlyAndTheParentGoesOn) {
  Pair p;
  const int code = in_forked_child([&] {
    try {
      p.connected->send(small(1.f), 1s);
      return 10;
    } catch (const ClosedError& e) {
      if (std::string(e.what()).find("forked child") == std::string::npos) return 11;
    }
    try {
      p.listener.accept(1s);
      return 12;
    } catch (const ClosedError& e) {
      if (std::string(e.what()).find("forked child") == std::string::npos) return 13;
    }
    // Destroying inherited objects leaves the parent's UCX state alone.
    TensorDictPipe moved = std::move(*p.accepted);
    moved.close();
    return 0;
  });
  EXPECT_EQ(code, 0);
  p.connected->send(small(3.f), 20s);
  EXPECT_EQ(p.accepted->recv(nullptr, 20s).get("v").data<float>()[0], 3.f);
}

// A child forked while a handshake runs on a thread of the parent's listener: that thread
// does not exist in the child, so closing the inherited listener there leaves it alone
// (joining it waited for ever), as its destruction does.
TEST(PipeRuntime, AChildForkedDuringAHandshakeClosesItsInheritedListenerAtOnce) {
  for (const bool server : {false, true}) {
    SCOPED_TRACE(server ? "TensorDictServer" : "PipeListener");
    AcceptorWithASilentClient a(server);
    EXPECT_FALSE(a.accept(300ms));  // the silent client's handshake has started
    const int code = in_forked_child([&] {
      ::alarm(20);  // a hang ends the child (128 + SIGALRM)
      try {
        a.accept(1s);
        return 10;
      } catch (const ClosedError&) {
      }
      a.close();
      return 0;
    });
    EXPECT_EQ(code, 0);
    EXPECT_FALSE(a.accept(100ms));  // the parent's listener goes on
  }
}

TEST(PipeRuntime, AChildThatOnlyExitsLeavesTheParentsPipesWorking) {
  Pair p;
  EXPECT_EQ(in_forked_child([] { return 0; }), 0);
  p.accepted->send(small(4.f), 20s);
  EXPECT_EQ(p.connected->recv(nullptr, 20s).get("v").data<float>()[0], 4.f);
}

namespace {

// The child of the two tests below: starts UCX (or fails at once saying why) and connects
// to a port nothing listens on. 0 when that ends in an Error; a child that waits for ever
// dies of SIGALRM (code 142).
int connect_to_a_closed_port() {
  ::alarm(10);
  try {
    TensorDictPipe::connect("127.0.0.1", 1, {.connect_timeout = 2s});
    return 30;
  } catch (const Error&) {
    return 0;
  }
}

// Once UCX has started in a process, its memory hooks (libucm) hold a lock for reading in
// every mmap() and munmap() of any thread. A fork() meanwhile copies that lock held into the
// child, by a thread that does not exist there, and a child that starts UCX (no context was
// alive at the fork) must not wait for it: ucp_init used to register a handler, which takes
// it exclusively, and hung (6% of the forks of the test below). Here a handler of the test
// holds one munmap() inside the hook while the main thread forks.
namespace hook {
std::atomic<void*> region{nullptr};
std::atomic<int> phase{0};  // 1: the munmap of `region` is inside the hook; 2: the fork is done
void hold(ucm_event_type_t, ucm_event_t* event, void*) {
  if (event->vm_unmapped.address != region.load()) return;
  phase = 1;
  while (phase.load() != 2) std::this_thread::yield();
}
}  // namespace hook

}  // namespace

TEST(PipeRuntime, AChildForkedDuringAnotherThreadsMunmapStartsUcxAfresh) {
  { PipeListener started(0); }  // UCX started here (hooks installed); no context alive after
  const size_t size = 1 << 20;
  void* region = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(region, MAP_FAILED);
  hook::region = region;
  hook::phase = 0;
  // With UCX's memory events off (UCX_MEM_EVENTS=no) there is no hook to be inside: the
  // munmap goes straight through and the fork below only checks the child's start.
  const bool hooked =
      ucm_set_event_handler(UCM_EVENT_VM_UNMAPPED, 0, &hook::hold, nullptr) == UCS_OK;
  std::thread unmapper([&] { ::munmap(region, size); });
  while (hooked && hook::phase.load() != 1) std::this_thread::yield();
  const int code = in_forked_child(connect_to_a_closed_port);
  hook::phase = 2;
  unmapper.join();
  if (hooked) ucm_unset_event_handler(UCM_EVENT_VM_UNMAPPED, &hook::hold, nullptr);
  EXPECT_EQ(code, 0);
}

// libucm's own lock functions (exported by UCX 1.13, in no installed header).
extern "C" {
void ucm_event_enter_exclusive() __attribute__((weak));
void ucm_event_leave() __attribute__((weak));
}

// A thread adding or removing a memory-event handler (ucp_init, or ucp_cleanup as another
// thread's last pipe closes) holds libucm's lock for writing. A fork() meanwhile must wait
// for it: a child that got the lock copied held would wait for ever in its first mmap()
// under the hooks (before the fix: this child died of its SIGALRM). Here a thread of the test
// holds the lock for 300 ms while the main thread forks.
TEST(PipeRuntime, AChildForkedWhileAThreadWritesUcxsEventLockDoesNotHang) {
  ASSERT_TRUE(ucm_event_enter_exclusive != nullptr && ucm_event_leave != nullptr)
      << "this UCX does not export libucm's event lock";
  { PipeListener started(0); }  // UCX started here (hooks installed); no context alive after
  std::atomic<bool> held{false};
  std::thread writer([&] {
    ucm_event_enter_exclusive();
    held = true;
    std::this_thread::sleep_for(300ms);
    ucm_event_leave();
  });
  while (!held.load()) std::this_thread::yield();
  const int code = in_forked_child([] {
    ::alarm(10);
    const size_t size = 1 << 20;
    void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 40;
    ::munmap(p, size);
    return connect_to_a_closed_port();
  });
  writer.join();
  EXPECT_EQ(code, 0);
}

// ctest runs each test in a process of its own: the thread below starts the process's UCX
// (ucp_init takes milliseconds), and the fork lands while it runs. The child must not
// wait for ever on what that thread held (it used to, on the context's mutex): it fails at
// once (UCX was in use at the fork) or starts UCX afresh (it was not yet); either way its
// connect to a closed port fails with an Error.
TEST(PipeRuntime, AChildForkedWhileAnotherThreadStartsUcxDoesNotWaitForIt) {
  std::atomic<bool> starting{false};
  std::thread starter([&] {
    starting = true;
    PipeListener listener(0);
  });
  while (!starting) {
  }
  EXPECT_EQ(in_forked_child(connect_to_a_closed_port), 0);
  starter.join();
}

TEST(PipeRuntime, ANewPipeInAChildForkedWhileUcxWasInUseFailsAtOnceSayingWhy) {
  Pair p;
  const uint16_t port = p.listener.port();
  EXPECT_EQ(in_forked_child([port] {
              const auto start = Clock::now();
              try {
                TensorDictPipe::connect("127.0.0.1", port);
                return 20;
              } catch (const Error& e) {
                if (std::string(e.what()).find("spawn") == std::string::npos) return 21;
              }
              return Clock::now() - start < 2s ? 0 : 22;
            }),
            0);
}

TEST(PipeRuntime, LimitsOfZeroAreRefusedBeforeAnythingListensOrConnects) {
  PipeOptions o;
  o.limits.max_message_bytes = 0;
  EXPECT_THROW(PipeListener(0, o), ValueError);
  EXPECT_THROW(TensorDictServer(0, o), ValueError);
  EXPECT_THROW(TensorDictPipe::connect("127.0.0.1", 1, o), ValueError);
  o.limits.max_message_bytes = 1;
  o.limits.max_metadata_bytes = 0;
  EXPECT_THROW(PipeListener(0, o), ValueError);
}

// A listener's reports are logged once it let go of its lock: Python's logging takes the
// GIL, and a Python thread that holds the GIL may be waiting for that lock (reading
// `listener.closed`): the process froze. Here the log handler itself looks at the listener,
// which would hang on a lock held by its own thread. The report comes from a client the
// listener has no descriptors for, and that client is refused at once (not at its timeout).
namespace {
PipeListener* g_looked_at = nullptr;
std::mutex g_reports_mu;
std::vector<std::string> g_reports;

void report_and_look(LogLevel, const std::string& message) {
  (void)g_looked_at->closed();  // takes the listener's lock
  std::lock_guard<std::mutex> lock(g_reports_mu);
  g_reports.push_back(message);
}
}  // namespace

TEST(PipeRuntime, AListenersReportIsLoggedOutsideItsLockAndTheClientRefusedAtOnce) {
  PipeListener listener(0);
  g_looked_at = &listener;
  test_support::PeerProcess client(
      {PIPE_PEER, "send", "127.0.0.1", std::to_string(listener.port()), "1"});
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_NOFILE, &saved), 0);
  rlimit low = saved;
  low.rlim_cur = saved.rlim_cur - os::free_fds().value() + 20;  // too few for a UCX worker
  ASSERT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  set_log_handler(&report_and_look);
  const auto t0 = std::chrono::steady_clock::now();
  while (listener.refused() == 0 && std::chrono::steady_clock::now() - t0 < 30s)
    EXPECT_FALSE(listener.accept(200ms).has_value());
  set_log_handler(nullptr);
  ::setrlimit(RLIMIT_NOFILE, &saved);
  EXPECT_EQ(client.exit_code(), 3);  // pipe_peer's exit for an error: the refusal
  EXPECT_NE(client.stderr_text().find("refused the connection"), std::string::npos)
      << client.stderr_text();
  std::lock_guard<std::mutex> lock(g_reports_mu);
  ASSERT_EQ(g_reports.size(), 1u);
  EXPECT_NE(g_reports[0].find("could not make its end"), std::string::npos) << g_reports[0];
  EXPECT_NE(g_reports[0].find("RLIMIT_NOFILE"), std::string::npos) << g_reports[0];
}
