// The liveness thread: one helper thread per process that calls beat() on every registered
// connection at its period, so a connection sends heartbeats and checks its peer's even while
// the program does not call it (a peer that waits for our next message must not take our
// silence for a vanished host). Connections that cross hosts register here; nothing else
// runs on this thread.
//
// The thread starts at the first registration and ends when no registered object is left.
// A forked child starts its own: what its parent registered is dropped there (objects
// inherited through fork() are unusable anyway). At exit() the thread stops (an atexit
// handler waits for the beat in progress), so no beat runs while libraries tear down.
#pragma once

#include <chrono>
#include <memory>

namespace tensorwire::runtime {

// Owned by a shared_ptr (keep_alive takes weak_from_this()).
class Beating : public std::enable_shared_from_this<Beating> {
 public:
  virtual ~Beating() = default;
  // Called on the liveness thread about every period: send a heartbeat if due, take in the
  // peer's, fail the connection if the peer was silent too long. Must not block for long
  // (it holds up every other connection's heartbeats) and must not throw.
  virtual void beat() noexcept = 0;
};

// Calls `who->beat()` every `period` (at least 10 ms) until `who` expires.
void keep_alive(std::weak_ptr<Beating> who, std::chrono::milliseconds period);

}  // namespace tensorwire::runtime
