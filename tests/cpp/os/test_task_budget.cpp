// os::require_free_tasks: the check before work that starts threads and processes (libzmq
// and UCX abort the process when a thread of theirs cannot start). Each case runs in a
// forked child: it lowers RLIMIT_NPROC and becomes another user (root is exempt from that
// limit), or moves into a pids cgroup of its own.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <functional>
#include <string>

#include "os/task_budget.h"
#include "tensorwire/core/error.h"

namespace tensorwire::os {
namespace {

constexpr uid_t kNobody = 65534;

// Runs `body` in a forked child and returns what it returned, or "threw: <what>" and
// "error <code>: <what>" for a SystemError.
std::string in_child(const std::function<std::string()>& body) {
  int p[2];
  EXPECT_EQ(::pipe(p), 0);
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(p[0]);
    std::string out;
    try {
      out = body();
    } catch (const SystemError& e) {
      out = "error " + std::to_string(e.code()) + ": " + e.what();
    } catch (const std::exception& e) {
      out = std::string("threw: ") + e.what();
    }
    (void)!::write(p[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(p[1]);
  std::string got;
  char buf[4096];
  for (ssize_t n; (n = ::read(p[0], buf, sizeof buf)) > 0;) got.append(buf, static_cast<size_t>(n));
  ::close(p[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  return got;
}

// In the child: RLIMIT_NPROC `limit`, then user nobody.
void as_nobody_with_nproc(rlim_t limit) {
  const rlimit l{limit, limit};
  if (::setrlimit(RLIMIT_NPROC, &l) != 0 || ::setgid(kNobody) != 0 || ::setuid(kNobody) != 0)
    throw std::runtime_error("cannot become nobody (the tests run as root)");
}

std::string outcome_of(size_t needed) {
  require_free_tasks(needed, "the thing");
  return "room";
}

TEST(TaskBudget, ForkedUserWithRoomIsSilentAndOverItsLimitIsAnEagainNamingIt) {
  // 1,000: above the machine's threads here, so settled without counting the user's.
  EXPECT_EQ(in_child([] {
              as_nobody_with_nproc(1000);
              return outcome_of(10);
            }),
            "room");
  const std::string over = in_child([] {
    as_nobody_with_nproc(1000);
    return outcome_of(5000);
  });
  EXPECT_EQ(over.rfind("error " + std::to_string(EAGAIN) +
                           ": the thing needs about 5000 more threads or processes, and user " +
                           std::to_string(kNobody) + " has ",
                       0),
            0)
      << over;
  EXPECT_NE(over.find("of its limit (RLIMIT_NPROC, which counts threads) of 1000: raise it "
                      "(ulimit -u"),
            std::string::npos)
      << over;
}

TEST(TaskBudget, ForkedUserBelowTheMachinesThreadsIsCountedByItsOwn) {
  // A limit below the machine's count of threads: the user's own (this child, and any
  // other process of nobody's) are counted.
  EXPECT_EQ(in_child([] {
              as_nobody_with_nproc(20);
              return outcome_of(5);
            }),
            "room");
  const std::string over = in_child([] {
    as_nobody_with_nproc(20);
    return outcome_of(30);
  });
  EXPECT_NE(over.find("error " + std::to_string(EAGAIN) + ": the thing needs about 30"),
            std::string::npos)
      << over;
  EXPECT_NE(over.find("(RLIMIT_NPROC, which counts threads) of 20"), std::string::npos) << over;
}

TEST(TaskBudget, ForkedRootIsExemptFromRlimitNproc) {
  // As the kernel exempts it: a check that refused root would refuse work that runs.
  EXPECT_EQ(in_child([] {
              const rlimit l{1, 1};
              ::setrlimit(RLIMIT_NPROC, &l);
              return outcome_of(100);
            }),
            "room");
}

// A pids cgroup of the test's own (cgroup v1's pids hierarchy, or v2's unified one), removed
// at the end.
class PidsCgroup {
 public:
  PidsCgroup() {
    const std::string name = "/tensorwire-test-" + std::to_string(::getpid());
    for (const char* base : {"/sys/fs/cgroup/pids", "/sys/fs/cgroup"}) {
      struct stat st {};
      if (::stat((std::string(base) + "/cgroup.procs").c_str(), &st) != 0) continue;
      if (::mkdir((base + name).c_str(), 0755) != 0) continue;
      if (::access((base + name + "/pids.max").c_str(), W_OK) == 0) {
        dir = base + name;
        return;
      }
      ::rmdir((base + name).c_str());  // v2 without the pids controller enabled here
    }
  }
  ~PidsCgroup() {
    if (!dir.empty()) ::rmdir(dir.c_str());
  }
  std::string dir;
};

void write_file(const std::string& path, const std::string& text) {
  std::ofstream f(path);
  f << text;
  f.close();
  if (!f) throw std::runtime_error("cannot write " + path);
}

TEST(TaskBudget, ForkedIntoAPidsCgroupOverItsMaxIsAnEagainNamingIt) {
  PidsCgroup cg;
  ASSERT_FALSE(cg.dir.empty()) << "no pids cgroup could be made (cgroup v1's pids hierarchy or "
                                  "v2 with the pids controller; the tests run as root)";
  write_file(cg.dir + "/pids.max", "50");
  const auto enter_and_check = [&](size_t needed) {
    return in_child([&, needed] {
      write_file(cg.dir + "/cgroup.procs", std::to_string(::getpid()));
      return outcome_of(needed);
    });
  };
  EXPECT_EQ(enter_and_check(10), "room");
  const std::string over = enter_and_check(60);
  EXPECT_EQ(over.rfind("error " + std::to_string(EAGAIN) +
                           ": the thing needs about 60 more threads or processes, and the cgroup " +
                           cg.dir +
                           " has 1 of its limit (pids.max) of 50: raise it (docker run "
                           "--pids-limit; the container's pids.max)",
                       0),
            0)
      << over;
}

}  // namespace
}  // namespace tensorwire::os
