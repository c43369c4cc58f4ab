// Error hierarchy shared by every layer.
//
// One base, tensorwire::Error, so a C++ caller can catch everything the library
// throws in one place; one subclass per *kind* of failure so that the Python
// binding can map each to the exception a user of tensordict / torchrl expects
// (KeyError, ValueError, TypeError, TimeoutError, RuntimeError).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tensorwire {

// Messages often quote untrusted bytes (a key, a dtype, a JSON parser's "last read"): the
// constructor replaces bytes that are not valid UTF-8 (and NUL) by \xNN, so every message
// can become a Python str (the binding would otherwise raise UnicodeDecodeError instead of the
// error).
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what);
  explicit Error(const char* what) : Error(std::string(what)) {}
};

// `bytes` with NUL and every byte that is not part of a valid UTF-8 sequence written as \xNN.
std::string valid_utf8(std::string_view bytes);

// A key that is not there (Python: KeyError).
class KeyError : public Error {
 public:
  using Error::Error;
};

// A value of the right type but the wrong shape, size or content (Python: ValueError).
class ValueError : public Error {
 public:
  using Error::Error;
};

// An index past the end of a dimension (Python: IndexError, as a sequence's: a loop over
// td[i] ends on it). A ValueError, the kind it was before.
class IndexError : public ValueError {
 public:
  using ValueError::ValueError;
};

// A value of the wrong type, e.g. get() of a tensor that is a sub-TensorDict (Python: TypeError).
class TypeError : public Error {
 public:
  using Error::Error;
};

// A wait that ran out of time (Python: TimeoutError).
class TimeoutError : public Error {
 public:
  using Error::Error;
};

// Bytes that arrived and break the protocol or a file format (Python: RuntimeError).
class ProtocolError : public Error {
 public:
  using Error::Error;
};

// An operation on something already closed, or whose peer went away (Python: RuntimeError).
class ClosedError : public Error {
 public:
  using Error::Error;
};

// Nothing accepts connections at the address a client connects to (Python:
// ConnectionRefusedError). `listener` names what should listen there, for the hint.
class ConnectionRefused : public ClosedError {
 public:
  ConnectionRefused(const std::string& host, uint16_t port,
                    const std::string& listener = "a PipeListener or TensorDictServer")
      : ClosedError("connection refused by " + host + ":" + std::to_string(port) + " (is " +
                    listener + " listening there?)") {}
  // A local name (a transport's Unix socket), with the message said whole.
  explicit ConnectionRefused(const std::string& message) : ClosedError(message) {}
};

// A connection whose handshake failed (a wrong or missing auth_key, a consolidated / non-
// consolidated mismatch, another protocol): thrown on both sides, its message says why
// (Python: RuntimeError). TensorDictPipe::connect and RemoteTransport::connect throw it.
class HandshakeError : public Error {
 public:
  using Error::Error;
};

// A failing operating-system call; the message carries the call and strerror (Python:
// RuntimeError).
class SystemError : public Error {
 public:
  SystemError(const std::string& what, int err);
  int code() const noexcept { return code_; }

 private:
  int code_;
};

}  // namespace tensorwire
