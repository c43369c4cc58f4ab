// fuzz_make_corpus DIR [decoder|socket|handshake]: writes a fuzzer's seed corpus, one valid
// input per file.
//   decoder (the default): messages of every kind (as one buffer each, header + metadata +
//     payload), the consolidated metadata alone (for the layout parser) and a saved-file
//     image (for load);
//   socket: inference socket-transport frames of every kind (wire/socket_frame.h);
//   handshake: what a pipe peer sends in its handshake, as real handshakes send it;
//   remote: remote inference frames (wire/remote_frames.h): a request length and a control
//     frame each; and a spec's structure (wire::encode_structure) after the length.
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sample.h"
#include "wire/control_frame.h"
#include "wire/handshake.h"
#include "wire/message_bytes.h"
#include "wire/remote_frames.h"
#include "wire/socket_frame.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

void write(const std::string& path, const void* data, size_t n) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f.write(static_cast<const char*>(data), static_cast<std::streamsize>(n));
  if (!f) throw tw::SystemError("cannot write '" + path + "'", errno);
}

void write(const std::string& path, const std::vector<std::byte>& bytes) {
  write(path, bytes.data(), bytes.size());
}

void write(const std::string& path, const std::string& bytes) {
  write(path, bytes.data(), bytes.size());
}

void socket_corpus(const std::string& dir) {
  using K = wire::SocketFrameKind;
  wire::Encoder enc(wire::Mode::NonConsolidated);
  std::string request = wire::socket_frame(K::Request, 1);
  wire::append_encoded(enc.encode(tw::fuzz::sample(0)), request);
  write(dir + "/request.bin", request);
  std::string strided = wire::socket_frame(K::Request, 2);
  wire::append_encoded(enc.encode(tw::fuzz::strided_sample()), strided);
  write(dir + "/request_strided.bin", strided);
  std::string response = wire::socket_frame(K::Response, 1);
  wire::append_encoded(enc.encode(tw::fuzz::sample(1)), response);
  write(dir + "/response.bin", response);
  write(dir + "/failure.bin", wire::socket_failure_frame(3, {"ValueError", "bad shape", false}));
  write(dir + "/failure_closed.bin",
        wire::socket_failure_frame(4, {"RuntimeError", "the server was closed", true}));
  write(dir + "/refusal.bin",
        wire::socket_failure_frame(0, {"PermissionError", "uid 1000 is not admitted", true}));
  write(dir + "/welcome.bin", wire::socket_frame(K::Welcome, 0));
}

// The messages of real handshakes between two configs, recorded on both sides.
void handshake_corpus(const std::string& dir) {
  struct Stop {};
  const std::string sep = "\n--\n";
  int n = 0;
  for (const char* key : {"", "secret"}) {
    for (int64_t heartbeat : {int64_t{-1}, int64_t{1000}}) {
      const wire::HandshakeConfig config{"pipe", "consolidated", key, heartbeat};
      std::vector<tw::Json> sent;
      auto record = [&](const tw::Json& j) { sent.push_back(j); };
      auto stop = []() -> tw::Json { throw Stop{}; };
      try {
        wire::handshake_as_server(config, record, stop);
      } catch (const Stop&) {
      }
      const tw::Json server_hello = sent.at(0);
      sent.clear();
      bool given = false;
      auto server_says = [&]() -> tw::Json {
        if (given) throw Stop{};
        given = true;
        return server_hello;
      };
      try {
        wire::handshake_as_client(config, record, server_says);
      } catch (const Stop&) {
      }
      const tw::Json client_hello = sent.at(0);
      const tw::Json ok = {{"ok", true}, {"mac", nullptr}};
      const tw::Json refused = {{"ok", false}, {"error", "mode mismatch"}};
      const std::string id = std::to_string(n++);
      // The server's peer is a client; the client's peer a server (hello, then verdict).
      write(dir + "/to_server_" + id + ".json", client_hello.dump());
      write(dir + "/to_client_" + id + ".json", server_hello.dump() + sep + ok.dump());
      write(dir + "/to_client_refused_" + id + ".json", server_hello.dump() + sep + refused.dump());
    }
  }
}

void remote_corpus(const std::string& dir) {
  int n = 0;
  for (const tw::Json& body : {wire::remote::failure_json({"ValueError", "bad observation", false}),
                               wire::remote::failure_json({"RuntimeError", "shutting down", true}),
                               tw::Json{{"num_slots", 64}}, tw::Json{{"heartbeat", true}},
                               tw::Json{{"closed", "the remote transport was closed"}}}) {
    std::vector<std::byte> bytes(8);
    const uint64_t length = 16;
    std::memcpy(bytes.data(), &length, 8);
    std::vector<std::byte> frame = wire::control_frame(body);
    bytes.insert(bytes.end(), frame.begin(), frame.end());
    write(dir + "/frame_" + std::to_string(n++) + ".bin", bytes);
  }
  tw::TensorDict spec;
  spec.set("obs", tw::Tensor::zeros({84, 84, 3}, tw::DType::UInt8));
  spec.set(tw::Key({"info", "mask"}), tw::Tensor::zeros({4}, tw::DType::Bool));
  const std::string structure = wire::encode_structure(spec);
  std::vector<std::byte> bytes(8);
  bytes.insert(bytes.end(), reinterpret_cast<const std::byte*>(structure.data()),
               reinterpret_cast<const std::byte*>(structure.data()) + structure.size());
  write(dir + "/spec_structure.bin", bytes);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string which = argc == 3 ? argv[2] : "decoder";
  if ((argc != 2 && argc != 3) ||
      (which != "decoder" && which != "socket" && which != "handshake" && which != "remote")) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [decoder|socket|handshake|remote]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // a missing DIR is made, parents too
    if (ec) throw tw::SystemError("cannot create '" + dir + "'", ec.value());
    if (which == "socket") {
      socket_corpus(dir);
      return 0;
    }
    if (which == "handshake") {
      handshake_corpus(dir);
      return 0;
    }
    if (which == "remote") {
      remote_corpus(dir);
      return 0;
    }
    // Consolidated: the first message carries the schema, the next (same structure) only
    // the storage: schema id 1, the size the fuzzer's primed decoder expects.
    wire::Encoder cons(wire::Mode::Consolidated);
    write(dir + "/schema_and_storage.bin", tw::fuzz::flatten(cons.encode(tw::fuzz::sample(0))));
    write(dir + "/storage.bin", tw::fuzz::flatten(cons.encode(tw::fuzz::sample(1))));
    // A second schema on the same stream (id 2), from an already consolidated TensorDict.
    write(dir + "/schema_2.bin",
          tw::fuzz::flatten(cons.encode(tw::consolidate(tw::fuzz::strided_sample()))));

    // Non-consolidated: nested dicts, non-tensor values, stacks, a strided leaf, empty.
    wire::Encoder nc(wire::Mode::NonConsolidated);
    write(dir + "/non_consolidated.bin", tw::fuzz::flatten(nc.encode(tw::fuzz::sample(0))));
    write(dir + "/non_consolidated_strided.bin",
          tw::fuzz::flatten(nc.encode(tw::fuzz::strided_sample())));
    write(dir + "/non_consolidated_empty.bin", tw::fuzz::flatten(nc.encode(tw::TensorDict())));

    write(dir + "/control.bin",
          tw::fuzz::flatten(wire::Encoder::control({{"hello", "tensorwire"}, {"version", 1}})));

    const std::string meta = tw::consolidate(tw::fuzz::sample(0)).consolidated()->metadata->dump();
    write(dir + "/metadata.json", meta.data(), meta.size());

    tw::save(tw::fuzz::sample(0), dir + "/saved_file.bin");
  } catch (const tw::Error& e) {
    std::fprintf(stderr, "fuzz_make_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
