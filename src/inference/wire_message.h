// Whole wire-codec messages as byte strings, for transports that move one message per
// Unix-socket message (the attach handshake, the socket transport).
#pragma once

#include <span>
#include <string>

#include "tensorwire/wire/decoder.h"
#include "tensorwire/wire/encoder.h"

namespace tensorwire::inference::detail {

// Appends the encoded message (header, metadata, payload) to `out`.
void append_encoded(const wire::OutMessage& m, std::string& out);
// Decodes one message from untrusted bytes into a TensorDict that owns its memory (the
// decoder's buffers are not shared with the result).
TensorDict decode_owned(wire::Decoder& decoder, std::span<const std::byte> bytes);

}  // namespace tensorwire::inference::detail
