// os/own_sockets.h: finding this process's listening sockets and the connections they
// accepted that were not answered yet, and closing a listening socket to new connections.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

#include "os/own_sockets.h"
#include "os/unix_socket.h"
#include "tcp_listener.h"

namespace tensorwire::os {
namespace {

// A non-blocking connect to ip:port; the socket, its connect under way or done.
Fd start_connect(const char* ip, uint16_t port) {
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  ::inet_pton(AF_INET, ip, &a.sin_addr);
  a.sin_port = htons(port);
  const int rc = ::connect(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof a);
  EXPECT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
  return fd;
}

// Whether `fd`'s connect completed within `ms`.
bool connected_within(int fd, int ms) {
  pollfd p{fd, POLLOUT, 0};
  if (::poll(&p, 1, ms) != 1) return false;
  int err = 0;
  socklen_t len = sizeof err;
  return ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 && err == 0;
}

// A listener on 127.0.0.1 and a client whose connect completed (not accepted yet).
struct Connected {
  uint16_t port = 0;
  Fd listener;
  Fd client;
};
Connected connected() {
  Connected c;
  c.listener = tcp_listener(c.port);
  EXPECT_TRUE(c.listener);
  c.client = start_connect("127.0.0.1", c.port);
  EXPECT_TRUE(connected_within(c.client.get(), 5000));
  return c;
}

TEST(OwnSockets, ListeningSocketsAreFoundByTheirAddressAndPort) {
  uint16_t port = 0;
  Fd mine = tcp_listener(port);
  ASSERT_TRUE(mine);
  uint16_t same_port = port;
  Fd other_address = tcp_listener(same_port, "127.0.0.2");  // the same port, another address
  ASSERT_TRUE(other_address);
  uint16_t other_port = 0;
  Fd other = tcp_listener(other_port);
  ASSERT_TRUE(other);
  EXPECT_EQ(listening_sockets("127.0.0.1", port), std::vector<int>{mine.get()});
  EXPECT_EQ(listening_sockets("127.0.0.2", port), std::vector<int>{other_address.get()});
  EXPECT_TRUE(listening_sockets("127.0.0.3", port).empty());
  uint16_t any_port = 0;
  Fd any = tcp_listener(any_port, "0.0.0.0");  // every address: found as bound
  ASSERT_TRUE(any);
  EXPECT_EQ(listening_sockets("0.0.0.0", any_port), std::vector<int>{any.get()});
  EXPECT_TRUE(listening_sockets("127.0.0.1", any_port).empty());
}

// Whether `fd` reads end of file within `ms`, after whatever was sent before it.
bool reads_end_within(int fd, int ms) {
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, ms) != 1) return false;
    char buf[256];
    const ssize_t n = ::recv(fd, buf, sizeof buf, 0);
    if (n <= 0) return true;
  }
}

TEST(OwnSockets, OnlyTheAcceptedConnectionsThatWereNotAnsweredAreShutDown) {
  auto [port, listener, unanswered] = connected();
  Fd answered = start_connect("127.0.0.1", port);
  ASSERT_TRUE(connected_within(answered.get(), 5000));
  Fd first(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  Fd second(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(first && second);
  ASSERT_EQ(::write(unanswered.get(), "x", 1), 1);  // what a client sends does not count
  // The accepted end of `answered` (the order of accept is the order of the connects).
  ASSERT_EQ(::write(second.get(), "y", 1), 1);
  EXPECT_EQ(shut_down_unanswered("127.0.0.2", port), 0u);  // another address: none
  EXPECT_FALSE(reads_end_within(unanswered.get(), 100));
  EXPECT_EQ(shut_down_unanswered("127.0.0.1", port), 1u);
  EXPECT_TRUE(reads_end_within(unanswered.get(), 5000));
  char got = 0;
  ASSERT_EQ(::read(answered.get(), &got, 1), 1);
  EXPECT_EQ(got, 'y');
  EXPECT_FALSE(reads_end_within(answered.get(), 100));  // left alone
  // Found as well by "every address", until its fd is closed.
  EXPECT_EQ(shut_down_unanswered("0.0.0.0", port), 1u);
  first.reset();
  EXPECT_EQ(shut_down_unanswered("0.0.0.0", port), 0u);
}

TEST(OwnSockets, AConnectionWhoseClientLeftAfterItsRequestCountsUntilItsFdIsClosed) {
  // Its client closed once refused: the socket has no peer any more, but what the client
  // sent before is still there to read (UCX's thread would read a whole request from it).
  auto [port, listener, client] = connected();
  Fd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  ASSERT_TRUE(accepted);
  const char request[80] = {};
  ASSERT_EQ(::write(client.get(), request, sizeof request), 80);
  EXPECT_EQ(shut_down_unanswered("127.0.0.1", port), 1u);
  EXPECT_TRUE(reads_end_within(client.get(), 5000));
  client.reset();
  EXPECT_TRUE(reads_end_within(accepted.get(), 5000));  // the request, then the end
  EXPECT_EQ(shut_down_unanswered("127.0.0.1", port), 1u);
  accepted.reset();
  EXPECT_EQ(shut_down_unanswered("127.0.0.1", port), 0u);
}

TEST(OwnSockets, AListeningSocketThatDropsNewConnectionsCompletesNoMoreButKeepsItsQueue) {
  auto [port, listener, before] = connected();
  ASSERT_TRUE(drop_new_connections(listener.get()));
  Fd after = start_connect("127.0.0.1", port);
  EXPECT_FALSE(connected_within(after.get(), 300));  // its SYN goes unanswered
  // The connection completed before the filter is still there to accept.
  pollfd p{listener.get(), POLLIN, 0};
  ASSERT_EQ(::poll(&p, 1, 1000), 1);
  ASSERT_EQ(::fcntl(listener.get(), F_SETFL, O_NONBLOCK), 0);
  Fd accepted(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_TRUE(accepted);
  Fd none(::accept4(listener.get(), nullptr, nullptr, SOCK_CLOEXEC));
  EXPECT_FALSE(none);  // nothing else was queued
  EXPECT_EQ(errno, EAGAIN);
  // Once the listening socket is gone, the waiting client is refused.
  listener = Fd();
  pollfd q{after.get(), POLLOUT, 0};
  EXPECT_EQ(::poll(&q, 1, 5000), 1);
  int err = 0;
  socklen_t len = sizeof err;
  ::getsockopt(after.get(), SOL_SOCKET, SO_ERROR, &err, &len);
  EXPECT_EQ(err, ECONNREFUSED);
}

TEST(OwnSocketsForked, AFileLockOfThisProcessSurvivesTheScan) {
  // A file's fd is never duplicated and closed by the scan: that would drop the POSIX
  // record locks this process holds on the file (SQLite's, for one).
  char path[] = "/tmp/tensorwire-own-sockets-XXXXXX";
  Fd file(::mkstemp(path));
  ASSERT_TRUE(file);
  ::unlink(path);
  EXPECT_FALSE(is_socket(file.get()));
  struct flock lock {};
  lock.l_type = F_WRLCK;
  lock.l_whence = SEEK_SET;
  ASSERT_EQ(::fcntl(file.get(), F_SETLK, &lock), 0);
  auto [port, listener, client] = connected();
  EXPECT_TRUE(is_socket(listener.get()));
  EXPECT_EQ(shut_down_unanswered("127.0.0.1", port), 0u);  // nothing accepted yet
  // Still held: a forked child cannot take it.
  const pid_t child = ::fork();
  if (child == 0) {
    struct flock probe {};
    probe.l_type = F_WRLCK;
    probe.l_whence = SEEK_SET;
    ::_exit(::fcntl(file.get(), F_SETLK, &probe) == -1 ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(::waitpid(child, &status, 0), child);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

TEST(OwnSockets, EveryOpenFdIsVisitedOnce) {
  Fd a(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  Fd b(::open("/dev/null", O_RDONLY | O_CLOEXEC));
  std::vector<int> seen;
  for_each_fd([&](int fd) { seen.push_back(fd); });
  EXPECT_EQ(std::count(seen.begin(), seen.end(), a.get()), 1);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), b.get()), 1);
  EXPECT_EQ(std::count(seen.begin(), seen.end(), 0), 1);  // stdin
}

}  // namespace
}  // namespace tensorwire::os
