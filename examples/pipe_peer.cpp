// pipe_peer: a small C++ program on the other end of a TensorDictPipe. It is an example of
// the C++ API and the peer that the C++ and Python tests run in a second process.
//
//   pipe_peer send HOST PORT COUNT [--nc] [--key K] [--change-at N] [--big BYTES] [--hang]
//       connects and sends COUNT dicts {"x": float32[4] = i, "nested": {"y": int64[4]},
//       "label": "step"}; with --change-at N the structure changes from message N on;
//       --hang: sleep forever after sending (to be killed).
//   pipe_peer recv PORT COUNT [--nc] [--key K]
//       listens on PORT (0: prints "PORT <n>" on stdout) and checks COUNT such dicts.
//   pipe_peer echo HOST PORT COUNT [--nc] [--key K]
//       connects, receives COUNT dicts and sends each back.
// Exit status: 0 on success, 3 on a tensorwire error (message on stderr).
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "tensorwire/pipe/pipe.h"
#include "tensorwire/tensorwire.h"

using namespace tensorwire;

namespace {

TensorDict make(int i, bool changed, size_t big) {
  TensorDict td({4});
  td.set("x", Tensor::from_vector<float>({1.f * i, 1.f * i, 1.f * i, 1.f * i}, {4}));
  td.set({"nested", "y"}, Tensor::from_vector<int64_t>({i, i + 1, i + 2, i + 3}, {4}));
  td.set("label", NonTensor{"step"});
  if (changed) td.set("extra", Tensor::zeros({4, 2}, DType::Float64));
  if (big) {
    Tensor b = Tensor::empty({4, static_cast<int64_t>(big / 4)}, DType::UInt8);
    std::memset(b.data(), i & 0xff, b.nbytes());
    td.set("big", b);
  }
  return td;
}

bool check(const TensorDict& td, int i) {
  return td.get("x").data<float>()[0] == static_cast<float>(i) &&
         td.get({"nested", "y"}).data<int64_t>()[3] == i + 3 &&
         td.get_non_tensor("label") == "step";
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: see the comment at the top of examples/pipe_peer.cpp\n");
    return 2;
  }
  std::string cmd = argv[1];
  PipeOptions opt;
  int change_at = -1;
  size_t big = 0;
  bool hang = false;
  std::vector<std::string> pos;
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--nc")
      opt.consolidated = false;
    else if (a == "--key" && i + 1 < argc)
      opt.auth_key = argv[++i];
    else if (a == "--change-at" && i + 1 < argc)
      change_at = std::atoi(argv[++i]);
    else if (a == "--big" && i + 1 < argc)
      big = std::strtoull(argv[++i], nullptr, 10);
    else if (a == "--hang")
      hang = true;
    else
      pos.push_back(a);
  }
  try {
    if (cmd == "send" && pos.size() == 3) {
      auto pipe = TensorDictPipe::connect(pos[0], static_cast<uint16_t>(std::stoi(pos[1])), opt);
      int n = std::stoi(pos[2]);
      for (int i = 0; i < n; ++i) pipe.send(make(i, change_at >= 0 && i >= change_at, big));
      if (hang) std::this_thread::sleep_for(std::chrono::hours(1));
      pipe.close();
      return 0;
    }
    if (cmd == "recv" && pos.size() == 2) {
      auto pipe =
          TensorDictPipe::listen(static_cast<uint16_t>(std::stoi(pos[0])), opt, [](uint16_t port) {
            std::printf("PORT %u\n", port);
            std::fflush(stdout);
          });
      int n = std::stoi(pos[1]);
      for (int i = 0; i < n; ++i) {
        TensorDict& td = pipe.recv();
        if (!check(td, i)) {
          std::fprintf(stderr, "pipe_peer: message %d has wrong values\n", i);
          return 1;
        }
      }
      std::printf("OK %d\n", n);
      std::fflush(stdout);
      return 0;
    }
    if (cmd == "echo" && pos.size() == 3) {
      auto pipe = TensorDictPipe::connect(pos[0], static_cast<uint16_t>(std::stoi(pos[1])), opt);
      int n = std::stoi(pos[2]);
      for (int i = 0; i < n; ++i) pipe.send(pipe.recv());
      pipe.close();
      return 0;
    }
  } catch (const Error& e) {
    std::fprintf(stderr, "pipe_peer: %s\n", e.what());
    return 3;
  }
  std::fprintf(stderr, "pipe_peer: bad arguments\n");
  return 2;
}
