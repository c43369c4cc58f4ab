// The inference socket transport's frames (src/wire/socket_frame.cpp): built and read
// back, and every way a received frame or failure body is refused.
#include <gtest/gtest.h>

#include <string>

#include "tensorwire/core/error.h"
#include "wire/socket_frame.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

std::span<const std::byte> bytes_of(const std::string& s) {
  return std::as_bytes(std::span<const char>(s.data(), s.size()));
}

std::string refusal_of(const std::string& body) {
  try {
    wire::parse_socket_failure(bytes_of(body), "failure");
  } catch (const tw::ProtocolError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(SocketFrame, APrefixReadsBackWithItsKindIdAndBody) {
  std::string f = wire::socket_frame(wire::SocketFrameKind::Response, 0x0102030405060708ull);
  ASSERT_EQ(f.size(), wire::kSocketFramePrefix);
  EXPECT_EQ(static_cast<uint8_t>(f[0]), 1);
  EXPECT_EQ(static_cast<uint8_t>(f[1]), 0x08) << "the id is little-endian";
  f += "body";
  const auto back = wire::parse_socket_frame(f);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, wire::SocketFrameKind::Response);
  EXPECT_EQ(back->id, 0x0102030405060708ull);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(back->body.data()), back->body.size()),
            "body");
}

TEST(SocketFrame, AFrameShorterThanItsPrefixIsNoFrame) {
  EXPECT_FALSE(wire::parse_socket_frame(std::string(wire::kSocketFramePrefix - 1, '\0')));
  EXPECT_FALSE(wire::parse_socket_frame(""));
  EXPECT_TRUE(wire::parse_socket_frame(std::string(wire::kSocketFramePrefix, '\0')));
}

TEST(SocketFrame, AnUnknownKindByteIsKeptForTheReceiverToRefuse) {
  std::string f = wire::socket_frame(wire::SocketFrameKind::Request, 7);
  f[0] = static_cast<char>(0xff);
  const auto back = wire::parse_socket_frame(f);
  ASSERT_TRUE(back);
  EXPECT_EQ(static_cast<uint8_t>(back->kind), 0xff);
}

TEST(SocketFrame, AFailureReadsBackAsSent) {
  const std::string f = wire::socket_failure_frame(9, {"ValueError", "bad shape", true});
  const auto back = wire::parse_socket_frame(f);
  ASSERT_TRUE(back);
  EXPECT_EQ(back->kind, wire::SocketFrameKind::Failure);
  EXPECT_EQ(back->id, 9u);
  const wire::SocketFailure failure = wire::parse_socket_failure(back->body, "failure");
  EXPECT_EQ(failure.type, "ValueError");
  EXPECT_EQ(failure.message, "bad shape");
  EXPECT_TRUE(failure.closed);
}

TEST(SocketFrame, AFailureBodyMayLeaveOutEveryField) {
  const wire::SocketFailure f = wire::parse_socket_failure(bytes_of("{}"), "failure");
  EXPECT_EQ(f.type, "RuntimeError");
  EXPECT_EQ(f.message, "");
  EXPECT_FALSE(f.closed);
}

TEST(SocketFrame, AFailureBodyOfTheWrongShapeIsAProtocolErrorNamingTheField) {
  EXPECT_NE(refusal_of("[1, 2]").find("invalid failure: not a JSON object but array"),
            std::string::npos);
  EXPECT_NE(refusal_of(R"({"type": 3})").find("\"type\" must be a string, got number"),
            std::string::npos);
  EXPECT_NE(refusal_of(R"({"message": null})").find("\"message\" must be a string, got null"),
            std::string::npos);
  EXPECT_NE(refusal_of(R"({"closed": "yes"})").find("\"closed\" must be a bool, got string"),
            std::string::npos);
  EXPECT_NE(refusal_of("{not json").find("invalid failure: malformed JSON"), std::string::npos);
}
