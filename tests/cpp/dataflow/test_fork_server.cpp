// The fork server on its own (dataflow/fork_server.h): workers forked on order, their pidfds
// and wait statuses, a failure to answer, and its shutdown. Real processes.
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <thread>

#include "dataflow/fork_server.h"
#include "flows.h"

namespace tensorwire::dataflow::detail {
namespace {

using namespace std::chrono_literals;

class ForkServerTest : public testing::NoLeftovers {};

// Each worker exits with its index + the number of fds it was handed, after checking that
// current_worker() describes it.
ForkServer make_server() {
  return ForkServer(
      "test", {}, [] {},
      [](const WorkerInfo& info, uint32_t tag, std::vector<os::Fd> fds) -> int {
        const WorkerInfo* me = current_worker();
        if (!me || me->index != info.index || me->seed != info.seed || tag != 7) return 99;
        return info.index + static_cast<int>(fds.size());
      });
}

TEST_F(ForkServerTest, TheServerForksAWorkerOnOrderAndReportsItsStatus) {
  ForkServer server = make_server();
  auto [r, w] = os::UnixSocket::pair();
  ForkServer::Spawned s = server.spawn(WorkerInfo{3, 4, 42}, 7, {r.fd(), w.fd()});
  ASSERT_GT(s.pid, 0);
  os::ProcessWatch watch(s.pid, std::move(s.pidfd));
  EXPECT_TRUE(testing::ends_within(s.pid, 10s));
  const std::optional<int> status = server.status_of(s.pid, Deadline::after(5s));
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 3 + 2);
  server.close();
  EXPECT_TRUE(WIFEXITED(server.exit_status()) && WEXITSTATUS(server.exit_status()) == 0);
}

std::string comm_of(int pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/comm");
  std::string name;
  std::getline(f, name);
  return name;
}

// The server is named apart from the workers (a tool that lists a runner's workers among
// its descendants must not take the server for one); a worker it forks has the main
// process's name again.
TEST_F(ForkServerTest, TheServerIsNamedApartAndItsWorkersKeepTheMainProcessName) {
  const std::string mine = comm_of(::getpid());
  ASSERT_NE(mine, "tw-forkserver");
  ForkServer server(
      "test", {}, [] {},
      [mine](const WorkerInfo&, uint32_t, std::vector<os::Fd>) -> int {
        return comm_of(::getpid()) == mine ? 0 : 1;
      });
  const auto until = std::chrono::steady_clock::now() + 10s;  // it names itself once forked
  while (comm_of(server.pid()) != "tw-forkserver" && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(1ms);
  EXPECT_EQ(comm_of(server.pid()), "tw-forkserver");
  ForkServer::Spawned s = server.spawn(WorkerInfo{0, 1, 1}, 7, {});
  ASSERT_GT(s.pid, 0);
  os::ProcessWatch watch(s.pid, std::move(s.pidfd));
  EXPECT_TRUE(testing::ends_within(s.pid, 10s));
  const std::optional<int> status = server.status_of(s.pid, Deadline::after(5s));
  ASSERT_TRUE(status);
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << "the worker's name differs";
}

// A process forked from the owner since holds its end of the link: close() still ends the
// server at once (a quit order, not only end-of-file), and the server kills what it forked.
TEST_F(ForkServerTest, CloseEndsTheServerWhileALaterForkHoldsTheLink) {
  ForkServer server(
      "test", {}, [] {},
      [](const WorkerInfo&, uint32_t, std::vector<os::Fd>) -> int {
        ::pause();  // until killed
        return 0;
      });
  ForkServer::Spawned s = server.spawn(WorkerInfo{0, 1, 1}, 0, {});
  const int holder = ::fork();
  if (holder == 0) {
    ::pause();
    ::_exit(0);
  }
  server.close();
  EXPECT_TRUE(WIFEXITED(server.exit_status())) << server.exit_status();  // not SIGKILLed
  EXPECT_TRUE(testing::ends_within(s.pid, 5s));
  ::kill(holder, SIGKILL);
  ::waitpid(holder, nullptr, 0);
}

// A server that is gone: spawn() says so with ClosedError, and status_of() knows nothing.
TEST_F(ForkServerTest, AServerThatIsGoneIsAClosedErrorAndNoStatus) {
  ForkServer server = make_server();
  ForkServer::Spawned s = server.spawn(WorkerInfo{1, 2, 5}, 7, {});
  EXPECT_TRUE(testing::ends_within(s.pid, 10s));
  ASSERT_EQ(::kill(server.pid(), SIGKILL), 0);
  EXPECT_TRUE(testing::ends_within(server.pid(), 5s));
  EXPECT_THROW(server.spawn(WorkerInfo{0, 2, 5}, 7, {}), ClosedError);
  // Its report may have come before it died; if it did not, nobody knows the status now.
  const std::optional<int> status = server.status_of(s.pid, Deadline::after(1s));
  if (status) {
    EXPECT_EQ(WEXITSTATUS(*status), 1);
  }
  server.close();
  EXPECT_TRUE(WIFSIGNALED(server.exit_status()));
}

}  // namespace
}  // namespace tensorwire::dataflow::detail
