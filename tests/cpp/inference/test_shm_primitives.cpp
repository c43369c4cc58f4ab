// The shared-memory primitives added for the inference transport: IndexSet,
// fork_generation(), WaitWord's notify_one() and WaitBits; and the segments every shared
// region lives in.
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <iterator>
#include <string>
#include <thread>
#include <vector>

#include "os/fork.h"
#include "os/futex.h"
#include "shm/index_set.h"
#include "shm/segment.h"
#include "tensorwire/core/error.h"

namespace {

using tensorwire::shm::IndexSet;

struct Bits {
  std::vector<uint64_t> memory;
  IndexSet set;
  explicit Bits(uint32_t n) : memory(IndexSet::bytes_for(n) / 8), set(memory.data(), n) {
    set.format();
  }
};

std::vector<uint32_t> take_all(IndexSet& s, uint32_t& cursor, size_t max = 1000) {
  std::vector<uint32_t> out(s.capacity());
  out.resize(s.take(max, out.data(), cursor));
  return out;
}

TEST(IndexSet, InsertedIndicesAreTakenOnceInIndexOrder) {
  Bits b(130);
  for (uint32_t i : {129u, 3u, 64u, 0u, 63u}) b.set.insert(i);
  b.set.insert(3);  // twice: still one member
  EXPECT_TRUE(b.set.contains(64));
  uint32_t cursor = 0;
  EXPECT_EQ(take_all(b.set, cursor), (std::vector<uint32_t>{0, 3, 63, 64, 129}));
  EXPECT_TRUE(b.set.empty());
  EXPECT_TRUE(take_all(b.set, cursor).empty());
}

TEST(IndexSet, TakeRotatesFromTheCursorSoNoIndexStarves) {
  Bits b(200);
  for (uint32_t i : {1u, 5u, 70u, 150u, 199u}) b.set.insert(i);
  uint32_t cursor = 71;
  EXPECT_EQ(take_all(b.set, cursor, 2), (std::vector<uint32_t>{150, 199}));
  EXPECT_EQ(cursor, 0u);  // just past 199, wrapped
  cursor = 3;
  EXPECT_EQ(take_all(b.set, cursor, 2), (std::vector<uint32_t>{5, 70}));
  EXPECT_EQ(cursor, 71u);
  EXPECT_EQ(take_all(b.set, cursor), (std::vector<uint32_t>{1}));
}

TEST(IndexSet, EraseReportsWhetherTheIndexWasPresent) {
  Bits b(10);
  b.set.insert(4);
  EXPECT_TRUE(b.set.erase(4));
  EXPECT_FALSE(b.set.erase(4));
  EXPECT_TRUE(b.set.empty());
}

// The memory is shared with other processes (the ready set of the inference transport, which
// its clients write): a bit at or past the capacity, which no insert() makes, is never
// taken as an index (the server used it as a slot number, out of bounds) and does not
// make the set look non-empty (the server spun on it).
TEST(IndexSet, BitsPastTheCapacityWrittenByAnotherProcessAreNeverTaken) {
  Bits b(8);
  b.memory[0] |= uint64_t{1} << 40;  // as a client writing the shared word would
  EXPECT_TRUE(b.set.empty());
  uint32_t cursor = 0;
  EXPECT_TRUE(take_all(b.set, cursor).empty());
  b.set.insert(7);
  EXPECT_EQ(take_all(b.set, cursor), (std::vector<uint32_t>{7}));
  cursor = 5;
  b.set.insert(2);
  EXPECT_EQ(take_all(b.set, cursor), (std::vector<uint32_t>{2}));
}

TEST(IndexSet, ConcurrentProducersAndAConsumerSeeEveryIndexExactlyOnce) {
  constexpr uint32_t kN = 256;
  constexpr int kRounds = 200;
  Bits b(kN);
  std::vector<std::atomic<int>> count(kN);
  std::atomic<int> taken{0};
  // Each producer owns a quarter of the indices and re-inserts an index only after the
  // consumer took it (as a slot goes back to the ready set only after being served).
  std::vector<std::atomic<bool>> out(kN);
  std::vector<std::thread> producers;
  for (uint32_t p = 0; p < 4; ++p) {
    producers.emplace_back([&, p] {
      for (int r = 0; r < kRounds; ++r)
        for (uint32_t i = p; i < kN; i += 4) {
          while (out[i].load(std::memory_order_acquire)) std::this_thread::yield();
          out[i].store(true, std::memory_order_relaxed);
          b.set.insert(i);
        }
    });
  }
  std::thread consumer([&] {
    uint32_t cursor = 0;
    std::vector<uint32_t> buf(kN);
    while (taken.load() < static_cast<int>(kN) * kRounds) {
      size_t n = b.set.take(17, buf.data(), cursor);
      for (size_t k = 0; k < n; ++k) {
        count[buf[k]]++;
        out[buf[k]].store(false, std::memory_order_release);
      }
      taken += static_cast<int>(n);
      if (!n) std::this_thread::yield();
    }
  });
  for (auto& t : producers) t.join();
  consumer.join();
  for (uint32_t i = 0; i < kN; ++i) EXPECT_EQ(count[i].load(), kRounds) << i;
}

TEST(IndexSet, WorksAcrossProcessesInSharedMemory) {
  void* mem = ::mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(mem, MAP_FAILED);
  IndexSet set(mem, 100);
  set.format();
  pid_t pid = ::fork();
  if (pid == 0) {
    IndexSet child(mem, 100);
    for (uint32_t i = 0; i < 100; i += 3) child.insert(i);
    ::_exit(0);
  }
  int status = 0;
  ::waitpid(pid, &status, 0);
  uint32_t cursor = 0;
  std::vector<uint32_t> got = take_all(set, cursor);
  EXPECT_EQ(got.size(), 34u);
  EXPECT_TRUE(std::all_of(got.begin(), got.end(), [](uint32_t i) { return i % 3 == 0; }));
  ::munmap(mem, 4096);
}

TEST(ForkGeneration, ChangesInAForkedChildAndStaysPutOtherwise) {
  const uint64_t mine = tensorwire::os::fork_generation();
  EXPECT_EQ(tensorwire::os::fork_generation(), mine);
  int fds[2];
  ASSERT_EQ(::pipe(fds), 0);
  pid_t pid = ::fork();
  if (pid == 0) {
    uint64_t g = tensorwire::os::fork_generation();
    [[maybe_unused]] ssize_t n = ::write(fds[1], &g, sizeof g);
    ::_exit(0);
  }
  uint64_t child = mine;
  ASSERT_EQ(::read(fds[0], &child, sizeof child), static_cast<ssize_t>(sizeof child));
  ::waitpid(pid, nullptr, 0);
  ::close(fds[0]);
  ::close(fds[1]);
  EXPECT_NE(child, mine);
  EXPECT_EQ(tensorwire::os::fork_generation(), mine);
}

}  // namespace

// Whether thread `tid` of this process is asleep (state S: in the kernel, here in
// futex_wait, the only call that blocks in these threads).
bool asleep(pid_t tid) {
  std::ifstream f("/proc/self/task/" + std::to_string(tid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(f)), {});
  const size_t close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] == 'S';
}

// notify_one() wakes one sleeper per call (a freed inference slot wakes one of the clients
// waiting for one, not all of them), and every sleeper in the end. The sleepers' poll is an
// hour, so only a notification can end their waits within the test. (A waiter that has not
// gone to sleep yet sees any new seq: the test waits until all three are asleep.)
TEST(WaitWord, NotifyOneWakesOneSleeperPerCallAndEverySleeperInTheEnd) {
  using namespace std::chrono;
  tensorwire::os::WaitWord word;
  std::atomic<int> woken{0};
  std::vector<std::atomic<pid_t>> tids(3);
  std::vector<std::thread> sleepers;
  const auto deadline = steady_clock::now() + seconds(60);
  for (int k = 0; k < 3; ++k)
    sleepers.emplace_back([&, k] {
      tids[static_cast<size_t>(k)] = static_cast<pid_t>(::gettid());
      const uint32_t got = word.wait(
          0, deadline, [] { return true; }, tensorwire::os::SpinPolicy{0}, hours(1));
      EXPECT_NE(got, 0u) << "woken by the deadline, not by a notification";
      woken.fetch_add(1);
    });
  auto until = [](auto condition) {
    const auto give_up = steady_clock::now() + seconds(30);
    while (!condition() && steady_clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(1));
    return condition();
  };
  const bool all_asleep = until([&] {
    return word.waiters.load() == 3 &&
           std::all_of(tids.begin(), tids.end(), [](auto& t) { return t > 0 && asleep(t); });
  });
  EXPECT_TRUE(all_asleep);
  word.notify_one();
  EXPECT_TRUE(until([&] { return woken.load() >= 1; }));
  // Had it woken them all, the two others would leave their waits now.
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(woken.load(), 1);
  EXPECT_EQ(word.waiters.load(), 2u);
  word.notify_one();
  word.notify_one();
  for (auto& t : sleepers) t.join();
  EXPECT_EQ(woken.load(), 3);
  EXPECT_EQ(word.waiters.load(), 0u);
}

// WaitBits: a notification wakes exactly the sleepers whose bits it names, in one call,
// and the others sleep on (the inference server wakes a batch's actors 32 at a time this
// way). Four threads sleep on bits 0, 1, 5 and 31 with an hour's poll; notify(bits 1 | 31)
// must wake those two and no other; then the rest. A waiter that is not asleep yet would
// see the new seq anyway, so the test first waits until all four are in the kernel.
TEST(WaitBits, NotifyWakesTheSleepersOfItsBitsOnly) {
  using namespace std::chrono;
  tensorwire::os::WaitBits word;
  const std::vector<uint32_t> bits = {1u << 0, 1u << 1, 1u << 5, 1u << 31};
  std::vector<std::atomic<pid_t>> tids(bits.size());
  std::vector<std::atomic<bool>> woken(bits.size());
  std::vector<std::atomic<int>> returns(bits.size());  // wait() returns with a new seq
  std::vector<std::thread> sleepers;
  const auto deadline = steady_clock::now() + seconds(60);
  for (size_t k = 0; k < bits.size(); ++k)
    sleepers.emplace_back([&, k] {
      tids[k] = static_cast<pid_t>(::gettid());
      // Other bits' notifications move seq too: a waker sets woken[k] before notifying.
      uint32_t seen = 0;
      while (!woken[k].load()) {
        const uint32_t got = word.wait(
            bits[k], seen, deadline, [] { return true; }, tensorwire::os::SpinPolicy{0}, hours(1));
        if (got == seen) break;  // the deadline
        returns[k].fetch_add(1);
        seen = got;
      }
      EXPECT_TRUE(woken[k].load())
          << "bit " << bits[k] << ": the wait ended without a notification";
    });
  auto until = [](auto condition) {
    const auto give_up = steady_clock::now() + seconds(30);
    while (!condition() && steady_clock::now() < give_up)
      std::this_thread::sleep_for(milliseconds(1));
    return condition();
  };
  auto in_kernel = [&](std::vector<size_t> which) {
    return until([&] {
      return std::all_of(which.begin(), which.end(), [&](size_t k) {
        return tids[k] > 0 && asleep(tids[k]) && (word.sleepers.load() & bits[k]) != 0;
      });
    });
  };
  ASSERT_TRUE(in_kernel({0, 1, 2, 3}));
  woken[1] = true;
  woken[3] = true;
  word.notify(bits[1] | bits[3]);
  sleepers[1].join();
  sleepers[3].join();
  // Had the notification reached the others, each would have returned from wait() once
  // with the new seq (and gone back to sleep).
  std::this_thread::sleep_for(milliseconds(200));
  EXPECT_EQ(returns[0].load(), 0);
  EXPECT_EQ(returns[2].load(), 0);
  EXPECT_TRUE(in_kernel({0, 2}));
  EXPECT_EQ(word.sleepers.load(), bits[0] | bits[2]);
  woken[0] = true;
  woken[2] = true;
  word.notify(bits[0] | bits[2]);
  sleepers[0].join();
  sleepers[2].join();
  for (const auto& r : returns) EXPECT_EQ(r.load(), 1);
  EXPECT_EQ(word.sleepers.load(), 0u);
}

// A segment is handed to other processes (the inference transport's clients, a runner's
// workers): none of them can resize it, so none can make the others' accesses SIGBUS.
TEST(Segment, CannotBeResizedByAnyoneItIsHandedTo) {
  auto seg = tensorwire::shm::Segment::create("test", 4096);
  EXPECT_NE(::ftruncate(seg.fd(), 0), 0);
  EXPECT_EQ(errno, EPERM);
  EXPECT_NE(::ftruncate(seg.fd(), 8192), 0);
  auto mapped = tensorwire::shm::Segment::map(seg.fd(), 4096);
  EXPECT_EQ(mapped.size(), 4096u);
}

TEST(Segment, AReceivedSegmentThatCouldBeResizedIsRefused) {
  const int fd = ::memfd_create("unsealed", MFD_CLOEXEC);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, 4096), 0);
  try {
    tensorwire::shm::Segment::map(fd, 4096);
    ADD_FAILURE() << "an unsealed segment was mapped";
  } catch (const tensorwire::ProtocolError& e) {
    EXPECT_NE(std::string(e.what()).find("not sealed"), std::string::npos) << e.what();
  }
  ::close(fd);
}
