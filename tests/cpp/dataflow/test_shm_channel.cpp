// ShmSender / ShmReceiver and the descriptor format, in one process: datapoints through
// shared memory, descriptors through a string.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "dataflow/shm_channel.h"
#include "flows.h"

namespace tensorwire::dataflow::detail {
namespace {

using ::testing::HasSubstr;
using testing::make_datapoint;

struct Channel {
  std::vector<shm::Segment> delivered;
  ShmSender sender{"test", 4, [this](uint32_t, const shm::Segment& s) { delivered.push_back(s); }};
  ShmReceiver receiver{[this](uint16_t, uint32_t i) { return delivered.at(i); }};

  uint64_t peer_schema = 0;

  std::string encode(const TensorDict& td, uint64_t seq = 0) {
    std::string out;
    sender.encode(td, {.sender = 3, .seq = seq}, out, peer_schema);
    return out;
  }
  struct Decoded {
    DescriptorHeader header;
    std::optional<TensorDict> datapoint;
  };
  Decoded decode(const std::string& d) {
    ShmReceiver::Received r = receiver.decode(std::as_bytes(std::span(d)));
    Decoded out{r.header, std::nullopt};
    if (r.datapoint) out.datapoint = r.datapoint->to_tensordict();
    return out;
  }
};

TEST(Descriptor, RoundTripsItsHeader) {
  DescriptorHeader h{.kind = DescriptorKind::Filtered,
                     .sender = 7,
                     .seq = 1ull << 40,
                     .segment = 2,
                     .pass = 9,
                     .offset = 4096};
  std::string out;
  h.encode(out);
  ASSERT_EQ(out.size(), kDescriptorHeaderBytes);
  DescriptorHeader back = DescriptorHeader::decode(std::as_bytes(std::span(out)));
  EXPECT_EQ(back.kind, DescriptorKind::Filtered);
  EXPECT_EQ(back.sender, 7);
  EXPECT_EQ(back.seq, 1ull << 40);
  EXPECT_EQ(back.segment, 2u);
  EXPECT_EQ(back.pass, 9u);
  EXPECT_EQ(back.offset, 4096u);
}

TEST(Descriptor, RejectsBytesThatAreNotADescriptor) {
  std::string junk(40, 'x');
  EXPECT_THROW(DescriptorHeader::decode(std::as_bytes(std::span(junk))), ProtocolError);
  EXPECT_THROW(DescriptorHeader::decode(std::as_bytes(std::span(junk).first(10))), ProtocolError);
  std::string out;
  DescriptorHeader{}.encode(out);
  out[5] = 9;  // unknown kind
  try {
    DescriptorHeader::decode(std::as_bytes(std::span(out)));
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("unknown kind 9"));
  }
}

TEST(Descriptor, CarriesAFailureWithAnOpaquePayload) {
  Failure f{"builtins.ValueError", "bad \xff value", "Traceback ...", std::string("\0pickle", 7)};
  const std::string encoded = encode_failure(f);
  Failure back = decode_failure(std::as_bytes(std::span(encoded)));
  EXPECT_EQ(back.type, f.type);
  EXPECT_EQ(back.traceback, f.traceback);
  EXPECT_EQ(back.payload, f.payload);
  EXPECT_THAT(back.message, HasSubstr("bad "));
}

TEST(ShmChannel, DeliversViewsIntoTheSendersSharedMemory) {
  Channel c;
  TensorDict td = make_datapoint(5, 1000);
  auto r = c.decode(c.encode(td));
  ASSERT_TRUE(r.datapoint);
  EXPECT_EQ(r.header.sender, 3);
  std::string why;
  EXPECT_TRUE(equal(td, *r.datapoint, &why)) << why;
  const std::byte* p = static_cast<const std::byte*>(r.datapoint->get("x").data());
  const shm::Segment& seg = c.delivered.at(0);
  EXPECT_GE(p, seg.data());
  EXPECT_LT(p, seg.data() + seg.size());
  EXPECT_EQ(r.datapoint->get("x").storage().kind(), Storage::Kind::Shared);
}

TEST(ShmChannel, SendsTheSchemaOnlyWhenTheStructureChanges) {
  Channel c;
  const std::string first = c.encode(make_datapoint(1));
  const std::string second = c.encode(make_datapoint(2));
  const std::string other = c.encode(make_datapoint(3, 32));  // another shape
  EXPECT_GT(first.size(), 200u);
  EXPECT_EQ(second.size(), kDescriptorHeaderBytes + 40);  // header + frame header only
  EXPECT_GT(other.size(), 200u);
  EXPECT_EQ(testing::index_of(*c.decode(first).datapoint), 1);
  EXPECT_EQ(testing::index_of(*c.decode(second).datapoint), 2);
  EXPECT_EQ(testing::index_of(*c.decode(other).datapoint), 3);
}

TEST(ShmChannel, RecyclesAChunkWhenTheDatapointIsDropped) {
  Channel c;
  for (int i = 0; i < 1000; ++i) {
    auto r = c.decode(c.encode(make_datapoint(static_cast<uint64_t>(i), 4096)));
    ASSERT_TRUE(testing::datapoint_ok(*r.datapoint));
  }
  EXPECT_EQ(c.delivered.size(), 1u);  // one arena was enough
  EXPECT_EQ(c.sender.bytes_in_use(), 0u);
}

TEST(ShmChannel, AKeptDatapointKeepsItsChunk) {
  Channel c;
  auto kept = c.decode(c.encode(make_datapoint(1, 4096)));
  for (int i = 0; i < 100; ++i) c.decode(c.encode(make_datapoint(2, 4096)));
  EXPECT_GT(c.sender.bytes_in_use(), 4096u);
  EXPECT_TRUE(testing::datapoint_ok(*kept.datapoint));
  kept.datapoint.reset();
  EXPECT_EQ(c.sender.bytes_in_use(), 0u);
}

TEST(ShmChannel, AnAbandonedDescriptorFreesItsChunkAndResendsTheSchema) {
  Channel c;
  const std::string lost = c.encode(make_datapoint(1));
  c.sender.abandon(std::as_bytes(std::span(lost)), c.peer_schema);
  EXPECT_EQ(c.sender.bytes_in_use(), 0u);
  const std::string next = c.encode(make_datapoint(2));
  EXPECT_GT(next.size(), 200u);  // carries the schema the receiver never saw
  EXPECT_EQ(testing::index_of(*c.decode(next).datapoint), 2);
}

TEST(ShmChannel, RejectsAStorageDescriptorForAnUnknownSchema) {
  Channel c;
  c.encode(make_datapoint(1));                             // the receiver never sees this one
  const std::string second = c.encode(make_datapoint(2));  // so this refers to an unknown schema
  try {
    c.decode(second);
    FAIL();
  } catch (const ProtocolError& e) {
    EXPECT_THAT(e.what(), HasSubstr("schema"));
  }
}

TEST(ShmChannel, CarriesADatapointWithoutTensors) {
  Channel c;
  TensorDict td;
  td.set("s", NonTensor{"only a string"});
  auto r = c.decode(c.encode(td));
  ASSERT_TRUE(r.datapoint);
  EXPECT_EQ(r.datapoint->get_non_tensor("s"), Json("only a string"));
}

}  // namespace
}  // namespace tensorwire::dataflow::detail
