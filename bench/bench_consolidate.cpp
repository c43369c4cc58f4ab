// Consolidate and decode, against a single-thread memcpy of the same bytes measured in
// the same run (the foundation issue's benchmark; figures in docs/benchmarks.md).
//
// Two shapes of data:
//   a: 100 float32 leaves of 1 KiB (256 elements): per-leaf overhead dominates
//   b: 4 float32 leaves of 16 MiB: memory bandwidth (and page faults) dominate
//
// Every benchmark reports bytes_per_second (leaf bytes) and items_per_second (leaves).
// bench/run_all.py turns the JSON output into the ratios the targets are stated in.
#include <benchmark/benchmark.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "tensorwire/core/consolidate.h"
#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"
#include "tensorwire/wire/layout.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

struct Case {
  const char* name;
  size_t leaves;
  int64_t elements;  // float32 elements per leaf
};

constexpr Case kCases[] = {
    {"a_100x1KiB", 100, 256},
    {"b_4x16MiB", 4, 4 << 20},
};

// Everything a case's benchmarks need, built once (outside any timing).
struct Fixture {
  tw::TensorDict td;  // not consolidated: one storage per leaf, like tensors from torch
  std::vector<const std::byte*> srcs;
  size_t leaf_bytes = 0;
  size_t total_bytes = 0;
  size_t leaves = 0;
  tw::TensorDict consolidated;
  tw::Json metadata;
  std::vector<std::byte> schema_message;   // SchemaAndStorage: header + JSON + storage
  std::vector<std::byte> storage_message;  // Storage: header + storage

  explicit Fixture(const Case& c) : leaves(c.leaves) {
    for (size_t i = 0; i < c.leaves; ++i) {
      tw::Tensor t = tw::Tensor::empty({c.elements}, tw::DType::Float32);
      float* p = t.data<float>();
      for (int64_t j = 0; j < c.elements; ++j) p[j] = static_cast<float>(i * 7 + j);
      std::string key = std::to_string(i);
      key = "leaf_" + std::string(3 - std::min<size_t>(3, key.size()), '0') + key;  // leaf_007
      srcs.push_back(static_cast<const std::byte*>(t.data()));
      leaf_bytes = t.nbytes();
      td.set(key, std::move(t));
    }
    total_bytes = leaf_bytes * leaves;
    consolidated = tw::consolidate(td);
    metadata = *consolidated.consolidated()->metadata;
    wire::Encoder enc(wire::Mode::Consolidated);
    schema_message = flatten(enc.encode(consolidated));
    storage_message = flatten(enc.encode(consolidated));
  }

  static std::vector<std::byte> flatten(const wire::OutMessage& m) {
    std::vector<std::byte> out(m.header_bytes.begin(), m.header_bytes.end());
    const auto* meta = reinterpret_cast<const std::byte*>(m.metadata.data());
    out.insert(out.end(), meta, meta + m.metadata.size());
    for (const auto& piece : m.payload) out.insert(out.end(), piece.begin(), piece.end());
    return out;
  }
};

Fixture& fixture(size_t i) {
  static std::unique_ptr<Fixture> fixtures[std::size(kCases)];
  if (!fixtures[i]) fixtures[i] = std::make_unique<Fixture>(kCases[i]);
  return *fixtures[i];
}

void count(benchmark::State& state, const Fixture& f) {
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * f.total_bytes));
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * f.leaves));
}

// --- references: a plain single-thread memcpy of each leaf -------------------------

// Into a destination written once before timing: the bandwidth ceiling.
void memcpy_prefaulted(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  std::unique_ptr<std::byte, decltype(&std::free)> dst(
      static_cast<std::byte*>(std::aligned_alloc(64, f.total_bytes)), &std::free);
  std::memset(dst.get(), 0, f.total_bytes);
  for (auto _ : state) {
    std::byte* d = dst.get();
    for (const std::byte* s : f.srcs) {
      std::memcpy(d, s, f.leaf_bytes);
      d += f.leaf_bytes;
    }
    benchmark::DoNotOptimize(d);
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// Into a destination allocated (and freed) each time, as consolidate() must: for large
// sizes this pays the kernel's page faults and page zeroing on first touch.
void memcpy_fresh(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  for (auto _ : state) {
    auto* dst = static_cast<std::byte*>(std::aligned_alloc(64, f.total_bytes));
    std::byte* d = dst;
    for (const std::byte* s : f.srcs) {
      std::memcpy(d, s, f.leaf_bytes);
      d += f.leaf_bytes;
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
    std::free(dst);
  }
  count(state, f);
}

// As memcpy_fresh, with the destination advised to transparent huge pages first (this
// machine has THP in "madvise" mode): what a THP-backed allocation would cost instead.
void memcpy_fresh_thp(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  const auto page = static_cast<uintptr_t>(sysconf(_SC_PAGESIZE));
  for (auto _ : state) {
    auto* dst = static_cast<std::byte*>(std::aligned_alloc(64, f.total_bytes));
    const uintptr_t begin = (reinterpret_cast<uintptr_t>(dst) + page - 1) & ~(page - 1);
    const uintptr_t end = (reinterpret_cast<uintptr_t>(dst) + f.total_bytes) & ~(page - 1);
    if (f.total_bytes >= (2u << 20) && end > begin)  // heap-sized blocks: leave the heap alone
      madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
    std::byte* d = dst;
    for (const std::byte* s : f.srcs) {
      std::memcpy(d, s, f.leaf_bytes);
      d += f.leaf_bytes;
    }
    benchmark::DoNotOptimize(dst);
    benchmark::ClobberMemory();
    std::free(dst);
  }
  count(state, f);
}

// --- sender ------------------------------------------------------------------------

// consolidate(): plan (metadata JSON) + fresh storage + pack + a TensorDict of views.
// The steady state of a loop that consolidates every step: each result is dropped before
// the next consolidate, whose storage (case b: 64 MiB) comes back from the storage cache.
void consolidate(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  for (auto _ : state) {
    tw::TensorDict out = tw::consolidate(f.td);
    benchmark::DoNotOptimize(out);
  }
  count(state, f);
}

// The first consolidation of a size: the storage cache off, every storage freshly mapped
// (with MADV_HUGEPAGE), as memcpy_fresh_thp.
void consolidate_cold(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  const size_t limit = tw::storage_cache_limit();
  tw::set_storage_cache_limit(0);
  for (auto _ : state) {
    tw::TensorDict out = tw::consolidate(f.td);
    benchmark::DoNotOptimize(out);
  }
  tw::set_storage_cache_limit(limit);
  count(state, f);
}

// The sender's steady state: plan again (the structure may have changed) and pack into
// a staging buffer that is reused.
void plan_and_pack(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  tw::Storage staging = tw::Storage::allocate(f.total_bytes, 64);
  std::memset(staging.data(), 0, staging.nbytes());
  for (auto _ : state) {
    tw::ConsolidatedPlan plan = tw::plan_consolidation(f.td);
    tw::pack(f.td, plan, staging.data());
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// pack() alone, with the plan made once.
void pack_only(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  tw::Storage staging = tw::Storage::allocate(f.total_bytes, 64);
  std::memset(staging.data(), 0, staging.nbytes());
  const tw::ConsolidatedPlan plan = tw::plan_consolidation(f.td);
  for (auto _ : state) {
    tw::pack(f.td, plan, staging.data());
    benchmark::ClobberMemory();
  }
  count(state, f);
}

// Encoder::encode of a non-consolidated TensorDict with an unchanged structure: plan,
// serialise and compare the metadata, pack into staging; a Storage message comes out.
void encoder_encode(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  wire::Encoder enc(wire::Mode::Consolidated);
  enc.encode(f.td);
  for (auto _ : state) {
    const wire::OutMessage& m = enc.encode(f.td);
    benchmark::DoNotOptimize(&m);
    benchmark::ClobberMemory();
  }
  if (enc.encode(f.td).header.kind != wire::MessageKind::Storage)
    state.SkipWithError("steady-state encode did not produce a Storage message");
  count(state, f);
}

// --- receiver ----------------------------------------------------------------------

// Copying the metadata JSON object: part of layout_parse_instantiate below (parse()
// consumes its argument), measured alone so it can be subtracted.
void json_copy(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  for (auto _ : state) {
    tw::Json m = f.metadata;
    benchmark::DoNotOptimize(m);
  }
  count(state, f);
}

// The receiver's new-schema path: validate the metadata, then views into the storage.
void layout_parse_instantiate(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  const tw::Storage& storage = f.consolidated.consolidated()->storage;
  const wire::Limits limits;
  for (auto _ : state) {
    tw::Json m = f.metadata;
    wire::ConsolidatedLayout layout =
        wire::ConsolidatedLayout::parse(std::move(m), limits, storage.nbytes());
    tw::TensorDict td = layout.instantiate(storage);
    benchmark::DoNotOptimize(td);
  }
  count(state, f);
}

// instantiate() alone, with a layout parsed once.
void instantiate_only(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  const tw::Storage& storage = f.consolidated.consolidated()->storage;
  const auto layout = wire::ConsolidatedLayout::parse(f.metadata, wire::Limits{}, storage.nbytes());
  for (auto _ : state) {
    tw::TensorDict td = layout.instantiate(storage);
    benchmark::DoNotOptimize(td);
  }
  count(state, f);
}

// Decoder::decode of a SchemaAndStorage message held in one buffer: JSON text parse,
// validation, a fresh storage, the payload copy, the TensorDict.
void decode_schema_message(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  wire::Decoder dec;
  for (auto _ : state) {
    tw::TensorDict& td = dec.decode(f.schema_message);
    benchmark::DoNotOptimize(&td);
  }
  count(state, f);
}

// Decoder::decode of a Storage message (steady state): header checks, then the payload
// lands in the storage of the TensorDict received before.
void decode_storage_message(benchmark::State& state, size_t ci) {
  Fixture& f = fixture(ci);
  wire::Decoder dec;
  dec.decode(f.schema_message);
  for (auto _ : state) {
    tw::TensorDict& td = dec.decode(f.storage_message);
    benchmark::DoNotOptimize(&td);
    benchmark::ClobberMemory();
  }
  count(state, f);
}

using Fn = void (*)(benchmark::State&, size_t);
struct Entry {
  const char* name;
  Fn fn;
};

// Registration order is run order: the references first, then what they bound.
constexpr Entry kBenchmarks[] = {
    {"memcpy_prefaulted", memcpy_prefaulted},
    {"memcpy_fresh", memcpy_fresh},
    {"memcpy_fresh_thp", memcpy_fresh_thp},
    {"consolidate", consolidate},
    {"consolidate_cold", consolidate_cold},
    {"plan_and_pack", plan_and_pack},
    {"pack_only", pack_only},
    {"encoder_encode", encoder_encode},
    {"json_copy", json_copy},
    {"layout_parse_instantiate", layout_parse_instantiate},
    {"instantiate_only", instantiate_only},
    {"decode_schema_message", decode_schema_message},
    {"decode_storage_message", decode_storage_message},
};

}  // namespace

int main(int argc, char** argv) {
  for (size_t ci = 0; ci < std::size(kCases); ++ci)
    for (const Entry& e : kBenchmarks)
      benchmark::RegisterBenchmark((std::string(e.name) + "/" + kCases[ci].name).c_str(), e.fn, ci)
          ->Unit(benchmark::kMicrosecond)
          ->UseRealTime();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
