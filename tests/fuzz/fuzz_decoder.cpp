// libFuzzer target: arbitrary bytes into every entry point that reads untrusted input.
//
//   (a) Decoder::decode on the input, fresh decoder;
//   (b) the input (header CRC repaired, so mutations of the header fields get past the
//       checksum) into decoders that already hold the sample's schema, with and without a
//       caller's `into` TensorDict, so Storage-message paths are reached; a rejected
//       message must leave what was received before byte-for-byte untouched;
//   (c) ConsolidatedLayout::parse on the input as JSON, storage_bytes = input size;
//   (d) tensorwire::load on the input as a file (a memfd, opened as /proc/self/fd/N).
//
// Anything accepted must be readable (every leaf byte is read, so ASan checks the views)
// and must survive a re-encode/decode round trip unchanged. A bad input may only be
// refused with tensorwire::ProtocolError; another tensorwire::Error is reported as a
// finding, and anything else (std::bad_alloc included: the limits below must stop large
// allocations first) escapes and libFuzzer reports it.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <typeinfo>
#include <vector>

#include "check.h"
#include "sample.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

constexpr wire::Limits kLimits = tw::fuzz::limits();
using tw::fuzz::finding;
using tw::fuzz::kRoundTripLimits;
using tw::fuzz::touch;
using tw::fuzz::unexpected;

// FUZZ_DECODER_VERBOSE=1: say what each step made of the input (for triaging a file).
void note(const char* step, const char* outcome) {
  static const bool verbose = std::getenv("FUZZ_DECODER_VERBOSE") != nullptr;
  if (verbose) std::fprintf(stderr, "  %s: %s\n", step, outcome);
}

// Independent of the library's: CRC-32 (IEEE 802.3, reflected, zlib's crc32()).
uint32_t crc32(const std::byte* p, size_t n) {
  uint32_t c = 0xFFFFFFFFu;
  for (size_t i = 0; i < n; ++i) {
    c ^= static_cast<uint8_t>(p[i]);
    for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
  }
  return c ^ 0xFFFFFFFFu;
}

// The raw storage bytes of a consolidated TensorDict (padding included).
std::vector<std::byte> storage_bytes(const tw::TensorDict& td) {
  const tw::Storage& s = td.consolidated()->storage;
  return {s.data(), s.data() + s.nbytes()};
}

// Re-encodes what was accepted and decodes it again with a fresh decoder: the result must
// equal the original.
void round_trip(const tw::TensorDict& td, wire::MessageKind kind) {
  const wire::Mode mode = kind == wire::MessageKind::NonConsolidated ? wire::Mode::NonConsolidated
                                                                     : wire::Mode::Consolidated;
  try {
    wire::Encoder enc(mode);
    std::vector<std::byte> msg = tw::fuzz::flatten(enc.encode(td));
    wire::Decoder dec(kRoundTripLimits);
    const tw::TensorDict& back = dec.decode(msg);
    std::string why;
    if (!tw::equal(td, back, &why)) finding("round trip changed the TensorDict: " + why);
  } catch (const tw::Error& e) {
    finding(std::string("an accepted message does not round-trip: ") + e.what());
  }
}

const std::vector<std::byte>& schema_message() {
  static const std::vector<std::byte> msg = [] {
    wire::Encoder enc(wire::Mode::Consolidated);
    return tw::fuzz::flatten(enc.encode(tw::fuzz::sample()));
  }();
  return msg;
}

// (a) one message into a decoder that has received nothing.
void decode_fresh(std::span<const std::byte> input) {
  wire::Decoder dec(kLimits);
  try {
    tw::TensorDict& td = dec.decode(input);
    touch(td);
    note("(a) fresh decoder", "accepted");
  } catch (const tw::ProtocolError& e) {
    note("(a) fresh decoder", e.what());
  } catch (const tw::Error& e) {
    unexpected("(a) fresh decoder", e);
  }
}

// A decoder that has received the sample's schema. Priming costs more than most inputs,
// so one is kept across inputs and put back exactly as it was after each: its storage
// bytes restored after a Storage message, rebuilt after a new schema.
struct Primed {
  wire::Decoder dec{kLimits};
  tw::TensorDict* received;  // the decoder's own TensorDict (target of Storage messages)
  tw::TensorDict snapshot;   // a deep copy, to compare against
  std::vector<std::byte> raw;

  Primed()
      : received(&dec.decode(schema_message())),
        snapshot(received->clone()),
        raw(storage_bytes(*received)) {}
  void restore() { std::memcpy(received->consolidated()->storage.data(), raw.data(), raw.size()); }
  bool unchanged(std::string* why) const {
    if (!tw::equal(*received, snapshot, why)) return false;
    if (storage_bytes(*received) != raw) return *why = "storage bytes differ", false;
    return true;
  }
};

// (b) the input into a decoder that holds the sample's schema. With `use_into`, a
// TensorDict of the same layout received by another decoder is passed as the
// Storage-message destination.
void decode_after_schema(std::span<const std::byte> input, bool use_into) {
  static std::unique_ptr<Primed> primed[2];
  static std::unique_ptr<Primed> into_owner;
  std::unique_ptr<Primed>& p = primed[use_into ? 1 : 0];
  if (!p) p = std::make_unique<Primed>();
  if (use_into && !into_owner) into_owner = std::make_unique<Primed>();
  tw::TensorDict* into = use_into ? into_owner->received : nullptr;
  const char* step = use_into ? "(b) after a schema, into" : "(b) after a schema";

  wire::MessageKind kind{};
  bool accepted = false;
  try {
    if (input.size() >= wire::kHeaderBytes) kind = static_cast<wire::MessageKind>(input[6]);
    tw::TensorDict& td = p->dec.decode(input, into);
    accepted = true;
    touch(td);
    note(step, "accepted");
    if (kind == wire::MessageKind::Storage && use_into && &td != into)
      finding("a storage message for a matching `into` was not written into it");
    round_trip(td, kind);
  } catch (const tw::ProtocolError& e) {
    note(step, e.what());
  } catch (const tw::Error& e) {
    unexpected(step, e);
  }
  // What was received before stays as it was, unless this message legitimately
  // replaced it (a new schema) or refilled it (a storage message for it).
  const bool replaced = accepted && kind == wire::MessageKind::SchemaAndStorage;
  const bool refilled = accepted && kind == wire::MessageKind::Storage;
  std::string why;
  if (!replaced && !(refilled && !use_into) && !p->unchanged(&why))
    finding("a rejected or unrelated message changed the received TensorDict: " + why);
  if (use_into && !refilled && !into_owner->unchanged(&why))
    finding("a rejected or unrelated message changed the caller's `into` TensorDict: " + why);

  if (replaced) {
    p.reset();
  } else if (refilled) {
    (use_into ? into_owner : p)->restore();
  }
}

// (c) the input as consolidated metadata for a storage of input-size bytes. A layout
// that parse() accepted must instantiate without any error.
void parse_layout(std::span<const std::byte> input) {
  std::optional<wire::ConsolidatedLayout> layout;
  try {
    tw::Json meta = wire::parse_untrusted_json(input, kLimits, "metadata");
    layout = wire::ConsolidatedLayout::parse(std::move(meta), kLimits, input.size());
  } catch (const tw::ProtocolError& e) {
    note("(c) layout", e.what());
    return;
  } catch (const tw::Error& e) {
    unexpected("(c) layout", e);
  }
  if (layout->total_bytes() > input.size())
    finding("layout larger than the storage it was checked against");
  tw::Storage storage = tw::Storage::allocate(input.size(), 64);
  if (!input.empty()) std::memcpy(storage.data(), input.data(), input.size());
  try {
    touch(layout->instantiate(storage));
  } catch (const tw::Error& e) {
    finding(std::string("a layout that parse() accepted does not instantiate: ") + e.what());
  }
  note("(c) layout", "accepted");
}

// (d) the input as a saved file.
void load_file(std::span<const std::byte> input) {
  static const int fd = [] {
    int f = ::memfd_create("fuzz_decoder", MFD_CLOEXEC);
    if (f < 0) finding("memfd_create failed");
    return f;
  }();
  static const std::string path = "/proc/self/fd/" + std::to_string(fd);
  if (::ftruncate(fd, 0) != 0) finding("ftruncate failed");
  size_t done = 0;
  while (done < input.size()) {
    ssize_t w = ::pwrite(fd, input.data() + done, input.size() - done, static_cast<off_t>(done));
    if (w <= 0) finding("pwrite failed");
    done += static_cast<size_t>(w);
  }
  try {
    tw::TensorDict td = tw::load(path, kLimits);
    touch(td);
    note("(d) load", "accepted");
  } catch (const tw::ProtocolError& e) {
    note("(d) load", e.what());
  } catch (const tw::Error& e) {
    unexpected("(d) load", e);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> input(reinterpret_cast<const std::byte*>(data), size);

  decode_fresh(input);

  // The same bytes with a valid header checksum, so the fuzzer's header mutations reach
  // the rules behind the CRC check.
  std::vector<std::byte> fixed(input.begin(), input.end());
  if (fixed.size() >= wire::kHeaderBytes) {
    const uint32_t crc = crc32(fixed.data(), 36);
    for (int i = 0; i < 4; ++i) fixed[36 + i] = static_cast<std::byte>((crc >> (8 * i)) & 0xff);
  }
  decode_after_schema(fixed, /*use_into=*/false);
  decode_after_schema(fixed, /*use_into=*/true);

  parse_layout(input);
  load_file(input);
  return 0;
}
