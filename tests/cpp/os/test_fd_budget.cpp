// os::require_free_fds: the check before work that needs many descriptors at once (libzmq
// and UCX abort the process on EMFILE halfway through), under a soft limit lowered for
// the test.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <optional>
#include <string>
#include <vector>

#include "os/fd_budget.h"
#include "os/unix_socket.h"
#include "tensorwire/core/error.h"

namespace tensorwire::os {
namespace {

// Lowers RLIMIT_NOFILE's soft limit to `open + room` for its lifetime.
class LowLimit {
 public:
  explicit LowLimit(size_t room) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    const std::optional<size_t> free = free_fds();
    EXPECT_TRUE(free.has_value());
    rlimit low = saved_;
    low.rlim_cur = saved_.rlim_cur - *free + room;
    EXPECT_EQ(::setrlimit(RLIMIT_NOFILE, &low), 0);
  }
  ~LowLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }

 private:
  rlimit saved_{};
};

TEST(FdBudget, CountsTheDescriptorsLeftBelowTheLimit) {
  LowLimit limit(40);
  const size_t before = free_fds().value();
  EXPECT_NEAR(static_cast<double>(before), 40, 1);
  {
    Fd a(::dup(0)), b(::dup(0));
    EXPECT_EQ(free_fds().value(), before - 2);
  }
  EXPECT_EQ(free_fds().value(), before);
}

TEST(FdBudget, EnoughIsSilentAndTooFewIsAnEmfileNamingTheLimit) {
  LowLimit limit(40);
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  EXPECT_NO_THROW(require_free_fds(10, "this"));
  try {
    require_free_fds(1000, "a thing with 3 parts");
    FAIL() << "no error with about 40 free and 1000 needed";
  } catch (const SystemError& e) {
    EXPECT_EQ(e.code(), EMFILE);
    const std::string what = e.what();
    EXPECT_NE(what.find("a thing with 3 parts needs about 1000 free file descriptors, and this "
                        "process has " +
                        std::to_string(free_fds().value()) + " of its limit (RLIMIT_NOFILE) of " +
                        std::to_string(l.rlim_cur) + " free"),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("ulimit -n"), std::string::npos) << what;
  }
}

TEST(FdBudget, FreeNumbersBelowTakenOnesAreCountedExactly) {
  // Every number below the limit taken, then three low ones given back: the probe near the
  // limit finds it taken, and the count finds the holes. (Three: UBSan's check of the
  // thrown error's type opens a pipe, and with none free it reports a false "invalid vptr".)
  LowLimit limit(10);
  std::vector<Fd> held;
  while (free_fds().value() > 0) held.emplace_back(::dup(0));
  ASSERT_EQ(free_fds().value(), 0u);
  for (int i = 0; i < 3; ++i) held[static_cast<size_t>(i)].reset();
  EXPECT_EQ(free_fds().value(), 3u);
  EXPECT_NO_THROW(require_free_fds(3, "three"));
  EXPECT_THROW(require_free_fds(4, "four"), SystemError);
}

TEST(FdBudget, OneFreeNumberNearTheLimitWithOpenOnesAboveIsNotRoom) {
  // A hole just below the limit (a dead worker's descriptors closed) with open ones above
  // it: the numbers near the limit are not all free, so the open ones are counted. (A
  // probe of one number took the hole for room, and a runner's replacement went ahead
  // with 4 free of the 8 it needs.)
  LowLimit limit(10);
  rlimit l{};
  ::getrlimit(RLIMIT_NOFILE, &l);
  std::vector<Fd> held;
  while (free_fds().value() > 0) held.emplace_back(::dup(0));
  const auto hole_at = static_cast<int>(l.rlim_cur) - 8;
  int low = 2;  // and two low ones, for UBSan's pipe (above)
  for (Fd& fd : held)
    if (fd.get() == hole_at || (fd.get() < hole_at && low-- > 0)) fd.reset();
  ASSERT_EQ(::fcntl(hole_at, F_GETFD), -1);
  ASSERT_EQ(free_fds().value(), 3u);
  EXPECT_THROW(require_free_fds(8, "eight"), SystemError);
  EXPECT_NO_THROW(require_free_fds(3, "three"));
}

}  // namespace
}  // namespace tensorwire::os
