// evil_peer: connects to a TensorDictPipe listener, passes the handshake honestly, then
// sends a malformed message, so the tests can check what the receiver does with it.
//   evil_peer HOST PORT KIND   (KIND: storage-without-schema | bad-magic | oversize |
//                                     short-payload | wrong-schema-id | bad-worker-address |
//                                     mutated-worker-address | own-worker-address |
//                                     foreign-tag | stray-heartbeat | claim-pid=PID |
//                                     not-same-host | unknown-control | inline-and-split |
//                                     no-verdict)
// Prints "REJECTED <reason>" when the receiver reports the error back, exit status 0.
// mutated-worker-address answers the receiver's worker address with a corrupted copy of it
// (UCX aborts on parsing one) and then sends a bad-magic frame; own-worker-address hands
// the receiver its own address back. foreign-tag sends messages on a tag the pipe never
// reads; stray-heartbeat sends a heartbeat first (on one host, the pipe reads none).
// claim-pid=PID claims in its hello to be process PID, then prints "CONNECTED" and
// stays until the receiver closes. not-same-host finds the receiver's address not local
// (as behind a port proxy) and asks for heartbeats: it prints "HEARTBEAT" once one
// arrives, then sends a valid message (the receiver must take it). unknown-control sends
// a control message that is neither a close nor an error. inline-and-split sends
// {"x": uint8[48 KiB]} of 1s with the payload in its frame (as a peer that takes no split
// payloads gets it), then of 2s with the payload on its own message, and stays until the
// receiver closes. no-verdict speaks as a tensorwire from before the hosts' verdicts
// ("host_verdict" in the hello): it offers {"worker_address": null} alone, then sends a
// valid message and stays until the receiver closes.
#include <cstdio>
#include <cstring>
#include <thread>

#include "pipe/pipe_impl.h"
#include "tensorwire/wire/encoder.h"
#include "ucx/ucx.h"

using namespace tensorwire;
using Clock = std::chrono::steady_clock;

namespace {

struct Raw {
  ucx::Worker worker;
  std::unique_ptr<ucx::Endpoint> ep;
  std::vector<ucp_dt_iov_t> iov;

  void send(uint64_t tag, std::vector<std::span<const std::byte>> pieces) {
    ucx::Request r = ep->send(tag, pieces, iov);
    auto until = Clock::now() + std::chrono::seconds(5);
    while (!r.done() && Clock::now() < until) worker.progress();
  }
  void send_control(const Json& j, uint64_t tag = detail::kControlTag) {
    auto m = wire::Encoder::control(j);
    send(tag, {{m.header_bytes.data(), m.header_bytes.size()},
               {reinterpret_cast<const std::byte*>(m.metadata.data()), m.metadata.size()}});
  }
  std::optional<Json> recv_control(std::chrono::milliseconds timeout,
                                   uint64_t tag = detail::kControlTag) {
    auto until = Clock::now() + timeout;
    // The endpoint's error can come before the last message: the connection's error
    // arrives on its TCP socket, a message over shared memory, so a message the peer sent
    // just before closing is still taken for a moment after the error.
    std::optional<Clock::time_point> error_since;
    while (Clock::now() < until) {
      worker.progress();
      if (auto m = ep->probe(tag)) {
        std::vector<std::byte> buf(m->first);
        size_t got = 0;
        ucx::Request r = ep->recv(m->second, buf, &got);
        while (!r.done()) worker.progress();
        std::string js(reinterpret_cast<const char*>(buf.data()) + wire::kHeaderBytes,
                       buf.size() - wire::kHeaderBytes);
        return Json::parse(js);
      }
      if (ep->error() != UCS_OK) {
        if (!error_since) error_since = Clock::now();
        if (Clock::now() - *error_since > std::chrono::milliseconds(500)) return std::nullopt;
      }
    }
    return std::nullopt;
  }
  // Waits for the receiver's {"error": ...}: prints "REJECTED <reason>" and returns 0, or
  // "NO-REPLY" and 1.
  int told_why() {
    auto reply = recv_control(std::chrono::seconds(10));
    if (reply && reply->contains("error")) {
      std::printf("REJECTED %s\n", (*reply)["error"].get<std::string>().c_str());
      return 0;
    }
    std::printf("NO-REPLY\n");
    return 1;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) return 2;
  Raw raw;
  raw.ep = std::make_unique<ucx::Endpoint>(raw.worker, argv[1],
                                           static_cast<uint16_t>(std::atoi(argv[2])));
  std::string kind = argv[3];
  {  // as the pipe does: nothing is sent before UCX's wire-up is over (pipe_impl.cpp)
    ucx::Request flushed = raw.ep->flush();
    while (!flushed.done()) raw.worker.progress();
  }
  std::optional<int64_t> claimed_pid;
  if (kind.rfind("claim-pid=", 0) == 0) claimed_pid = std::atoll(kind.c_str() + 10);
  const bool same_host = kind != "not-same-host";
  const bool verdict = kind != "no-verdict";
  wire::handshake_as_client(
      {"pipe", "consolidated", "", same_host ? -1 : 1000, /*split_payloads=*/false, verdict},
      [&](Json j) {
        if (claimed_pid && j.contains("pid")) j["pid"] = *claimed_pid;
        raw.send_control(j);
      },
      [&]() {
        auto j = raw.recv_control(std::chrono::seconds(10));
        if (!j) throw ClosedError("no handshake reply");
        return *j;
      });

  // On one host the pipe offers its worker address next; this peer offers none (both stay
  // on the first endpoint), a malformed one, or one made from the receiver's.
  const bool from_theirs = kind == "mutated-worker-address" || kind == "own-worker-address";
  std::optional<Json> theirs;
  if (from_theirs) {
    theirs = raw.recv_control(std::chrono::seconds(10));
    if (!theirs || !theirs->contains("worker_address")) {
      std::printf("NO-ADDRESS\n");
      return 1;
    }
    std::string address = (*theirs)["worker_address"].is_string()
                              ? (*theirs)["worker_address"].get<std::string>()
                              : std::string();
    // Sent null (a peer of another user): answers with a corrupted address all the same.
    if (address.empty()) address = std::string(64, '0');
    if (kind == "mutated-worker-address")
      for (size_t i = 0; i < 16 && i < address.size(); ++i)
        address[i] = address[i] == 'f' ? '0' : 'f';
    raw.send_control({{"same_host", true}, {"worker_address", address}});
    if (kind == "mutated-worker-address") kind = "bad-magic";  // then: is the receiver alive?
  } else {
    Json offer = {
        {"same_host", same_host},
        {"worker_address", kind == "bad-worker-address" ? Json("not hex!") : Json(nullptr)}};
    if (!verdict) offer.erase("same_host");
    raw.send_control(offer);
    if (!raw.recv_control(std::chrono::seconds(10))) {
      std::printf("NO-ADDRESS\n");
      return 1;
    }
  }
  if (kind == "bad-worker-address" || kind == "own-worker-address") {
    return raw.told_why();
  }

  if (claimed_pid) {
    std::printf("CONNECTED\n");
    std::fflush(stdout);
    raw.recv_control(std::chrono::seconds(30));  // until the receiver closes
    return 0;
  }
  if (kind == "foreign-tag" || kind == "stray-heartbeat") {
    // Posted without waiting for each: a receiver that stopped reading fills the shared
    // memory FIFO, and its answer must still be read.
    std::vector<std::byte> junk(1000, std::byte{0x42});
    std::vector<ucx::Request> sent;
    // A heartbeat first: a pipe between two processes of one host exchanges none, so this
    // one would never be read either, and hide the others behind it.
    if (kind == "stray-heartbeat") sent.push_back(raw.ep->send(detail::kHeartbeatTag, junk));
    for (int i = 0; i < 200; ++i) {
      sent.push_back(raw.ep->send(99, junk));
      raw.worker.progress();
    }
    auto reply = raw.recv_control(std::chrono::seconds(10));
    if (reply && reply->contains("error"))
      std::printf("REJECTED %s\n", (*reply)["error"].get<std::string>().c_str());
    else
      std::printf("NO-REPLY\n");
    std::fflush(stdout);
    std::_Exit(reply ? 0 : 1);  // sends still queued: not worth a clean teardown
  }

  if (kind == "not-same-host") {
    // Heartbeats both ways now: ours first (on one host a pipe would refuse it), then one
    // of the receiver's, at the interval our hello asked for.
    raw.send_control({{"heartbeat", true}}, detail::kHeartbeatTag);
    if (!raw.recv_control(std::chrono::seconds(10), detail::kHeartbeatTag)) {
      std::printf("NO-HEARTBEAT\n");
      return 1;
    }
    std::printf("HEARTBEAT\n");
    std::fflush(stdout);
  }
  if (kind == "unknown-control") {
    raw.send_control({{"surprise", true}});
    return raw.told_why();
  }

  if (kind == "inline-and-split") {
    wire::Encoder enc(wire::Mode::Consolidated);
    for (const uint8_t value : {uint8_t{1}, uint8_t{2}}) {
      TensorDict td;
      td.set("x",
             Tensor::from_vector<uint8_t>(std::vector<uint8_t>(48 * 1024, value), {48 * 1024}));
      const TensorDict c = consolidate(td);  // the payload points into it
      const wire::OutMessage& m = enc.encode(c);
      std::vector<std::span<const std::byte>> frame = {
          {m.header_bytes.data(), m.header_bytes.size()},
          {reinterpret_cast<const std::byte*>(m.metadata.data()), m.metadata.size()}};
      if (value == 1) frame.insert(frame.end(), m.payload.begin(), m.payload.end());
      raw.send(detail::kFrameTag, frame);
      if (value == 2) raw.send(detail::kPayloadTag, m.payload);
    }
    raw.recv_control(std::chrono::seconds(30));  // until the receiver closes
    return 0;
  }

  // A valid message to start from: schema + storage of {"x": float32[4]}.
  TensorDict td;
  td.set("x", Tensor::zeros({4}, DType::Float32));
  wire::Encoder enc(wire::Mode::Consolidated);
  wire::OutMessage m = enc.encode(td);
  std::string meta = m.metadata;
  wire::FrameHeader h = m.header;
  std::vector<std::byte> payload(16);
  if (kind == "storage-without-schema") {
    h.kind = wire::MessageKind::Storage;
    meta.clear();
  } else if (kind == "wrong-schema-id") {
    // A valid first message, then storage for a schema id that was never sent.
    auto b = h.encode();
    raw.send(detail::kFrameTag, {{b.data(), b.size()},
                                 {reinterpret_cast<const std::byte*>(meta.data()), meta.size()},
                                 {payload.data(), payload.size()}});
    h.kind = wire::MessageKind::Storage;
    h.schema_id = 77;
    meta.clear();
  } else if (kind == "oversize") {
    h.payload_bytes = 1ull << 40;
  } else if (kind == "short-payload") {
    payload.resize(8);  // the header says 16
  }
  h.metadata_bytes = meta.size();
  auto b = h.encode();
  if (kind == "bad-magic") b[0] = std::byte{'X'};
  raw.send(detail::kFrameTag, {{b.data(), b.size()},
                               {reinterpret_cast<const std::byte*>(meta.data()), meta.size()},
                               {payload.data(), payload.size()}});
  if (kind == "no-verdict") {
    raw.recv_control(std::chrono::seconds(30));  // until the receiver closes
    return 0;
  }
  return raw.told_why();
}
