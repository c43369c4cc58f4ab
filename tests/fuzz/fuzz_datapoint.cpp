// libFuzzer target: arbitrary bytes as the metadata of a received datapoint (what a remote
// producer controls), through the datapoint decoder (wire/datapoint.h):
//
//   parse_untrusted_json -> ConsolidatedLayout::parse (storage of kStorageBytes) ->
//   DatapointDecoder::structure (with and without allow_pickle) -> check_values (what a
//   receiver runs on each message) -> every value read.
//
// A bad input may only be refused with tensorwire::ProtocolError; another tensorwire::Error
// is a finding, anything else escapes and libFuzzer reports it. Reading every value of an
// accepted structure lets ASan check that no element points outside the storage.
// Seeds: tests/fuzz/datapoint_corpus/ (metadata of real Python datapoints).
#include <span>

#include "check.h"
#include "tensorwire/wire/datapoint.h"
#include "tensorwire/wire/decoder.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

constexpr wire::Limits kLimits = tw::fuzz::limits(/*max_depth=*/64);
constexpr uint64_t kStorageBytes = 4096;

uint64_t g_sink = 0;  // keeps the reads from being optimised away

void read_all(const tw::Storage& s, const wire::DatapointNode& n) {
  for (const auto& e : n.elements) {
    using K = wire::ElementKind;
    switch (e.kind) {
      case K::Node:
        read_all(s, *e.child);
        break;
      case K::None:
        break;
      case K::Bool:
        g_sink += wire::DatapointDecoder::read_bool(s, e);
        break;
      case K::Int:
        g_sink += static_cast<uint64_t>(wire::DatapointDecoder::read_int(s, e));
        break;
      case K::Float:
        g_sink += wire::DatapointDecoder::read_float(s, e) > 0;
        break;
      case K::Str:
        try {
          g_sink += wire::DatapointDecoder::read_str(s, e).size();
        } catch (const tw::ProtocolError&) {
        }
        break;
      default:
        for (std::byte b : wire::DatapointDecoder::read_bytes(s, e))
          g_sink += std::to_integer<int>(b);
        if (e.kind == K::Array || e.kind == K::Torch || e.kind == K::Scalar)
          (void)tw::Tensor::view(s, e.offset, tw::Shape(e.shape.begin(), e.shape.end()), e.dtype);
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const tw::Storage storage = [] {
    tw::Storage s = tw::Storage::allocate(kStorageBytes);
    for (uint64_t i = 0; i < kStorageBytes; ++i) s.data()[i] = static_cast<std::byte>(i * 37);
    return s;
  }();
  tw::fuzz::refused_or_ok([&] {
    const auto bytes = std::as_bytes(std::span(data, size));
    tw::Json meta = wire::parse_untrusted_json(bytes, kLimits, "datapoint metadata");
    const wire::ConsolidatedLayout layout =
        wire::ConsolidatedLayout::parse(std::move(meta), kLimits, kStorageBytes);
    for (bool allow_pickle : {true, false}) {
      try {
        auto root = wire::DatapointDecoder::structure(layout, allow_pickle);
        if (!root) continue;
        try {
          wire::DatapointDecoder::check_values(*root, storage);
        } catch (const tw::ProtocolError&) {
        }
        read_all(storage, *root);
      } catch (const tw::ProtocolError&) {
      }
    }
  });
  return 0;
}
