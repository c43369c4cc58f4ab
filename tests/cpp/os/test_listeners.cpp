// os::ListenerMark: a forked worker lets go of the listening sockets tensorwire objects
// marked, so that their ports and names can be bound again once the objects close, and
// keeps every other fd.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "os/listeners.h"
#include "os/unix_socket.h"
#include "tcp_listener.h"

namespace tensorwire::os {
namespace {

std::string target(int fd) {
  char buf[256];
  const ssize_t n = ::readlink(("/proc/self/fd/" + std::to_string(fd)).c_str(), buf, sizeof buf);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
}

TEST(ListenerMarkForked, AForkedWorkerReleasesOnlyTheMarkedListeners) {
  const std::string name = "tw-test-listener-" + std::to_string(::getpid());
  auto unix_listener = std::make_unique<UnixListener>(name);  // marks itself
  uint16_t port = 0;
  Fd tcp = tcp_listener(port);
  ASSERT_TRUE(tcp);
  auto tcp_mark = std::make_unique<ListenerMark>(ListenerMark::tcp("127.0.0.1", port));
  uint16_t user_port = 0;
  Fd user = tcp_listener(user_port);  // not marked: the user's
  ASSERT_TRUE(user);
  uint16_t same_port = port;  // the user's too, on the marked port but another address
  Fd user_same_port = tcp_listener(same_port, "127.0.0.2");
  ASSERT_TRUE(user_same_port);
  int ready[2];
  ASSERT_EQ(::pipe(ready), 0);
  const int pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    int code = release_inherited_listeners() == 2 ? 0 : 10;
    if (target(unix_listener->fd()) != "/dev/null" || target(tcp.get()) != "/dev/null") code = 11;
    if (target(user.get()).rfind("socket:", 0) != 0) code = 12;
    if (target(user_same_port.get()).rfind("socket:", 0) != 0) code = 13;
    (void)!::write(ready[1], &code, sizeof code);
    ::pause();  // alive, as a worker is, while the parent binds again
    ::_exit(code);
  }
  ::close(ready[1]);
  int code = -1;
  ASSERT_EQ(::read(ready[0], &code, sizeof code), static_cast<ssize_t>(sizeof code));
  ::close(ready[0]);
  EXPECT_EQ(code, 0);
  // The owners close: the port and the name are free though the worker still runs.
  unix_listener.reset();
  tcp_mark.reset();
  tcp.reset();
  EXPECT_NO_THROW(UnixListener again(name));
  uint16_t same = port;
  EXPECT_TRUE(tcp_listener(same)) << "port " << port << ": " << std::strerror(errno);
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
}

TEST(ListenerMarkForked, WithoutMarksAForkedWorkerKeepsEveryListener) {
  uint16_t port = 0;
  Fd tcp = tcp_listener(port);
  ASSERT_TRUE(tcp);
  const int pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0)
    ::_exit(release_inherited_listeners() == 0 && target(tcp.get()) != "/dev/null" ? 0 : 1);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
}

}  // namespace
}  // namespace tensorwire::os
