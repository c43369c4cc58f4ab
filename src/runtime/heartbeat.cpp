#include "runtime/heartbeat.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "os/fork.h"

namespace tensorwire::runtime {

namespace {

using Clock = std::chrono::steady_clock;

struct Entry {
  std::weak_ptr<Beating> who;
  Clock::duration period;
  Clock::time_point next;
};

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Entry> entries;
  bool running = false;
  bool beating = false;  // the thread is in beat() calls
  bool exiting = false;  // exit() began: beat no more
  uint64_t generation = os::fork_generation();
};

// Never destroyed: the thread may outlive static destruction at exit. A forked child gets a
// fresh one (the parent's mutex may have been held by the parent's thread at the fork).
// Made at first use without a function-local static's guard, which a fork() during its
// initialization would leave held in the child for ever (docs/design.md, fork awareness).
std::atomic<Registry*> g_current{nullptr};

Registry& registry() {
  Registry* r = g_current.load();
  while (r == nullptr || r->generation != os::fork_generation()) {
    Registry* fresh = new Registry;
    if (g_current.compare_exchange_strong(r, fresh)) return *fresh;
    delete fresh;  // another thread published one first: r now holds it
  }
  return *r;
}

void run(Registry* r) {
  std::unique_lock<std::mutex> lock(r->mu);
  std::vector<std::shared_ptr<Beating>> due;
  while (true) {
    const auto now = Clock::now();
    auto next = now + std::chrono::seconds(1);
    for (auto it = r->entries.begin(); it != r->entries.end();) {
      auto who = it->who.lock();
      if (!who) {
        it = r->entries.erase(it);
        continue;
      }
      if (now >= it->next) {
        due.push_back(std::move(who));
        it->next = now + it->period;
      }
      next = std::min(next, it->next);
      ++it;
    }
    if (r->entries.empty() || r->exiting) {
      r->running = false;
      return;
    }
    r->beating = true;
    lock.unlock();
    for (auto& who : due) who->beat();
    due.clear();  // outside the lock: the last reference may be dropped here
    lock.lock();
    r->beating = false;
    r->cv.notify_all();
    r->cv.wait_until(lock, next);
  }
}

// At exit: no beat may run while libraries (UCX among them) tear down their state after
// the atexit handlers, so the thread stops here, after the beat in progress if any.
void stop_at_exit() {
  Registry& r = registry();
  std::unique_lock<std::mutex> lock(r.mu);
  r.exiting = true;
  r.cv.notify_all();
  r.cv.wait_for(lock, std::chrono::seconds(2), [&] { return !r.beating; });
}

}  // namespace

void keep_alive(std::weak_ptr<Beating> who, std::chrono::milliseconds period) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mu);
  const Clock::duration p = std::max<Clock::duration>(period, std::chrono::milliseconds(10));
  r.entries.push_back({std::move(who), p, Clock::now()});
  // A flag, not std::call_once, for the same reason as g_current.
  static std::atomic<bool> at_exit{false};
  if (!at_exit.exchange(true)) std::atexit(stop_at_exit);
  if (r.exiting) return;
  if (!r.running) {
    std::thread(run, &r).detach();  // throws (std::system_error) with running still false
    r.running = true;
  } else {
    r.cv.notify_one();
  }
}

}  // namespace tensorwire::runtime
