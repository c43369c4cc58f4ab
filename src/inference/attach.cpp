#include "attach.h"

#include <cerrno>
#include <thread>

#include "runtime/wait.h"

namespace tensorwire::inference::detail {

os::UnixSocket connect_by_name(const std::string& name, Deadline deadline) {
  os::UnixSocket socket;
  int refused = 0;
  const bool connected = runtime::wait_until(deadline, [&](Deadline slice) {
    try {
      socket = os::UnixSocket::connect(name, os::Millis{0});  // one attempt
      return true;
    } catch (const SystemError& e) {
      // Not listening yet, or its backlog is full: try again shortly.
      if (e.code() != ECONNREFUSED && e.code() != EAGAIN && e.code() != ENOENT) throw;
      refused = e.code();
    }
    std::this_thread::sleep_until(slice.min(Deadline::after(std::chrono::milliseconds(10))).when());
    return false;
  });
  if (!connected) throw SystemError("connect to '" + name + "'", refused);
  return socket;
}

std::optional<os::Message> recv_until(os::UnixSocket& socket, Deadline deadline) {
  std::optional<os::Message> m;
  runtime::wait_until(deadline, [&](Deadline slice) {
    m = socket.recv(os::Millis{slice.poll_ms()});
    return m.has_value();
  });
  return m;
}

}  // namespace tensorwire::inference::detail
