// SharedMemoryTransport specifics: spec and request validation, slot ownership and
// back-pressure, copy_result, the zero-copy batch, segment sizes, attach by name.
#include <gtest/gtest.h>

#include <atomic>
#include <random>

#include "common.h"

namespace tw_test {
namespace {

std::string message_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no exception)";
}

TEST(SharedMemorySpec, NonTensorLeafIsATypeError) {
  TensorDict spec = request_spec();
  spec.set("name", NonTensor{"cartpole"});
  EXPECT_THROW(SharedMemoryTransport::create(spec, response_spec(), {.num_slots = 2}), TypeError);
}

TEST(SharedMemorySpec, SpecWithoutLeavesIsAValueError) {
  TensorDict empty;
  empty.set("nested", TensorDict());
  EXPECT_THROW(SharedMemoryTransport::create(empty, response_spec(), {.num_slots = 2}), ValueError);
  EXPECT_THROW(SharedMemoryTransport::create(request_spec(), TensorDict(), {.num_slots = 2}),
               ValueError);
}

TEST(SharedMemorySpec, ZeroSlotsIsAValueError) {
  EXPECT_THROW(SharedMemoryTransport::create(request_spec(), response_spec(), {.num_slots = 0}),
               ValueError);
  EXPECT_THROW(SharedMemoryTransport::create(request_spec(), response_spec(), {.num_slots = -3}),
               ValueError);
  EXPECT_THROW(
      SharedMemoryTransport::create(request_spec(), response_spec(), {.num_slots = kMaxSlots + 1}),
      ValueError);
}

TEST(SharedMemorySpec, NonCpuLeafIsAValueError) {
  TensorDict spec;
  spec.set("observation", Tensor::view(Storage(), 0, {4}, DType::Float32, {}, Device::cuda(0)));
  EXPECT_THROW(SharedMemoryTransport::create(spec, response_spec(), {.num_slots = 2}), ValueError);
}

class SharedMemoryTest : public ::testing::Test {
 protected:
  std::shared_ptr<SharedMemoryTransport> t = make_shm(4);
};

TEST_F(SharedMemoryTest, AMissingDeclaredKeyIsAKeyErrorAndTakesNoSlot) {
  TensorDict td;
  td.set("obs", Tensor::zeros({4}, DType::Float32));
  Client c = t->client();
  std::string msg = message_of([&] { c.submit(td); });
  EXPECT_NE(msg.find("'observation'"), std::string::npos) << msg;
  EXPECT_THROW(c.submit(td), KeyError);
  EXPECT_EQ(t->slots_in_use(), 0u);
}

TEST_F(SharedMemoryTest, AWrongShapeOrDtypeIsAValueErrorNamingKeyExpectedAndGiven) {
  Client c = t->client();
  TensorDict wrong_dtype;
  wrong_dtype.set("observation", Tensor::zeros({4}, DType::Float64));
  EXPECT_THROW(c.submit(wrong_dtype), ValueError);
  EXPECT_EQ(message_of([&] { c.submit(wrong_dtype); }),
            "request key 'observation': expected float32[4], got float64[4]");
  TensorDict wrong_shape;
  wrong_shape.set("observation", Tensor::zeros({5}, DType::Float32));
  EXPECT_EQ(message_of([&] { c.submit(wrong_shape); }),
            "request key 'observation': expected float32[4], got float32[5]");
  EXPECT_EQ(t->slots_in_use(), 0u);
}

TEST_F(SharedMemoryTest, ANonCpuLeafIsAValueError) {
  TensorDict td;
  td.set("observation", Tensor::view(Storage(), 0, {4}, DType::Float32, {}, Device::cuda(0)));
  Client c = t->client();
  EXPECT_THROW(c.submit(td), ValueError);
  EXPECT_NE(message_of([&] { c.submit(td); }).find("cuda:0"), std::string::npos);
  EXPECT_EQ(t->slots_in_use(), 0u);
}

TEST_F(SharedMemoryTest, ExtraKeysAreDroppedBeforeThePolicySeesTheBatch) {
  std::vector<Key> seen;
  InferenceServer server(
      [&](const TensorDict& b) {
        seen = b.keys(true, true);
        return double_policy(b);
      },
      t);
  server.start();
  TensorDict td = observation(1);
  td.set("extra", Tensor::zeros({7}, DType::Int32));
  EXPECT_EQ(action0(t->client()(td, 5s)), 2);
  EXPECT_EQ(seen, (std::vector<Key>{Key("observation")}));
}

TEST_F(SharedMemoryTest, SubmitBlocksWhileEverySlotIsInFlightAndTimesOut) {
  Client c = t->client();
  std::vector<Future> held;
  for (int i = 0; i < 4; ++i) held.push_back(c.submit(observation(static_cast<float>(i))));
  EXPECT_EQ(t->slots_in_use(), 4u);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_THROW(c.submit(observation(9), 50ms), TimeoutError);
  EXPECT_GE(std::chrono::steady_clock::now() - t0, 50ms);
  // A blocked submit goes through as soon as a slot comes back.
  std::atomic<bool> through{false};
  std::thread blocked([&] {
    Future f = c.submit(observation(7));
    through = true;
    EXPECT_EQ(action0(f.result(5s)), 14);
  });
  std::this_thread::sleep_for(30ms);
  EXPECT_FALSE(through);
  InferenceServer server(double_policy, t);
  server.start();
  for (int i = 0; i < 4; ++i) EXPECT_EQ(action0(held[i].result(5s)), 2.0f * i);
  blocked.join();
  EXPECT_TRUE(through);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
}

TEST_F(SharedMemoryTest, ASlotIsReleasedWhenItsResultIsRead) {
  InferenceServer server(double_policy, t);
  server.start();
  Future f = t->client().submit(observation(1));
  ASSERT_TRUE(eventually([&] { return f.done(); }));
  EXPECT_EQ(t->slots_in_use(), 1u);  // the response waits in its slot
  f.result();
  EXPECT_EQ(t->slots_in_use(), 0u);
}

TEST_F(SharedMemoryTest, DroppedFuturesReleaseTheirSlotsInEveryState) {
  Client c = t->client();
  { Future ready = c.submit(observation(1)); }  // dropped before the server took it
  EXPECT_EQ(t->slots_in_use(), 0u);
  std::atomic<bool> release{false};
  InferenceServer server(
      [&](const TensorDict& b) {
        while (!release) std::this_thread::sleep_for(1ms);
        return double_policy(b);
      },
      t);
  server.start();
  { Future taken = c.submit(observation(2)); }  // dropped while the policy runs
  Future done = c.submit(observation(3));
  release = true;
  ASSERT_TRUE(eventually([&] { return done.done(); }));
  { Future moved = std::move(done); }  // dropped after the response arrived
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; }));
}

TEST(SharedMemoryCopyResult, FalseReturnsAViewOfTheResponseSlotTrueACopy) {
  for (bool copy : {false, true}) {
    auto t = make_shm(2, copy);
    InferenceServer server(double_policy, t);
    server.start();
    Client c = t->client();
    TensorDict r = c(observation(1), 5s);
    const auto* p = static_cast<const std::byte*>(r.get("action").data());
    const bool in_shared = r.get("action").storage().kind() == Storage::Kind::Shared;
    EXPECT_EQ(in_shared, !copy) << "copy_result=" << copy;
    EXPECT_EQ(r.is_locked(), !copy) << "a view of the slot is locked, a copy is the caller's";
    if (!copy) {
      try {
        r.erase("action");
        ADD_FAILURE() << "a key of a slot view was erased";
      } catch (const Error& e) {  // the message says why it is locked and what to do
        EXPECT_NE(std::string(e.what()).find("a view of a transport's slot"), std::string::npos)
            << e.what();
      }
    }
    EXPECT_EQ(action0(r), 2);
    TensorDict r2 = c(observation(5), 5s);  // reuses the slot (one client, same hint)
    EXPECT_EQ(action0(r2), 10);
    if (copy)
      EXPECT_EQ(action0(r), 2);
    else
      EXPECT_EQ(static_cast<const std::byte*>(r2.get("action").data()), p) << "same slot reused";
  }
}

// A batch's first-column values and whether it was a view of the bank.
struct Seen {
  bool zero_copy = false;
  std::vector<float> firsts;
};

Policy recording(std::vector<Seen>& seen) {
  return [&seen](const TensorDict& b) {
    const Tensor& obs = b.get("observation");
    Seen s;
    s.zero_copy = obs.storage().kind() == Storage::Kind::Shared;
    for (int64_t i = 0; i < obs.shape()[0]; ++i) s.firsts.push_back(obs.at<float>({i, 0}));
    seen.push_back(s);
    return double_policy(b);
  };
}

TEST(SharedMemoryBatch, ContiguousSlotsAreServedAsAZeroCopyViewOfTheBank) {
  auto t = make_shm(4);
  std::vector<Seen> seen;
  InferenceServer server(recording(seen), t, {.max_batch_size = 4});
  Client c = t->client();  // the first client claims slots 1, 2, 3 in turn
  Future a = c.submit(observation(10)), b = c.submit(observation(20)),
         d = c.submit(observation(30));
  server.start();
  a.result(5s), b.result(5s), d.result(5s);
  server.shutdown();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_TRUE(seen[0].zero_copy);
  EXPECT_EQ(seen[0].firsts, (std::vector<float>{10, 20, 30}));
}

TEST(SharedMemoryBatch, ScatteredSlotsAreGatheredIntoTheStagingBuffer) {
  auto t = make_shm(4);
  std::vector<Seen> seen;
  InferenceServer server(recording(seen), t, {.max_batch_size = 4});
  Client c = t->client();
  Future a = c.submit(observation(1));
  Future gap = c.submit(observation(2));
  Future d = c.submit(observation(3));
  gap = Future();  // gives the middle slot back
  server.start();
  EXPECT_EQ(action0(a.result(5s)), 2);
  EXPECT_EQ(action0(d.result(5s)), 6);
  server.shutdown();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_FALSE(seen[0].zero_copy);
  EXPECT_EQ(seen[0].firsts, (std::vector<float>{1, 3}));
}

TEST_F(SharedMemoryTest, AMissingResponseKeyFailsTheBatchWithKeyError) {
  InferenceServer server(
      [](const TensorDict& b) {
        TensorDict out(Shape{b.batch_size()[0]});
        out.set("act", Tensor::zeros({b.batch_size()[0], 2}, DType::Float32));
        return out;
      },
      t);
  server.start();
  try {
    t->client()(observation(0), 5s);
    ADD_FAILURE();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.type_name(), "KeyError");
    EXPECT_NE(e.message().find("'action'"), std::string::npos) << e.message();
  }
}

TEST_F(SharedMemoryTest, AResponseOfTheWrongShapeIsAValueErrorAndTheServerGoesOn) {
  std::atomic<bool> bad{true};
  InferenceServer server(
      [&](const TensorDict& b) {
        if (!bad) return double_policy(b);
        TensorDict out(Shape{b.batch_size()[0]});
        out.set("action", Tensor::zeros({b.batch_size()[0], 3}, DType::Float32));
        return out;
      },
      t);
  server.start();
  try {
    t->client()(observation(0), 5s);
    ADD_FAILURE();
  } catch (const RemoteError& e) {
    EXPECT_EQ(e.type_name(), "ValueError");
    EXPECT_EQ(e.message(), "policy output key 'action': expected float32[1, 2], got float32[1, 3]");
  }
  bad = false;
  EXPECT_EQ(action0(t->client()(observation(1), 5s)), 2);
  EXPECT_EQ(t->slots_in_use(), 0u);
}

TEST(SharedMemoryVersion, OnlyADeclaredVersionKeyIsReturned) {
  auto t = SharedMemoryTransport::create(request_spec(), response_spec(false), {.num_slots = 2});
  InferenceServer server(double_policy, t, {.policy_version = 7});
  server.start();
  TensorDict r = t->client()(observation(1), 5s);
  EXPECT_FALSE(r.contains("policy_version"));
  EXPECT_EQ(r.keys(), (std::vector<Key>{Key("action")}));
}

TEST(SharedMemoryLayout, NestedSpecsWithABatchSizeRoundTrip) {
  TensorDict req(Shape{3});
  req.set({"obs", "pixels"}, Tensor::zeros({3, 8, 8, 3}, DType::UInt8));
  req.set({"obs", "state"}, Tensor::zeros({3, 5}, DType::Float64));
  TensorDict resp(Shape{3});
  resp.set("logits", Tensor::zeros({3, 6}, DType::Float32));
  auto t = SharedMemoryTransport::create(req, resp, {.num_slots = 3});
  EXPECT_EQ(t->request_keys(), (std::vector<Key>{Key({"obs", "pixels"}), Key({"obs", "state"})}));
  // A client tells what a request must carry: each leaf with its dtype and shape.
  auto leaves = t->client().request_leaves(5s);
  ASSERT_TRUE(leaves.has_value());
  ASSERT_EQ(leaves->size(), 2u);
  EXPECT_EQ((*leaves)[0].key, Key({"obs", "pixels"}));
  EXPECT_EQ((*leaves)[0].dtype, DType::UInt8);
  EXPECT_EQ((*leaves)[0].shape, (Shape{3, 8, 8, 3}));
  EXPECT_EQ((*leaves)[1].dtype, DType::Float64);
  EXPECT_EQ((*leaves)[1].shape, (Shape{3, 5}));
  InferenceServer server(
      [](const TensorDict& b) {
        EXPECT_EQ(b.batch_size(), (Shape{b.batch_size()[0], 3}));
        EXPECT_EQ(b.get_tensordict("obs").batch_size(), (Shape{b.batch_size()[0], 3}));
        const Tensor& s = b.get({"obs", "state"});
        TensorDict out(Shape{b.batch_size()[0], 3});
        Tensor logits = Tensor::zeros({b.batch_size()[0], 3, 6}, DType::Float32);
        for (int64_t i = 0; i < s.shape()[0]; ++i)
          for (int64_t j = 0; j < 3; ++j)
            logits.at<float>({i, j, 0}) = static_cast<float>(s.at<double>({i, j, 4}));
        out.set("logits", logits);
        return out;
      },
      t);
  server.start();
  TensorDict r(Shape{3});
  Tensor px = Tensor::zeros({3, 8, 8, 3}, DType::UInt8);
  Tensor st = Tensor::zeros({3, 5}, DType::Float64);
  for (int64_t j = 0; j < 3; ++j) st.at<double>({j, 4}) = 10.0 * static_cast<double>(j + 1);
  r.set({"obs", "pixels"}, px);
  r.set({"obs", "state"}, st);
  TensorDict out = t->client()(r, 5s);
  EXPECT_EQ(out.batch_size(), (Shape{3}));
  EXPECT_EQ(out.get("logits").at<float>({2, 0}), 30.0f);
}

TEST(SharedMemorySizes, TheSegmentHoldsTwoBanksAndASmallControlArea) {
  TensorDict req;
  req.set("pixels", Tensor::zeros({84, 84, 3}, DType::UInt8));
  auto t = SharedMemoryTransport::create(req, response_spec(), {.num_slots = 64});
  auto s = t->sizes();
  EXPECT_EQ(s.requests, 64u * 84 * 84 * 3);
  EXPECT_EQ(s.responses, 64u * 2 * 4 + 64u * 8);  // action float32[2], policy_version int64
  EXPECT_LE(s.control, 40u * 1024) << "the control area is a small fixed size per slot";
  RecordProperty("control_bytes", std::to_string(s.control));
  RecordProperty("total_bytes", std::to_string(s.total()));
}

TEST(SharedMemoryAttach, AttachingByNameGivesTheSpecsAndWorkingClients) {
  auto t = make_shm(4);
  InferenceServer server(double_policy, t);
  server.start();
  auto attached = SharedMemoryTransport::attach(t->name());
  EXPECT_FALSE(attached->is_owner());
  EXPECT_EQ(attached->num_slots(), 4u);
  EXPECT_EQ(attached->request_keys(), t->request_keys());
  EXPECT_EQ(attached->response_keys(), t->response_keys());
  EXPECT_EQ(action0(attached->client()(observation(2), 5s)), 4);
  EXPECT_EQ(action0(SharedMemoryTransport::client_for(t->name())(observation(3), 5s)), 6);
  InferenceServer elsewhere(double_policy, attached);
  EXPECT_THROW(elsewhere.start(), Error) << "only the creating process serves";
}

TEST(SharedMemoryAttach, AttachingToANameNobodyListensOnFails) {
  EXPECT_THROW(
      SharedMemoryTransport::attach("tensorwire-test-nobody-" + std::to_string(::getpid()), 100ms),
      Error);
}

TEST(SharedMemoryLifetime, DestroyingTheTransportFailsItsWaitingClients) {
  auto t = make_shm(2);
  Client c = t->client();
  Future f = c.submit(observation(1));
  t.reset();  // nobody can serve it any more
  EXPECT_THROW(f.result(5s), ClosedError);
  EXPECT_THROW(c.submit(observation(1)), ClosedError);
}

TEST(SharedMemoryStress, NoSlotLeaksUnderMixedUse) {
  auto t = make_shm(8);
  InferenceServer server(double_policy, t, {.max_batch_size = 4});
  server.start();
  std::vector<std::thread> threads;
  std::atomic<int> wrong{0};
  for (int k = 0; k < 4; ++k) {
    threads.emplace_back([&, k] {
      std::mt19937 rng(static_cast<unsigned>(k));
      Client c = t->client();
      for (int i = 0; i < 300; ++i) {
        float base = static_cast<float>(k * 10000 + i);
        switch (rng() % 4) {
          case 0:
            c.submit(observation(base));
            break;  // dropped at once
          case 1: {
            Future f = c.submit(observation(base));
            try {
              f.result(std::chrono::microseconds(rng() % 50));
            } catch (const TimeoutError&) {
            }
            break;  // dropped, maybe unread
          }
          default:
            if (action0(c(observation(base), 5s)) != 2 * base) ++wrong;
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(wrong, 0);
  EXPECT_TRUE(eventually([&] { return t->slots_in_use() == 0; })) << t->slots_in_use() << " in use";
}

}  // namespace
}  // namespace tw_test
