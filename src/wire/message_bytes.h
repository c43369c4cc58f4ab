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

}  // namespace tensorwire::wire
