// The connection handshake (src/wire/handshake.cpp), both roles in one process over two
// in-memory queues: agreement, the peer's identity (host and namespaces, which decide
// whether a pipe may use shared memory), and every refusal on both sides.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "wire/handshake.h"

namespace tw = tensorwire;
namespace wire = tensorwire::wire;

namespace {

class Queue {
 public:
  void push(const tw::Json& j) {
    std::lock_guard<std::mutex> lock(mu_);
    q_.push_back(j);
    cv_.notify_one();
  }
  tw::Json pop() {
    std::unique_lock<std::mutex> lock(mu_);
    if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return !q_.empty(); }))
      throw tw::ClosedError("no message");
    tw::Json j = std::move(q_.front());
    q_.pop_front();
    return j;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<tw::Json> q_;
};

struct Outcome {
  wire::PeerIdentity server_saw, client_saw;
  std::string server_error, client_error;
};

// `tamper` edits each message the client sends (a peer that breaks the rules).
Outcome run(const wire::HandshakeConfig& server, const wire::HandshakeConfig& client,
            const std::function<void(tw::Json&)>& tamper = {}) {
  Queue to_client, to_server;
  Outcome o;
  std::thread s([&] {
    try {
      o.server_saw = wire::handshake_as_server(
          server, [&](const tw::Json& j) { to_client.push(j); }, [&] { return to_server.pop(); });
    } catch (const std::exception& e) {
      o.server_error = e.what();
    }
  });
  try {
    o.client_saw = wire::handshake_as_client(
        client,
        [&](const tw::Json& j) {
          tw::Json sent = j;
          if (tamper) tamper(sent);
          to_server.push(sent);
        },
        [&] { return to_client.pop(); });
  } catch (const std::exception& e) {
    o.client_error = e.what();
  }
  s.join();
  return o;
}

}  // namespace

TEST(Handshake, AgreeingSidesLearnEachOthersIdentityOnThisHostAndNamespaces) {
  Outcome o = run({"pipe", "consolidated", ""}, {"pipe", "consolidated", ""});
  EXPECT_EQ(o.server_error, "");
  EXPECT_EQ(o.client_error, "");
  for (const auto* id : {&o.server_saw, &o.client_saw}) {
    EXPECT_EQ(id->pid, ::getpid());
    EXPECT_TRUE(id->same_host());
    EXPECT_TRUE(id->same_namespaces());
    EXPECT_NE(id->namespaces.find("pid:["), std::string::npos) << id->namespaces;
    EXPECT_NE(id->namespaces.find("ipc:["), std::string::npos) << id->namespaces;
  }
}

TEST(Handshake, AnotherBootIdOrOtherNamespacesAreNotTheSameMachine) {
  Outcome o = run({"pipe", "consolidated", ""}, {"pipe", "consolidated", ""});
  wire::PeerIdentity other_host = o.client_saw;
  other_host.boot_id = "00000000-0000-0000-0000-000000000000";
  EXPECT_FALSE(other_host.same_host());
  EXPECT_FALSE(other_host.same_namespaces());
  wire::PeerIdentity container = o.client_saw;  // same kernel, another container
  container.namespaces = "pid:[1] ipc:[2]";
  EXPECT_TRUE(container.same_host());
  EXPECT_FALSE(container.same_namespaces());
  wire::PeerIdentity unknown = o.client_saw;  // a peer that did not say
  unknown.namespaces.clear();
  EXPECT_FALSE(unknown.same_namespaces());
}

TEST(Handshake, AModeMismatchIsRefusedOnBothSidesWithTheSameReason) {
  Outcome o = run({"pipe", "consolidated", ""}, {"pipe", "non-consolidated", ""});
  // Named by role: the client reads the server's reason as it is ("this side" was the
  // server's side there, the wrong way round for the client).
  const std::string why =
      "mode mismatch: the server uses consolidated=True, the client "
      "consolidated=False";
  EXPECT_NE(o.server_error.find(why), std::string::npos) << o.server_error;
  EXPECT_NE(o.client_error.find(why), std::string::npos) << o.client_error;
}

TEST(Handshake, KeysMustMatchAndBeOnBothSidesOrNeither) {
  Outcome wrong = run({"pipe", "consolidated", "secret"}, {"pipe", "consolidated", "guess"});
  EXPECT_NE(wrong.server_error.find("authentication failed"), std::string::npos);
  EXPECT_NE(wrong.client_error.find("authentication failed"), std::string::npos);
  Outcome missing = run({"pipe", "consolidated", "secret"}, {"pipe", "consolidated", ""});
  EXPECT_NE(missing.server_error.find("authentication required"), std::string::npos);
  EXPECT_NE(missing.client_error.find("authentication required"), std::string::npos);
  Outcome extra = run({"pipe", "consolidated", ""}, {"pipe", "consolidated", "secret"});
  EXPECT_NE(extra.server_error.find("server has none"), std::string::npos);
  EXPECT_NE(extra.client_error.find("server has none"), std::string::npos);
  Outcome good = run({"pipe", "consolidated", "secret"}, {"pipe", "consolidated", "secret"});
  EXPECT_EQ(good.server_error + good.client_error, "");
}

TEST(Handshake, AProtocolMismatchIsRefused) {
  Outcome o = run({"pipe", "consolidated", ""}, {"dataflow", "consolidated", ""});
  EXPECT_NE(o.server_error.find("protocol mismatch"), std::string::npos) << o.server_error;
  EXPECT_FALSE(o.client_error.empty());
}

TEST(Handshake, EachSideLearnsHowOftenThePeerWantsHeartbeats) {
  Outcome o = run({"pipe", "consolidated", "", 2500}, {"pipe", "consolidated", "", 0});
  EXPECT_EQ(o.server_error + o.client_error, "");
  EXPECT_EQ(o.server_saw.heartbeat_ms, 0);
  EXPECT_EQ(o.client_saw.heartbeat_ms, 2500);
  Outcome silent = run({"pipe", "consolidated", ""}, {"pipe", "consolidated", "", 500});
  EXPECT_EQ(silent.server_saw.heartbeat_ms, 500);
  EXPECT_EQ(silent.client_saw.heartbeat_ms, -1) << "a side that does not announce knows none";
}

TEST(Handshake, AHeartbeatIntervalOutOfRangeIsRefusedNamingIt) {
  for (tw::Json bad : {tw::Json(-1), tw::Json(3600001), tw::Json("often"), tw::Json(2.5)}) {
    Outcome o =
        run({"pipe", "consolidated", "", 100}, {"pipe", "consolidated", "", 100}, [&](tw::Json& j) {
          if (j.contains("heartbeat_ms")) j["heartbeat_ms"] = bad;
        });
    EXPECT_NE(
        o.server_error.find("heartbeat_ms must be an integer from 0 to 3600000, got " + bad.dump()),
        std::string::npos)
        << o.server_error;
    EXPECT_FALSE(o.client_error.empty());
  }
}

// The pipe's split payloads (a payload on its own message whatever its size): each side
// learns whether the peer takes them; anything but a boolean is refused.
// And whether it sends its verdict on sharing this host (the pipe's host_verdict).
TEST(Handshake, EachSideLearnsWhetherThePeerTakesSplitPayloadsAndSendsItsVerdict) {
  Outcome o = run({"pipe", "consolidated", "", -1, true, true}, {"pipe", "consolidated", ""});
  EXPECT_EQ(o.server_error + o.client_error, "");
  EXPECT_FALSE(o.server_saw.split_payloads) << "a side that does not announce takes none";
  EXPECT_FALSE(o.server_saw.host_verdict);
  EXPECT_TRUE(o.client_saw.split_payloads);
  EXPECT_TRUE(o.client_saw.host_verdict);
  for (const std::string flag : {"split_payloads", "host_verdict"})
    for (tw::Json bad : {tw::Json(1), tw::Json("yes"), tw::Json(nullptr)}) {
      Outcome refused = run({"pipe", "consolidated", "", -1, true, true},
                            {"pipe", "consolidated", "", -1, true, true}, [&](tw::Json& j) {
                              if (j.contains(flag)) j[flag] = bad;
                            });
      EXPECT_NE(refused.server_error.find(flag + " must be a boolean, got " + bad.dump()),
                std::string::npos)
          << refused.server_error;
      EXPECT_FALSE(refused.client_error.empty());
    }
}

// Regressions found by fuzz_handshake (tests/fuzz/regressions/handshake_*): a scripted peer
// sends `messages` in order, then is gone.
namespace {

struct Scripted {
  wire::PeerIdentity seen;
  std::string error;  // a HandshakeError's text; any other exception fails the test
};

Scripted against(bool as_server, const wire::HandshakeConfig& config,
                 const std::vector<tw::Json>& messages) {
  size_t next = 0;
  auto recv = [&]() -> tw::Json {
    if (next == messages.size()) throw tw::ClosedError("the scripted peer has nothing more");
    return messages[next++];
  };
  auto send = [](const tw::Json&) {};
  Scripted out;
  try {
    out.seen = as_server ? wire::handshake_as_server(config, send, recv)
                         : wire::handshake_as_client(config, send, recv);
  } catch (const wire::HandshakeError& e) {
    out.error = e.what();
  }
  return out;
}

tw::Json hello_of(const char* role) {
  return {{"tensorwire", 1},  {"role", role},  {"protocol", "pipe"}, {"mode", "consolidated"},
          {"auth", false},    {"nonce", "00"}, {"pid", 1234},        {"boot_id", "b"},
          {"namespaces", "n"}};
}

const tw::Json kOk = {{"ok", true}, {"mac", nullptr}};

}  // namespace

TEST(Handshake, FieldsOfTheWrongTypeAreRefusedWithAHandshakeError) {
  const wire::HandshakeConfig plain{"pipe", "consolidated", ""};
  tw::Json version = hello_of("client");
  version["tensorwire"] = "1";
  EXPECT_NE(against(true, plain, {version}).error.find("does not speak tensorwire handshake"),
            std::string::npos);
  tw::Json auth = hello_of("client");
  auth["auth"] = "yes";
  EXPECT_NE(against(true, {"pipe", "consolidated", "secret"}, {auth})
                .error.find("authentication required"),
            std::string::npos)
      << "an auth that is not true is no auth";
  EXPECT_EQ(against(true, plain, {auth}).error, "");
  EXPECT_NE(against(false, plain, {hello_of("server"), {{"ok", "yes"}}})
                .error.find("connection refused by the server"),
            std::string::npos)
      << "an ok that is not true is no ok";
}

TEST(Handshake, APidThatIsNoProcessIdLeavesThePeersPidUnknown) {
  for (tw::Json pid : {tw::Json(int64_t{1} << 40), tw::Json(0), tw::Json(-5), tw::Json("7")}) {
    tw::Json client = hello_of("client");
    client["pid"] = pid;
    const Scripted s = against(true, {"pipe", "consolidated", ""}, {client});
    EXPECT_EQ(s.error, "");
    EXPECT_EQ(s.seen.pid, -1) << pid.dump();
    tw::Json server = hello_of("server");
    server["pid"] = pid;
    EXPECT_EQ(against(false, {"pipe", "consolidated", ""}, {server, kOk}).seen.pid, -1)
        << pid.dump();
  }
  EXPECT_EQ(against(true, {"pipe", "consolidated", ""}, {hello_of("client")}).seen.pid, 1234);
}

TEST(Handshake, AClientDoesNotBelieveAnOkAfterAServerHelloThatBreaksTheRules) {
  for (tw::Json heartbeat : {tw::Json(-7), tw::Json(int64_t{1} << 62)}) {
    tw::Json server = hello_of("server");
    server["heartbeat_ms"] = heartbeat;
    const Scripted s = against(false, {"pipe", "consolidated", "", 100}, {server, kOk});
    EXPECT_NE(s.error.find("the server accepted the connection but its hello is invalid: "
                           "heartbeat_ms must be an integer from 0 to 3600000"),
              std::string::npos)
        << s.error;
  }
  tw::Json other_mode = hello_of("server");
  other_mode["mode"] = "non-consolidated";
  EXPECT_NE(against(false, {"pipe", "consolidated", ""}, {other_mode, kOk})
                .error.find("its hello is invalid: mode mismatch"),
            std::string::npos);
}
