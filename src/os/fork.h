// Fork detection for objects that hold per-process state.
//
// After fork() the child holds a byte-for-byte copy of its parent's objects: a client id,
// a connected socket, a std::thread handle that does not exist in the child. An object
// that records fork_generation() when it sets up such state can tell, with one load, that
// it now lives in a forked child and must start over (reconnect, get its own id) instead
// of acting as its parent. The generation changes in the child of every fork() made
// through libc (os.fork, multiprocessing's "fork" start method), via pthread_atfork.
//
// Thread-safety: fork_generation() may be called from any thread.
#pragma once

#include <cstdint>
#include <memory>

namespace tensorwire::os {

// A value that is the same for the whole life of a process and differs in each forked
// child from its parent's (and from the child's own children's).
uint64_t fork_generation() noexcept;
// Whether this process is a fork() child (at any depth) of the one that loaded the library.
inline bool forked() noexcept {
  return fork_generation() != 0;
}

// Keeps what `owner` holds for the rest of this process, never destroying it: for the copy
// a forked child inherited of an object whose mutexes, condition variables or threads are
// its parent's. Destroying a condition variable that a parent's thread waited on at the
// fork blocks for ever in the child (glibc waits for waiters that do not exist here), and
// joining a thread of the parent fails. The memory is the child's copy and goes with it.
template <class T>
void leak(std::shared_ptr<T> owner) noexcept {
  static_cast<void>(new std::shared_ptr<T>(std::move(owner)));
}
template <class T>
void leak(std::unique_ptr<T> owner) noexcept {
  static_cast<void>(owner.release());
}

}  // namespace tensorwire::os
