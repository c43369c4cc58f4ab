// Built by tests/package/run.sh against an installed tensorwire: the public headers, the
// library and every dependency its exported targets name must be found through
// find_package(tensorwire) alone. Only the umbrella header is included: it promises every
// type a C++ user needs, and this file uses some of each layer's.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <tensorwire/tensorwire.h>

using namespace tensorwire;

namespace {

int failures = 0;

void check(bool ok, const char* what) {
  if (!ok) {
    std::fprintf(stderr, "FAIL: %s\n", what);
    ++failures;
  }
}

}  // namespace

int main() {
  TensorDict td({4});
  td.set("obs", Tensor::from_vector<float>({0.5f, 1.5f, 2.5f, 3.5f}, {4}));
  td.set({"next", "reward"}, Tensor::from_vector<int64_t>({10, 20, 30, 40}, {4, 1}));
  td.set("env", NonTensor{"CartPole-v1"});

  TensorDict c = consolidate(td);
  check(is_consolidated_root(c), "consolidate() returns a consolidated root");
  check(c.get("obs").at<float>({2}) == 2.5f, "obs[2] == 2.5 after consolidate");
  check(c.get({"next", "reward"}).at<int64_t>({3, 0}) == 40, "next.reward[3] == 40");
  check(c.get("obs").storage().data() == c.get({"next", "reward"}).storage().data(),
        "leaves share one storage");

  // The wire codec: one message out, the same TensorDict back.
  wire::Encoder encoder(wire::Mode::Consolidated);
  const wire::OutMessage& msg = encoder.encode(c);
  std::vector<std::byte> bytes(msg.header_bytes.begin(), msg.header_bytes.end());
  for (char ch : msg.metadata) bytes.push_back(static_cast<std::byte>(ch));
  for (auto piece : msg.payload) bytes.insert(bytes.end(), piece.begin(), piece.end());
  wire::Decoder decoder;
  TensorDict& back = decoder.decode(bytes);
  std::string why;
  check(equal(back, td, &why), ("decoded equals the original: " + why).c_str());

  // Link the transports too (UCX, ZeroMQ, OpenSSL), without starting them: their objects
  // in the static library pull in the libraries the exported target must name.
  // volatile: the compiler may not fold the pointers away, so the linker must resolve them.
  static auto* volatile connect = &TensorDictPipe::connect;
  static auto* volatile send_zmq = &dataflow::send_dataflow_zmq;
  static auto* volatile remote_connect = &inference::RemoteTransport::connect;
  check(connect != nullptr && send_zmq != nullptr && remote_connect != nullptr,
        "transport entry points linked");
  // A refused handshake is a public type a caller can catch.
  try {
    throw HandshakeError("authentication failed");
  } catch (const Error& e) {
    check(dynamic_cast<const HandshakeError*>(&e) != nullptr, "HandshakeError is an Error");
  }

  // Inference through the public headers only: a request through a thread transport's
  // client, answered by hand on the server side, with the one Timeout type.
  {
    auto transport = inference::ThreadTransport::create();
    inference::Client client = transport->client();
    check(client.valid(), "a thread transport hands out a client");
    bool timed_out = false;
    try {
      TensorDict request;
      request.set("obs", Tensor::from_vector<float>({1.0f}, {1}));
      client.submit(request).result(Timeout(std::chrono::milliseconds(1)));
    } catch (const TimeoutError&) {
      timed_out = true;  // no server: the request stays in flight
    }
    check(timed_out, "result() without a server times out");
  }

  if (failures) return 1;
  std::printf("consumer OK: %s\n", describe(c).c_str());
  return 0;
}
