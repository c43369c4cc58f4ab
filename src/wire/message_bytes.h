// Whole wire-codec messages as byte strings, for transports that move one message per
// Unix-socket message (the inference attach handshake, the inference socket transport) or
// UCX control message (the remote transport's specs).
#pragma once

#include <span>
#include <string>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"

namespace tensorwire::wire {

// Appends the encoded message (header, metadata, payload) to `out`.
void append_encoded(const OutMessage& m, std::string& out);
// Decodes one message from untrusted bytes into a TensorDict that owns its memory (the
// decoder's buffers are not shared with the result).
TensorDict decode_owned(Decoder& decoder, std::span<const std::byte> bytes);

// A fixed-layout transport's spec (tensor leaves only) as its structure alone, for a client
// to lay out its slots by: the consolidated metadata (nesting, keys, dtypes, shapes, batch
// sizes) and the storage's size, never the values. Those mean nothing to a client and may
// be large: a spec of a 64 MiB leaf sent whole went to every client, from the thread that
// watches them, and one of 64 MiB or more could not be sent at all.
std::string encode_structure(const TensorDict& spec);
// Back to an unlocked spec of that structure whose leaves are zero, over an anonymous
// mapping that costs no memory until written. Validated as untrusted input, within
// `limits`: ProtocolError naming the rule broken otherwise.
TensorDict decode_structure(std::span<const std::byte> bytes, const Limits& limits);

}  // namespace tensorwire::wire
