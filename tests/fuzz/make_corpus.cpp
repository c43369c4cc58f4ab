// fuzz_make_corpus DIR [REMOTE_DIR]: writes the fuzzer's seed corpus, one valid input per file
// (and, with REMOTE_DIR, fuzz_remote_frames' seeds: a length and a control frame each):
// messages of every kind (as one buffer each, header + metadata + payload), the
// consolidated metadata alone (for the layout parser) and a saved-file image (for load).
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "sample.h"
#include "wire/control_frame.h"
#include "wire/remote_frames.h"

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

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR [REMOTE_CORPUS_DIR]\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  try {
    if (argc == 3) {
      const std::string rdir = argv[2];
      std::filesystem::create_directories(rdir);
      int n = 0;
      for (const tw::Json& body :
           {wire::remote::failure_json({"ValueError", "bad observation", false}),
            wire::remote::failure_json({"RuntimeError", "shutting down", true}),
            tw::Json{{"num_slots", 64}}, tw::Json{{"heartbeat", true}},
            tw::Json{{"closed", "the remote transport was closed"}}}) {
        std::vector<std::byte> bytes(8);
        const uint64_t length = 16;
        std::memcpy(bytes.data(), &length, 8);
        std::vector<std::byte> frame = wire::control_frame(body);
        bytes.insert(bytes.end(), frame.begin(), frame.end());
        write(rdir + "/frame_" + std::to_string(n++) + ".bin", bytes);
      }
    }
    std::error_code ec;
    std::filesystem::create_directories(dir, ec);  // a missing DIR is made, parents too
    if (ec) throw tw::SystemError("cannot create '" + dir + "'", ec.value());
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
