// The server side of a slot bank (slot_layout.h), written once for every fixed-layout
// transport (shared memory, remote): a batch of drained slots as the policy's input, and the
// policy's output written back into the slots' response rows. Slot states, and who is told
// that an answer is there, stay with each transport.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "slot_layout.h"
#include "tensorwire/inference/transport.h"

namespace tensorwire::inference::detail {

// Serving-thread scratch of one bank, allocated once.
struct BatchViews {
  Storage staging;  // the request layout again: gathers non-contiguous batches
  // Batch views already built, by (staging, first slot, count): clients that keep using
  // the same slots get the same view back without a rebuild. Bounded (cleared when full).
  std::unordered_map<uint64_t, std::shared_ptr<const TensorDict>> views;
};

// One group of every drained slot (Drained::ids are slot indices), in slot order: a
// zero-copy view of the bank when the slots are contiguous, else gathered into staging.
void collate_slots(const SlotLayout& layout, const Storage& bank, BatchViews& scratch,
                   const Drained& drained, std::vector<Group>& groups);

// Validates the whole of `output` against the response layout (KeyError / ValueError naming
// the key, expected and given; nothing written on error), then writes each row into its
// slot of `bank`, stamping the policy version where asked.
void write_response_rows(const SlotLayout& layout, std::byte* bank, const Drained& drained,
                         const Group& group, const TensorDict& output, const VersionStamp& stamp);

// One unbatched response (the declared keys with the spec's shapes and dtypes: KeyError /
// ValueError otherwise, nothing written) into `slot`'s rows: the per-request server side of
// adapters whose own server batches (tensorwire.torchrl).
void write_response_row(const SlotLayout& layout, std::byte* bank, uint32_t slot,
                        const TensorDict& response);

// Copies `leaves` (in layout order, as validate_request collects them) into `slot`'s rows
// of `bank`.
void write_row(const SlotLayout& layout, std::byte* bank, size_t slot,
               const std::vector<const Tensor*>& leaves);

// Checks `td` against the request layout (before any slot is taken) and collects the
// declared leaves in layout order; extra keys are ignored. `transport` names the transport
// in the message about a non-CPU tensor.
void validate_request(const TensorDict& td, const SlotLayout& layout,
                      std::vector<const Tensor*>& out, const char* transport);

}  // namespace tensorwire::inference::detail
