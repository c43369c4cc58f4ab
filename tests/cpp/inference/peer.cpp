// A separate program for the process tests: an unrelated process that serves a
// transport, or attaches to one by name.
//
//   inference_peer serve shm|socket NAME SLOTS DELAY_MS   serve until killed or stdin closes
//   inference_peer client shm|socket NAME COUNT           COUNT checked round trips, exit 0
//   inference_peer hold NAME                              submit one request and wait to be killed
// Each prints "ready" (serve) or "submitted" (hold) on stdout when it has got that far.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "common.h"

using namespace tw_test;

int main(int argc, char** argv) {
  if (argc < 3) return 2;
  std::string cmd = argv[1];
  try {
    if (cmd == "serve" && argc == 6) {
      std::string kind = argv[2], name = argv[3];
      const int delay = std::atoi(argv[5]);
      std::shared_ptr<Transport> t;
      if (kind == "shm") {
        t = make_shm(static_cast<uint32_t>(std::atoi(argv[4])), true, name);
      } else {
        SocketOptions o;
        o.name = name;
        t = SocketTransport::create(o);
      }
      InferenceServer server(
          [delay](const TensorDict& b) {
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            return double_policy(b);
          },
          t);
      server.start();
      std::printf("ready\n");
      std::fflush(stdout);
      char buf[64];
      while (std::fgets(buf, sizeof buf, stdin)) {
      }
      server.shutdown();
      return 0;
    }
    if (cmd == "client" && argc == 5) {
      std::string kind = argv[2], name = argv[3];
      const int count = std::atoi(argv[4]);
      Client c = kind == "shm" ? SharedMemoryTransport::client_for(name)
                               : SocketTransport::client_for(name);
      for (int i = 0; i < count; ++i) {
        TensorDict r = c(observation(static_cast<float>(i)), 10s);
        if (action0(r) != 2.0f * static_cast<float>(i)) {
          std::fprintf(stderr, "request %d: wrong action %f\n", i, action0(r));
          return 1;
        }
      }
      std::printf("done %d\n", count);
      return 0;
    }
    if (cmd == "hold" && argc == 3) {
      Client c = SharedMemoryTransport::client_for(argv[2]);
      Future f = c.submit(observation(1));
      std::printf("submitted\n");
      std::fflush(stdout);
      f.result();
      std::this_thread::sleep_for(std::chrono::hours(1));
      return 0;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "inference_peer %s: %s\n", cmd.c_str(), e.what());
    return 1;
  }
  return 2;
}
