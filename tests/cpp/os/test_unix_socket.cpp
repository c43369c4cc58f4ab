// os::UnixSocket: every wait ends at its deadline or by an interrupt, even when the peer
// never reads (a stopped process), and a message is never cut in the stream.
#include <gtest/gtest.h>

#include <cerrno>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "os/unix_socket.h"
#include "tensorwire/core/error.h"
#include "tensorwire/runtime/interrupt.h"

namespace tensorwire::os {
namespace {

using namespace std::chrono_literals;

std::string message(size_t size, char fill) {
  return std::string(size, fill);
}

// Reads everything `reader` has, checking that each message is one of `sent`, whole and in
// order; returns how many arrived.
size_t drain(UnixSocket& reader, const std::vector<std::string>& sent) {
  size_t n = 0;
  while (auto m = reader.recv(Deadline::after(200ms))) {
    EXPECT_LT(n, sent.size());
    if (n < sent.size()) {
      EXPECT_EQ(m->bytes, sent[n]) << "message " << n << " cut or reordered";
    }
    ++n;
  }
  return n;
}

// Makes the next interrupt check throw, as Ctrl-C does in Python.
int g_checks_before_interrupt = -1;
void interrupt_after_some_checks() {
  if (g_checks_before_interrupt >= 0 && g_checks_before_interrupt-- == 0)
    throw Interrupted("interrupted by the test");
}

class UnixSocketTest : public ::testing::Test {
 protected:
  void SetUp() override { set_interrupt_check(interrupt_after_some_checks); }
  void TearDown() override {
    set_interrupt_check(nullptr);
    g_checks_before_interrupt = -1;
  }
};

TEST_F(UnixSocketTest, SendToAPeerThatDoesNotReadEndsAtItsDeadline) {
  auto [a, b] = UnixSocket::pair();
  std::vector<std::string> sent;
  const auto start = Clock::now();
  for (char c = 'a';; ++c) {
    std::string m = message(1 << 20, c);
    const bool whole = a.send(m, {}, Deadline::after(100ms));
    // A message cut at the deadline keeps its rest queued: it will arrive whole.
    if (whole || a.queued_bytes() > 0) sent.push_back(std::move(m));
    if (!whole) break;
    ASSERT_LT(sent.size(), 1000u) << "the peer's buffer never filled";
  }
  EXPECT_LT(Clock::now() - start, 5s);
  // The rest of a cut message goes before the next one; none is sent twice or cut.
  sent.push_back("next");
  std::thread reader([&] { EXPECT_EQ(drain(b, sent), sent.size()); });
  EXPECT_TRUE(a.send("next", {}, Deadline::after(10s)));
  EXPECT_EQ(a.queued_bytes(), 0u);
  reader.join();
}

TEST_F(UnixSocketTest, AMessageGivenUpBeforeAnyByteLeftIsNotSent) {
  auto [a, b] = UnixSocket::pair();
  std::vector<std::string> sent;
  // Polls (zero timeouts) until one message is refused.
  for (int i = 0;; ++i) {
    std::string m = message(4096, static_cast<char>('a' + i % 26));
    const bool whole = a.send(m, {}, Deadline::after(Timeout::poll()));
    if (whole || a.queued_bytes() > 0) sent.push_back(std::move(m));
    if (!whole) break;
  }
  std::thread reader([&] { EXPECT_EQ(drain(b, sent), sent.size()); });
  EXPECT_TRUE(a.flush(Deadline::after(5s)));
  reader.join();
}

TEST_F(UnixSocketTest, AnInterruptEndsASendThePeerDoesNotReadAndKeepsTheStreamWhole) {
  auto [a, b] = UnixSocket::pair();
  const std::string big = message(8 << 20, 'x');
  g_checks_before_interrupt = 3;  // about 150 ms into the wait
  const auto start = Clock::now();
  EXPECT_THROW(a.send(big), Interrupted);
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_GT(a.queued_bytes(), 0u);  // part of it left: the rest is kept, not dropped
  std::thread reader([&] { EXPECT_EQ(drain(b, {big, "after"}), 2u); });
  EXPECT_TRUE(a.send("after", {}, Deadline::after(10s)));
  reader.join();
}

TEST_F(UnixSocketTest, RecvEndsAtItsDeadlineOrByAnInterrupt) {
  auto [a, b] = UnixSocket::pair();
  const auto start = Clock::now();
  EXPECT_FALSE(b.recv(Deadline::after(100ms)).has_value());
  EXPECT_GE(Clock::now() - start, 100ms);
  g_checks_before_interrupt = 2;
  EXPECT_THROW(b.recv(Deadline::never()), Interrupted);
  a.send("hello");
  auto m = b.recv(Deadline::after(1s));
  ASSERT_TRUE(m.has_value());
  EXPECT_EQ(m->bytes, "hello");
}

TEST_F(UnixSocketTest, PostNeverBlocksAndFlushWritesWhatThePeerTakes) {
  auto [a, b] = UnixSocket::pair();
  std::vector<std::string> sent;
  const auto start = Clock::now();
  for (int i = 0; i < 16; ++i) {
    sent.push_back(message(1 << 20, static_cast<char>('a' + i)));
    a.post(sent.back());
  }
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_GT(a.queued_bytes(), 0u);  // 16 MiB do not fit a socket buffer
  std::thread reader([&] { EXPECT_EQ(drain(b, sent), sent.size()); });
  EXPECT_TRUE(a.flush(Deadline::after(10s)));
  EXPECT_EQ(a.queued_bytes(), 0u);
  reader.join();
}

TEST_F(UnixSocketTest, FdsTravelWithTheirMessage) {
  auto [a, b] = UnixSocket::pair();
  auto [x, y] = UnixSocket::pair();
  EXPECT_TRUE(a.send("with an fd", {x.fd()}, Deadline::after(1s)));
  auto m = b.recv(Deadline::after(1s));
  ASSERT_TRUE(m.has_value());
  ASSERT_EQ(m->fds.size(), 1u);
  UnixSocket passed(std::move(m->fds[0]));
  passed.send("through the passed fd");
  EXPECT_EQ(y.recv(Deadline::after(1s))->bytes, "through the passed fd");
  // Messages after one with fds are themselves, each once.
  EXPECT_TRUE(a.send("second with an fd", {x.fd()}, Deadline::after(1s)));
  EXPECT_TRUE(a.send("plain"));
  EXPECT_EQ(b.recv(Deadline::after(1s))->bytes, "second with an fd");
  EXPECT_EQ(b.recv(Deadline::after(1s))->bytes, "plain");
  EXPECT_FALSE(b.recv(Deadline::after(50ms)).has_value());
}

TEST_F(UnixSocketTest, ConnectToAListenerThatAcceptsNobodyEndsAtItsDeadline) {
  UnixListener listener(unique_name("test-backlog"));
  std::vector<UnixSocket> waiting;
  std::string refused;
  const auto start = Clock::now();
  // Nobody accepts: the backlog fills, then connect() gives up at its deadline.
  for (int i = 0; i < 1000 && refused.empty(); ++i) {
    try {
      waiting.push_back(UnixSocket::connect(listener.name(), Deadline::after(100ms)));
    } catch (const SystemError& e) {
      EXPECT_EQ(e.code(), EAGAIN) << e.what();
      refused = e.what();
    }
  }
  ASSERT_FALSE(refused.empty()) << "the backlog never filled";
  EXPECT_NE(refused.find(listener.name()), std::string::npos) << refused;
  EXPECT_LT(Clock::now() - start, 10s);
}

TEST_F(UnixSocketTest, ConnectWhereNothingListensIsRefusedAtItsDeadline) {
  const auto start = Clock::now();
  try {
    UnixSocket::connect(unique_name("nobody"), Deadline::after(100ms));
    FAIL() << "connected";
  } catch (const ConnectionRefused& e) {  // a ClosedError: what a gone transport's calls throw
    EXPECT_NE(std::string(e.what()).find("nothing listened under that name"), std::string::npos)
        << e.what();
  }
  EXPECT_GE(Clock::now() - start, 100ms);
}

}  // namespace
}  // namespace tensorwire::os
