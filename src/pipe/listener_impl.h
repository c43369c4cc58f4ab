// ListenerImpl: the state behind a PipeListener (and so a TensorDictServer). Private.
//
// Each client's handshake runs on a thread of its own (at most kMaxHandshakes at once), so
// a client that connects and then says nothing, slowly or on purpose, holds up nobody but
// itself until its connect timeout; accept() hands out pipes in the order their handshakes
// complete. A completed handshake, or a failed one, signals the listener's worker, so a
// caller asleep on fd() (the asyncio loop) wakes for it; accept() itself only polls and
// starts handshakes, and returns at once with a timeout of 0.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "tensorwire/pipe/pipe.h"
#include "ucx/ucx.h"

namespace tensorwire::detail {

class PipeImpl;

class ListenerImpl {
 public:
  // Handshakes in progress at most; further clients wait in UCX's queue of connection
  // requests until one ends.
  static constexpr size_t kMaxHandshakes = 32;
  // Handshakes one accept() step starts at most (each makes a UCX worker: milliseconds).
  static constexpr size_t kStartsPerCall = 4;

  ListenerImpl(uint16_t port, const PipeOptions& options);
  ~ListenerImpl();  // closes

  std::optional<TensorDictPipe> accept(
      Timeout timeout, bool throw_on_refusal,
      const std::function<TensorDictPipe(std::shared_ptr<PipeImpl>)>& wrap);

  uint16_t port() const { return port_; }
  int fd();
  // False when accept() has something to do now: a completed handshake, a connection request
  // it can start, or events on the worker.
  bool arm();
  // Releases the port at once (later clients are refused by the operating system) and ends
  // the handshakes in progress (each thread closes its pipe, side by side, and is joined);
  // pipes whose handshake completed but that accept() had not handed out are closed. An
  // accept() in another thread throws ClosedError. In a forked child, the parent's listener
  // and handshakes are left alone (ucx::Listener leaks it there).
  void close();
  bool closed();
  size_t refused() const { return refused_; }
  std::string last_refusal();  // a copy, under mu_: accept() on another thread writes it

 private:
  struct Handshake {
    std::shared_ptr<PipeImpl> pipe;
    std::thread thread;
    bool done = false;  // under mu_: the thread has handed its outcome over
    // Joins: a list of handshakes that goes away (an exception included) waits for their
    // threads, never destroys one still joinable (std::terminate). Never under mu_.
    ~Handshake() {
      if (thread.joinable()) thread.join();
    }
  };
  // A handshake's outcome: the pipe, or why the client was refused.
  struct Outcome {
    std::shared_ptr<PipeImpl> pipe;
    std::string refusal;
    std::exception_ptr error;
  };
  // A refusal of the client at `peer`: "client <peer>: <why>", and what accept() rethrows.
  static Outcome refused(const std::string& peer, const std::string& why, std::exception_ptr error);

  static std::shared_ptr<ucx::Listener> open(uint16_t port);
  // Not under mu_, which a handshake thread of the parent may have held at the fork:
  // ClosedError in a forked child.
  void check_not_inherited() const;
  void check_usable() const;  // under mu_
  [[noreturn]] void throw_closed() const;
  // Under mu_; what it has to report goes to `warnings`, logged once mu_ is let go of (a
  // log record takes the GIL, which a Python thread waiting for mu_ may hold).
  void start_handshake(ucx::ConnRequest request, std::vector<std::string>& warnings);
  // Under mu_: a connection request waits and a handshake may start now.
  bool can_start() const;
  void run_handshake(Handshake& h, std::shared_ptr<ucx::Listener> keep, const std::string& peer);
  // Under mu_: the handshakes whose threads are done, to join (destroy) without the lock.
  std::list<Handshake> finished();
  // In a forked child: the parent's handshake threads do not exist here (joining one would
  // wait for ever); their records are left behind with the parent's UCX state.
  void leave_inherited_handshakes() noexcept;

  PipeOptions options_;
  uint64_t generation_;
  pid_t owner_pid_;
  std::mutex mu_;
  // Null once closed. Shared with each handshake's thread, whose connection request belongs
  // to it: destroying it under a handshake freed the request UCX was still using (a crash,
  // or a spin for ever, when a server closed during a handshake).
  std::shared_ptr<ucx::Listener> listener_;
  uint16_t port_;
  std::list<Handshake> running_;  // under mu_; a list: each thread holds its element
  std::deque<Outcome> ready_;     // under mu_: handshakes over, in the order they ended
  std::atomic<size_t> refused_{0};
  std::string last_refusal_;
};

}  // namespace tensorwire::detail
