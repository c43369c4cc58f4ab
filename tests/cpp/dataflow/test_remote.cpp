// send_dataflow_zmq / RemoteDataZMQ over tcp:// on the loopback, with a producer process.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <zmq.hpp>
#include <zmq_addon.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>

#include <algorithm>
#include <mutex>
#include <thread>

#include "dataflow/raw_datapoint.h"
#include "flows.h"
#include "tensorwire/dataflow/remote.h"
#include "tensorwire/runtime/interrupt.h"
#include "tensorwire/runtime/log.h"
#include "tensorwire/wire/datapoint.h"
#include "tensorwire/wire/encoder.h"

namespace tensorwire::dataflow {
namespace {

using namespace std::chrono_literals;
using testing::counting;
using ::testing::HasSubstr;
using testing::index_of;

// A free TCP port on the loopback (bound and released: the receiver binds it next).
//
// Producers are forked before the receiver creates its ZeroMQ context: a process with
// threads must not fork a child that starts threads of its own (ThreadSanitizer refuses,
// and rightly). They connect to the port and ZeroMQ retries until the receiver is there.
std::string free_tcp_address() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw SystemError("a free port", errno);
  ::close(fd);
  return "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
}

// Forks a producer that sends `n` datapoints of `ds` to `addr`, then exits.
int spawn_producer(const std::string& addr, std::shared_ptr<DataFlow> ds, uint64_t n) {
  const int pid = ::fork();
  if (pid == 0) {
    int code = 0;
    try {
      send_dataflow_zmq(*ds, addr, {.max_datapoints = n});
    } catch (...) {
      code = 1;
    }
    ::_exit(code);
  }
  return pid;
}

int wait_exit(int pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

TEST(Remote, AProducerProcessFeedsAReceiverOverTcp) {
  const std::string addr = free_tcp_address();
  const int pid = spawn_producer(addr, counting(10, 3000), 25);
  RemoteDataZMQ recv(addr);
  recv.reset_state();
  EXPECT_EQ(recv.endpoint(0), addr);
  for (int which : {-1, 2, 1000000}) {  // read past the two addresses before
    EXPECT_THROW(recv.endpoint(which), IndexError) << which;
    EXPECT_THROW(recv.count(which), IndexError) << which;
  }
  for (int64_t i = 0; i < 25; ++i) {
    auto dp = recv.next(10s);
    ASSERT_TRUE(dp) << "datapoint " << i;
    EXPECT_EQ(index_of(*dp), i % 10);  // one producer: in order, pass after pass
    EXPECT_TRUE(testing::datapoint_ok(*dp));
    EXPECT_EQ(dp->get_non_tensor("name"), Json("dp"));
  }
  EXPECT_EQ(wait_exit(pid), 0);
  EXPECT_EQ(recv.count(0), 25u);
  EXPECT_FALSE(recv.next(100ms));
}

TEST(Remote, AMalformedMessageIsRejectedAndTheStreamGoesOn) {
  const std::string good_addr = free_tcp_address(), rogue_addr = free_tcp_address();
  const int pid = spawn_producer(good_addr, counting(std::nullopt, 64), 40);
  RemoteDataZMQ recv(good_addr, rogue_addr);
  recv.reset_state();
  // A rogue sender on the second address: garbage, a truncated storage, a lone frame.
  zmq::context_t ctx;
  zmq::socket_t rogue(ctx, zmq::socket_type::push);
  rogue.set(zmq::sockopt::linger, 1000);
  rogue.connect(rogue_addr);
  {
    std::array<zmq::message_t, 3> junk = {zmq::message_t(std::string(40, 'x')),
                                          zmq::message_t(std::string("{}")),
                                          zmq::message_t(std::string("abc"))};
    zmq::send_multipart(rogue, junk);
    wire::Encoder enc(wire::Mode::Consolidated);
    const wire::OutMessage& m = enc.encode(testing::make_datapoint(1, 100));
    std::array<zmq::message_t, 3> truncated = {
        zmq::message_t(m.header_bytes.data(), m.header_bytes.size()),
        zmq::message_t(m.metadata.data(), m.metadata.size()),
        zmq::message_t(m.payload[0].data(), m.payload[0].size() - 1)};
    zmq::send_multipart(rogue, truncated);
    rogue.send(zmq::str_buffer("lonely"), zmq::send_flags::none);
  }
  uint64_t good = 0;
  std::vector<std::string> errors;
  while (good < 40) {
    try {
      auto dp = recv.next(10s);
      ASSERT_TRUE(dp);
      EXPECT_EQ(index_of(*dp), static_cast<int64_t>(good));
      ++good;
    } catch (const ProtocolError& e) {
      errors.push_back(e.what());
    }
  }
  EXPECT_EQ(wait_exit(pid), 0);
  // The rogue's messages travel on their own connection: they may still be on the way.
  while (errors.size() < 3) {
    try {
      if (!recv.next(5s)) break;
      ADD_FAILURE() << "no datapoint was sent after the 40th";
    } catch (const ProtocolError& e) {
      errors.push_back(e.what());
    }
  }
  ASSERT_EQ(errors.size(), 3u);
  for (const auto& e : errors) EXPECT_THAT(e, HasSubstr(recv.endpoint(1)));
  EXPECT_THAT(errors[0], HasSubstr("invalid frame header"));
  EXPECT_THAT(errors[1], HasSubstr("storage frame of"));
  EXPECT_THAT(errors[2], HasSubstr("expected 3 frames"));
  EXPECT_EQ(recv.rejected(), 3u);
  EXPECT_EQ(recv.count(0), 40u);
  EXPECT_EQ(recv.count(1), 0u);
}

// The three frames of one message.
std::array<zmq::message_t, 3> frames_of(const wire::OutMessage& m) {
  return {zmq::message_t(m.header_bytes.data(), m.header_bytes.size()),
          zmq::message_t(m.metadata.data(), m.metadata.size()),
          zmq::message_t(m.payload[0].data(), m.payload[0].size())};
}

// What a message holds is checked before the message is taken: a value its schema cannot
// rule out (a str whose bytes are not UTF-8), and a non-consolidated message whose layout
// the receiver cannot make, are each a rejected message, and the stream goes on.
TEST(Remote, AMessageWhoseValuesOrLayoutBreakARuleIsRejectedWhole) {
  RemoteDataZMQ recv("tcp://127.0.0.1:*");
  recv.reset_state();
  zmq::context_t ctx;
  zmq::socket_t rogue(ctx, zmq::socket_type::push);
  rogue.set(zmq::sockopt::linger, 1000);
  rogue.connect(recv.endpoint(0));

  wire::DatapointEncoder dp(wire::Container::Dict);
  dp.add_str("name", "MARKER");
  wire::Encoder enc(wire::Mode::Consolidated);
  const wire::OutMessage& good = enc.encode(std::move(dp).finish());
  auto sent = frames_of(good);
  zmq::send_multipart(rogue, sent);
  auto bad = frames_of(good);
  std::string_view payload(static_cast<const char*>(bad[2].data()), bad[2].size());
  const size_t at = payload.find("MARKER");
  ASSERT_NE(at, std::string_view::npos);
  std::memcpy(static_cast<char*>(bad[2].data()) + at, "\xff\xfe\xfd\xfc\xfb\xfa", 6);
  zmq::send_multipart(rogue, bad);

  TensorDict reserved;  // "cls" names a field of the consolidated metadata
  reserved.set(Key{"cls", "x"}, Tensor::zeros({2}, DType::Float32));
  wire::Encoder loose(wire::Mode::NonConsolidated);
  auto unlaid = frames_of(loose.encode(reserved));
  zmq::send_multipart(rogue, unlaid);
  auto again = frames_of(good);
  zmq::send_multipart(rogue, again);

  auto name_of = [](const TensorDict& d) {
    const Tensor& t = d.get(d.keys(true, true).front());
    return std::string(static_cast<const char*>(t.data()), static_cast<size_t>(t.nbytes()));
  };
  auto first = recv.next(10s);
  ASSERT_TRUE(first);
  EXPECT_EQ(name_of(*first), "MARKER");
  EXPECT_THAT([&] { (void)recv.next(10s); },
              ::testing::ThrowsMessage<ProtocolError>(HasSubstr("not UTF-8")));
  EXPECT_THAT([&] { (void)recv.next(10s); },
              ::testing::ThrowsMessage<ProtocolError>(HasSubstr("cannot be laid out")));
  auto last = recv.next(10s);
  ASSERT_TRUE(last);
  EXPECT_EQ(name_of(*last), "MARKER");
  EXPECT_EQ(recv.rejected(), 2u);
  EXPECT_EQ(recv.count(0), 2u);
}

// Sends `n` datapoints 0 .. n-1 to `endpoint` from this process (a fork after the receiver
// made its threads is refused under ThreadSanitizer).
void send_datapoints(zmq::context_t& ctx, const std::string& endpoint, int n) {
  zmq::socket_t push(ctx, zmq::socket_type::push);
  push.set(zmq::sockopt::linger, 5000);
  push.connect(endpoint);
  for (int i = 0; i < n; ++i) {
    wire::Encoder enc(wire::Mode::Consolidated);  // each message carries its schema
    auto frames = frames_of(enc.encode(testing::make_datapoint(static_cast<uint64_t>(i))));
    zmq::send_multipart(push, frames);
  }
}

// A frame larger than anything the limits let through drops its connection before ZeroMQ
// buffers it: it is never delivered, nor counted as rejected, and a producer that keeps to
// the limits goes on.
TEST(Remote, AFrameOverTheLimitsDropsItsConnectionBeforeItIsBuffered) {
  RemoteOptions o;
  o.limits.max_metadata_bytes = 64 << 10;
  o.limits.max_message_bytes = 1 << 20;
  RemoteDataZMQ recv("tcp://127.0.0.1:*", "", o);
  recv.reset_state();
  zmq::context_t ctx;
  zmq::socket_t rogue(ctx, zmq::socket_type::push);
  rogue.set(zmq::sockopt::linger, 0);
  rogue.connect(recv.endpoint(0));
  std::array<zmq::message_t, 3> huge = {zmq::message_t(size_t{8} << 20), zmq::message_t(size_t{1}),
                                        zmq::message_t(size_t{0})};
  zmq::send_multipart(rogue, huge);
  send_datapoints(ctx, recv.endpoint(0), 3);
  for (int i = 0; i < 3; ++i) {
    auto dp = recv.next(10s);
    ASSERT_TRUE(dp);
    EXPECT_EQ(index_of(*dp), i);
  }
  EXPECT_FALSE(recv.next(500ms));  // the 8 MiB message never comes
  EXPECT_EQ(recv.rejected(), 0u);
}

// A reset_state() that fails (an address taken) makes nothing: the receiver is as before,
// and a later reset_state() binds.
TEST(Remote, AFailedResetStateLeavesNothingHalfMadeAndCanBeRetried) {
  const int taken = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  ASSERT_EQ(::bind(taken, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  ASSERT_EQ(::listen(taken, 1), 0);
  ASSERT_EQ(::getsockname(taken, reinterpret_cast<sockaddr*>(&a), &len), 0);
  const std::string addr = "tcp://127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  RemoteDataZMQ recv("tcp://127.0.0.1:*", addr);
  EXPECT_THROW(recv.reset_state(), SystemError);
  EXPECT_THROW((void)recv.next(0ms), StateError);
  EXPECT_THROW(recv.reset_state(), SystemError);  // tried again, not "called twice"
  ::close(taken);
  recv.reset_state();
  EXPECT_EQ(recv.endpoint(1), addr);
  zmq::context_t ctx;
  send_datapoints(ctx, recv.endpoint(1), 2);
  for (int i = 0; i < 2; ++i) {
    auto dp = recv.next(10s);
    ASSERT_TRUE(dp);
    EXPECT_EQ(index_of(*dp), i);
  }
  EXPECT_EQ(recv.count(1), 2u);
}

TEST(Remote, TwoProducersFeedOneReceiver) {
  const std::string addr1 = free_tcp_address(), addr2 = free_tcp_address();
  const int a = spawn_producer(addr1, counting(std::nullopt, 16), 30);
  const int b = spawn_producer(addr2, counting(std::nullopt, 5000), 30);
  RemoteDataZMQ recv(addr1, addr2);
  recv.reset_state();
  for (int i = 0; i < 60; ++i) {
    auto dp = recv.next(10s);
    ASSERT_TRUE(dp);
    EXPECT_TRUE(testing::datapoint_ok(*dp));
  }
  EXPECT_EQ(wait_exit(a), 0);
  EXPECT_EQ(wait_exit(b), 0);
  EXPECT_EQ(recv.count(0), 30u);
  EXPECT_EQ(recv.count(1), 30u);
}

TEST(Remote, ResetStateTwiceThrows) {
  RemoteDataZMQ recv("tcp://127.0.0.1:*");
  recv.reset_state();
  EXPECT_THROW(recv.reset_state(), StateError);
}

TEST(Remote, EveryUseAfterCloseIsAClosedError) {
  RemoteDataZMQ recv("tcp://127.0.0.1:*");
  recv.reset_state();
  recv.close();
  EXPECT_TRUE(recv.closed());
  EXPECT_THROW(recv.next(Timeout::poll()), ClosedError);
  EXPECT_THROW(recv.reset_state(), ClosedError);
}

// A datapoint with a pickled element, refused by a receiver that does not unpickle:
// counted as rejected and reported through on_rejected, and the stream goes on.
class WithPickle : public DataFlow {
 public:
  std::optional<TensorDict> next() override {
    wire::DatapointEncoder e(wire::Container::List);
    e.add_int({}, static_cast<int64_t>(i_));
    const std::byte blob[] = {std::byte{0x80}};
    if (i_ % 2 == 0) e.add_pickle({}, blob);
    ++i_;
    return std::move(e).finish();
  }

 private:
  uint64_t i_ = 0;
};

TEST(Remote, PickledDatapointsAreRejectedUnlessAllowed) {
  const std::string addr = free_tcp_address();
  const int pid = spawn_producer(addr, std::make_shared<WithPickle>(), 6);
  std::vector<std::string> errors;
  RemoteDataZMQ recv(addr, {}, {.allow_pickle = false, .on_rejected = [&](const ProtocolError& e) {
                                  errors.push_back(e.what());
                                }});
  recv.reset_state();
  for (int64_t odd : {1, 3, 5}) {
    auto dp = detail::RawAccess::next(recv, 10s);
    ASSERT_TRUE(dp);
    auto root = wire::DatapointDecoder::structure(*dp->layout, false);
    ASSERT_EQ(root->elements.size(), 1u);
    EXPECT_EQ(wire::DatapointDecoder::read_int(dp->storage, root->elements[0]), odd);
  }
  EXPECT_EQ(wait_exit(pid), 0);
  EXPECT_EQ(recv.rejected(), 3u);
  ASSERT_EQ(errors.size(), 3u);
  EXPECT_THAT(errors[0], HasSubstr("does not unpickle"));
}

TEST(Remote, SendingWithNoReceiverBlocksAndCanBeInterrupted) {
  static std::atomic<int> checks{0};
  set_interrupt_check([] {
    if (++checks >= 4) throw Interrupted("test interrupt");
  });
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(send_dataflow_zmq(*counting(10), free_tcp_address(), {.max_datapoints = 3}),
               Interrupted);
  set_interrupt_check(nullptr);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 2s);
}

// libzmq retries a name that does not resolve for ever, silently, while the send blocks:
// the connect says so in a warning naming the host, and the send still waits (the name may
// appear later) and can be interrupted.
std::vector<std::string> g_warnings;
TEST(Remote, AHostThatDoesNotResolveIsNamedInAWarningAndTheSendWaits) {
  g_warnings.clear();
  set_log_handler([](LogLevel, const std::string& m) { g_warnings.push_back(m); });
  static std::atomic<int> checks{0};
  checks = 0;
  set_interrupt_check([] {
    if (++checks >= 4) throw Interrupted("test interrupt");
  });
  EXPECT_THROW(
      send_dataflow_zmq(*counting(10), "tcp://nosuchhost.invalid:5555", {.max_datapoints = 1}),
      Interrupted);
  set_interrupt_check(nullptr);
  set_log_handler(nullptr);
  ASSERT_EQ(g_warnings.size(), 1u);
  EXPECT_THAT(g_warnings[0], HasSubstr("cannot resolve host 'nosuchhost.invalid'"));
  EXPECT_THAT(g_warnings[0], HasSubstr("ZeroMQ keeps trying"));
}

TEST(Remote, ThreadsSharingAReceiverTakeTurns) {
  const std::string addr = free_tcp_address();
  const int pid = spawn_producer(addr, counting(std::nullopt, 4096), 400);
  RemoteDataZMQ recv(addr);
  recv.reset_state();
  std::mutex mu;
  std::vector<int64_t> got;
  auto consume = [&] {
    while (auto dp = recv.next(3s)) {
      std::lock_guard<std::mutex> l(mu);
      got.push_back(index_of(*dp));
    }
  };
  std::thread a(consume), b(consume);
  a.join();
  b.join();
  EXPECT_EQ(wait_exit(pid), 0);
  std::sort(got.begin(), got.end());
  ASSERT_EQ(got.size(), 400u);
  for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], static_cast<int64_t>(i));
  EXPECT_EQ(recv.rejected(), 0u);
}

TEST(Remote, ACallFromACallbackOfTheRunningCallIsAStateError) {
  const std::string addr = free_tcp_address();
  RemoteDataZMQ* self = nullptr;
  std::string inner;
  RemoteDataZMQ recv(addr, "", {.on_rejected = [&](const ProtocolError&) {
                       try {
                         (void)self->next(Timeout::poll());
                       } catch (const StateError& e) {
                         inner = e.what();
                       }
                     }});
  self = &recv;
  recv.reset_state();
  zmq::context_t ctx;
  zmq::socket_t rogue(ctx, zmq::socket_type::push);
  rogue.set(zmq::sockopt::linger, 1000);
  rogue.connect(addr);
  rogue.send(zmq::str_buffer("lonely"), zmq::send_flags::none);
  for (auto until = std::chrono::steady_clock::now() + 10s;
       recv.rejected() == 0 && std::chrono::steady_clock::now() < until;)
    (void)recv.next(100ms);
  EXPECT_EQ(recv.rejected(), 1u);
  EXPECT_THAT(inner, HasSubstr("called again from within its own running call"));
}

// Producers' liveness: the receiver's table of producers and its report of a producer that
// goes silent while the others go on.

// Forks a producer that sends to `addr` about 500 datapoints/s until it is killed.
int spawn_endless_producer(const std::string& addr) {
  const int pid = ::fork();
  if (pid == 0) {
    try {
      send_dataflow_zmq(*counting(10, 64), addr, {.progress = [](uint64_t) {
        ::usleep(2000);
        return true;
      }});
    } catch (...) {
    }
    ::_exit(1);
  }
  return pid;
}

// Kills (SIGKILL, after SIGCONT for a stopped one) and reaps a producer.
void end_producer(int pid) {
  ::kill(pid, SIGKILL);
  ::kill(pid, SIGCONT);
  wait_exit(pid);
}

const ProducerInfo* with_address(const std::vector<ProducerInfo>& table, const std::string& a) {
  for (const auto& p : table)
    if (p.address == a) return &p;
  return nullptr;
}

// Receives until each of `n` producers has sent a datapoint (at most 10 s).
std::vector<ProducerInfo> until_all_sent(RemoteDataZMQ& recv, size_t n) {
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (std::chrono::steady_clock::now() < deadline) {
    (void)recv.next(100ms);
    auto table = recv.producers();
    if (std::count_if(table.begin(), table.end(),
                      [](const ProducerInfo& p) { return p.datapoints > 0; }) >= std::ptrdiff_t(n))
      return table;
  }
  ADD_FAILURE() << "the producers did not all send within 10 s";
  return {};
}

TEST(RemoteProducers, AStoppedProducerIsReportedOnceWhileTheOtherGoesOn) {
  const std::string addr = free_tcp_address();
  const int a = spawn_endless_producer(addr), b = spawn_endless_producer(addr);
  std::vector<std::string> silent;
  RemoteDataZMQ recv(addr, {}, {.liveness_timeout = 1s, .on_silent = [&](const TimeoutError& e) {
                                  silent.push_back(e.what());
                                }});
  recv.reset_state();
  auto table = until_all_sent(recv, 2);
  ASSERT_EQ(table.size(), 2u);
  for (const auto& p : table) {
    EXPECT_THAT(p.address, HasSubstr("tcp://127.0.0.1:"));
    EXPECT_NE(p.address, addr);  // the producer's end, not the receiver's
    EXPECT_TRUE(p.connected);
    EXPECT_EQ(p.socket, 0);
    EXPECT_TRUE(p.last_datapoint.has_value());
  }
  ::kill(a, SIGSTOP);
  // Datapoints go on flowing (from b) while a is reported, once.
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (silent.empty() && std::chrono::steady_clock::now() < deadline) (void)recv.next(100ms);
  ASSERT_EQ(silent.size(), 1u);
  EXPECT_THAT(silent[0], HasSubstr("RemoteDataZMQ: producer tcp://127.0.0.1:"));
  EXPECT_THAT(silent[0], HasSubstr("on " + addr));
  EXPECT_THAT(silent[0], HasSubstr("liveness_timeout 1.0 s"));
  std::string quiet, busy;
  for (const auto& p : table)
    (silent[0].find(p.address + " ") != std::string::npos ? quiet : busy) = p.address;
  ASSERT_FALSE(quiet.empty()) << silent[0];
  const uint64_t before = with_address(recv.producers(), busy)->datapoints;
  for (int i = 0; i < 200; ++i) ASSERT_TRUE(recv.next(10s));
  auto after = recv.producers();
  EXPECT_GE(with_address(after, busy)->datapoints, before + 190);
  const uint64_t quiet_count = with_address(after, quiet)->datapoints;
  EXPECT_EQ(silent.size(), 1u);  // reported once
  // Its connection is kept: woken up, it goes on where it stopped.
  EXPECT_TRUE(with_address(after, quiet)->connected);
  ::kill(a, SIGCONT);
  const auto resumed = std::chrono::steady_clock::now() + 10s;
  while (with_address(recv.producers(), quiet)->datapoints == quiet_count &&
         std::chrono::steady_clock::now() < resumed)
    (void)recv.next(100ms);
  EXPECT_GT(with_address(recv.producers(), quiet)->datapoints, quiet_count);
  EXPECT_EQ(silent.size(), 1u);
  end_producer(a);
  end_producer(b);
}

TEST(RemoteProducers, AKilledProducerIsATimeoutErrorFromNextOnceThenTheStreamGoesOn) {
  const std::string addr = free_tcp_address();
  const int a = spawn_endless_producer(addr);
  RemoteDataZMQ recv(addr, {}, {.liveness_timeout = 500ms});
  recv.reset_state();
  until_all_sent(recv, 1);
  end_producer(a);
  std::string error;
  const auto deadline = std::chrono::steady_clock::now() + 10s;
  while (error.empty() && std::chrono::steady_clock::now() < deadline) {
    try {
      (void)recv.next(100ms);
    } catch (const TimeoutError& e) {
      error = e.what();
    }
  }
  EXPECT_THAT(error, HasSubstr("RemoteDataZMQ: producer tcp://127.0.0.1:"));
  EXPECT_THAT(error, HasSubstr("datapoints, then none for"));
  EXPECT_THAT(error, HasSubstr("its connection closed"));
  EXPECT_FALSE(recv.next(300ms).has_value());  // reported once: the stream goes on
  auto table = recv.producers();
  ASSERT_EQ(table.size(), 1u);
  EXPECT_FALSE(table[0].connected);
  EXPECT_GT(table[0].datapoints, 0u);
}

TEST(RemoteProducers, AConsumerThatStopsReadingDoesNotMakeItsProducersSilent) {
  const std::string addr = free_tcp_address();
  const int a = spawn_endless_producer(addr);
  std::vector<std::string> silent;
  RemoteDataZMQ recv(addr, {}, {.liveness_timeout = 500ms, .on_silent = [&](const TimeoutError& e) {
                                  silent.push_back(e.what());
                                }});
  recv.reset_state();
  until_all_sent(recv, 1);
  std::this_thread::sleep_for(1500ms);  // the producer waits under the high-water mark
  for (int i = 0; i < 100; ++i) ASSERT_TRUE(recv.next(10s));
  EXPECT_TRUE(silent.empty()) << silent[0];
  end_producer(a);
}

TEST(RemoteProducers, ConnectionsAreListedBeforeTheySendAndForgottenIfTheyNeverDo) {
  RemoteDataZMQ recv("tcp://127.0.0.1:*");
  recv.reset_state();
  EXPECT_TRUE(recv.producers().empty());
  zmq::context_t ctx;
  auto push = std::make_unique<zmq::socket_t>(ctx, zmq::socket_type::push);
  push->set(zmq::sockopt::linger, 0);
  push->connect(recv.endpoint(0));
  auto until = [&](auto done) {
    const auto deadline = std::chrono::steady_clock::now() + 10s;
    while (!done(recv.producers()) && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    return done(recv.producers());
  };
  ASSERT_TRUE(until([](const std::vector<ProducerInfo>& t) { return t.size() == 1; }));
  const ProducerInfo p = recv.producers()[0];
  EXPECT_TRUE(p.connected);
  EXPECT_EQ(p.datapoints, 0u);
  EXPECT_FALSE(p.last_datapoint.has_value());
  push.reset();
  EXPECT_TRUE(until([](const std::vector<ProducerInfo>& t) { return t.empty(); }));
}

TEST(RemoteProducers, ZeroLivenessTimeoutReportsNothing) {
  const std::string addr = free_tcp_address();
  const int a = spawn_endless_producer(addr);
  RemoteDataZMQ recv(addr, {}, {.liveness_timeout = 0ms});
  recv.reset_state();
  until_all_sent(recv, 1);
  end_producer(a);
  // What it queued before it died still arrives; then silence past any bound reports
  // nothing: next() only times out.
  EXPECT_NO_THROW({
    while (recv.next(1500ms).has_value()) {
    }
  });
}

TEST(RemoteProducers, ANegativeLivenessTimeoutIsAValueError) {
  EXPECT_THROW(RemoteDataZMQ("tcp://127.0.0.1:*", {}, {.liveness_timeout = -1ms}), ValueError);
}

}  // namespace
}  // namespace tensorwire::dataflow
