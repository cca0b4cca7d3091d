// End to end: an in-process cluster of 3 gRPC servers and trainer threads
// using the C++ client, including parameters split into blocks.
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/client/client.h"
#include "cc/server/in_process_transport.h"
#include "cc/core/names.h"
#include "cc/core/optimizer.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"
#include "tests/cluster_test_base.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

class IntegrationTest : public ClusterTest {
 protected:
  void SetUp() override { StartCluster(3); }

  static v1::ParameterConfig Sgd(double lr) {
    v1::ParameterConfig config;
    config.mutable_optimizer()->mutable_sgd();
    config.mutable_learning_rate()->set_learning_rate(lr);
    return config;
  }
};

std::vector<float> Iota(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + static_cast<float>(i);
  return v;
}

TEST_P(IntegrationTest, SplitParameterRoundTripsAndSpreadsOverAllServers) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  const std::vector<float> big = Iota(10000, 0.5f);  // 40000 bytes: 10 blocks
  ASSERT_OK(client->InitParam("big", Tensor::FromValues<float>({100, 100}, big), Sgd(1)));
  ASSERT_OK(client->InitParam("small", Tensor::FromValues<double>({3}, {1, 2, 3}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());

  // A second client has no cached layout: it learns it from block 0.
  auto reader = NewClient();
  ASSERT_NE(reader, nullptr);
  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, reader->GetParams({"big", "small"}));
  EXPECT_EQ(got[0].shape(), (Shape{100, 100}));
  EXPECT_EQ(got[0].ToVector<float>(), big);
  EXPECT_EQ(got[1].ToVector<double>(), (std::vector<double>{1, 2, 3}));

  ASSERT_OK_AND_ASSIGN(auto stats, client->GetStats());
  ASSERT_EQ(stats.size(), 3u);
  uint64_t blocks = 0;
  for (const auto& s : stats) {
    EXPECT_GE(s.parameters(), 1u) << "server " << s.index() << " holds no block";
    EXPECT_TRUE(s.initialized());
    blocks += s.parameters();
  }
  EXPECT_EQ(blocks, 11u);  // 10 blocks of "big" + "small"
}

TEST_P(IntegrationTest, ConcurrentTrainersLoseNoUpdate) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  // float64 with SGD lr=1 and integer-valued gradients: exact arithmetic.
  const size_t n = 3000;  // 24000 bytes: 6 blocks
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<double>({static_cast<int64_t>(n)},
                                                              std::vector<double>(n, 0.0)),
                              Sgd(1)));
  ASSERT_OK(client->InitParam("b", Tensor::FromValues<double>({1}, {0.0}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());

  constexpr int kTrainers = 4;
  constexpr int kSteps = 25;
  std::vector<absl::Status> results(kTrainers);
  std::vector<std::thread> threads;
  for (int t = 0; t < kTrainers; ++t) {
    threads.emplace_back([&, t] {
      auto own = Connect();  // each trainer its own client
      if (!own.ok()) {
        results[t] = own.status();
        return;
      }
      for (int step = 0; step < kSteps && results[t].ok(); ++step) {
        std::vector<double> g(n);
        for (size_t i = 0; i < n; ++i) g[i] = static_cast<double>((i % 7) + t);
        results[t] = (*own)->SendGrads({
            {"w", Tensor::FromValues<double>({static_cast<int64_t>(n)}, g)},
            {"b", Tensor::FromValues<double>({1}, {1.0})},
        });
        if (results[t].ok()) results[t] = (*own)->GetParam("w").status();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (const auto& r : results) ASSERT_OK(r);

  ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, client->GetParams({"w", "b"}));
  absl::Span<const double> w = got[0].values<double>();
  ASSERT_EQ(w.size(), n);
  for (size_t i = 0; i < n; ++i) {
    double expected = 0;
    for (int t = 0; t < kTrainers; ++t) expected -= kSteps * static_cast<double>((i % 7) + t);
    ASSERT_EQ(w[i], expected) << "element " << i;
  }
  EXPECT_EQ(got[1].values<double>()[0], -kTrainers * kSteps);
}

// Two trainers taking turns (sequentially) must leave the same weights as the
// same optimizer applied locally to the same gradients in the same order,
// with clipping by the whole gradient's norm across blocks and a schedule.
TEST_P(IntegrationTest, ServerSideAdamMatchesLocalAdam) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam()->set_weight_decay(0.01);
  config.mutable_learning_rate()->set_learning_rate(0.01);
  config.mutable_learning_rate()->set_warmup_steps(3);
  config.mutable_learning_rate()->mutable_cosine()->set_decay_steps(20);
  config.mutable_clipping()->set_clip_norm(5.0);

  const size_t n = 2500;  // 10000 bytes: 3 blocks
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> init(n);
  for (float& v : init) v = normal(rng);

  auto trainer_a = NewClient();
  auto trainer_b = NewClient();
  ASSERT_NE(trainer_a, nullptr);
  ASSERT_NE(trainer_b, nullptr);
  const Tensor initial = Tensor::FromValues<float>({50, 50}, init);
  ASSERT_OK(trainer_a->InitParam("w", initial, config));
  EXPECT_THAT(trainer_b->InitParam("w", initial, config),
              StatusIs(absl::StatusCode::kAlreadyExists, StartsWith("pserver already initialized")));
  ASSERT_OK(trainer_a->FinishInitParams());
  ASSERT_OK(trainer_b->FinishInitParams());

  ASSERT_OK_AND_ASSIGN(auto local, Optimizer::Create(config, v1::FLOAT32, n));
  std::vector<float> expected = init;
  Client* trainers[] = {trainer_a.get(), trainer_b.get()};
  for (int step = 0; step < 12; ++step) {
    Client* trainer = trainers[step % 2];
    ASSERT_OK_AND_ASSIGN(Tensor w, trainer->GetParam("w"));
    std::vector<float> grad(n);
    absl::Span<const float> wv = w.values<float>();
    for (size_t i = 0; i < n; ++i) grad[i] = 2.0f * wv[i] + 0.1f * normal(rng);
    ASSERT_OK(trainer->SendGrad("w", Tensor::FromValues<float>({50, 50}, grad)));
    local->Apply(expected.data(), grad.data(), std::nullopt);
  }
  ASSERT_OK_AND_ASSIGN(Tensor final_w, trainer_b->GetParam("w"));
  absl::Span<const float> got = final_w.values<float>();
  ASSERT_EQ(got.size(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(got[i], expected[i], 1e-6f * std::max(1.0f, std::abs(expected[i])))
        << "element " << i;
  }
  // The weights really moved.
  EXPECT_GT(std::abs(got[0] - init[0]), 1e-3f);
}

TEST_P(IntegrationTest, IntegerCountersAddExactly) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::ParameterConfig add;
  add.mutable_optimizer()->mutable_add();
  ASSERT_OK(client->InitParam("count", Tensor::FromValues<int64_t>({2}, {10, -5}), add));
  ASSERT_OK(client->InitParam("ids", Tensor::FromValues<uint32_t>({2}, {7, 8})));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("count", Tensor::FromValues<int64_t>({2}, {1, 2})));
  ASSERT_OK(client->SendGrad("count", Tensor::FromValues<int64_t>({2}, {1, 2})));
  ASSERT_OK_AND_ASSIGN(Tensor count, client->GetParam("count"));
  EXPECT_EQ(count.ToVector<int64_t>(), (std::vector<int64_t>{12, -1}));
  EXPECT_THAT(client->SendGrad("ids", Tensor::FromValues<uint32_t>({2}, {1, 1})),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("'add'")));
  ASSERT_OK_AND_ASSIGN(Tensor ids, client->GetParam("ids"));
  EXPECT_EQ(ids.ToVector<uint32_t>(), (std::vector<uint32_t>{7, 8}));
}

TEST_P(IntegrationTest, ClientErrorsNameTheProblemAndChangeNothing) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd(1)));
  EXPECT_THAT(client->GetParam("w"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       ::testing::AllOf(HasSubstr("pserver not fully initialized"),
                                        HasSubstr("call FinishInitParams"))));
  ASSERT_OK(client->FinishInitParams());

  EXPECT_THAT(client->GetParam("nope"), StatusIs(absl::StatusCode::kNotFound, HasSubstr("'nope'")));
  EXPECT_THAT(client->GetParam(""), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  EXPECT_THAT(client->SendGrad("w", Tensor::FromValues<float>({3}, {1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("'w'"), HasSubstr("3 values"), HasSubstr("4 expected"))));
  EXPECT_THAT(client->SendGrad("w", Tensor::FromValues<double>({4}, {1, 1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       ::testing::AllOf(HasSubstr("float64"), HasSubstr("float32"))));
  // A batch with one bad gradient for w's server sends nothing.
  std::string nope = "nope";
  for (int k = 0; k < 1000 && client->placement().HomeServer(nope) !=
                                  client->placement().HomeServer("w");
       ++k) {
    nope = absl::StrCat("nope", k);
  }
  EXPECT_THAT(client->SendGrads({{"w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})},
                                 {nope, Tensor::FromValues<float>({1}, {1})}}),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("'" + nope + "'")));
  // A client that never saw "w" sends a wrong size: the server refuses it.
  auto fresh = NewClient();
  ASSERT_NE(fresh, nullptr);
  EXPECT_THAT(fresh->SendGrad("w", Tensor::FromValues<float>({3}, {1, 1, 1})),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("16 expected")));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));
}

TEST_P(IntegrationTest, PushPullReturnsTheUpdatedParameter) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  const size_t n = 3000;  // 12000 bytes: 3 blocks
  ASSERT_OK(client->InitParam("big", Tensor::FromValues<float>({static_cast<int64_t>(n)}, Iota(n, 1)),
                              Sgd(1)));
  ASSERT_OK(client->InitParam("small", Tensor::FromValues<float>({2}, {5, 6}), Sgd(0.5)));
  ASSERT_OK(client->FinishInitParams());

  const Tensor grad = Tensor::FromValues<float>({static_cast<int64_t>(n)}, std::vector<float>(n, 1));
  Tensor out;
  ASSERT_OK(client->PushPull("big", grad, &out));
  EXPECT_EQ(out.shape(), (Shape{static_cast<int64_t>(n)}));
  EXPECT_EQ(out.ToVector<float>(), Iota(n, 0));  // each value minus 1

  // Batched, both parameters in one round trip per server.
  std::vector<NamedTensor> grads;
  grads.push_back({"big", grad});
  grads.push_back({"small", Tensor::FromValues<float>({2}, {2, 4})});
  std::vector<Tensor> outs(2);
  ASSERT_OK(client->PushPull(grads, absl::MakeSpan(outs)));
  EXPECT_EQ(outs[0].ToVector<float>(), Iota(n, -1));
  EXPECT_EQ(outs[1].ToVector<float>(), (std::vector<float>{4, 4}));

  // A fresh client that never saw the parameters gets the same through GetParam.
  auto other = NewClient();
  ASSERT_NE(other, nullptr);
  ASSERT_OK_AND_ASSIGN(Tensor small, other->GetParam("small"));
  EXPECT_EQ(small.ToVector<float>(), (std::vector<float>{4, 4}));

  // A bad gradient in a push-pull changes nothing.
  EXPECT_THAT(client->PushPull("small", Tensor::FromValues<float>({3}, {1, 1, 1}), &out),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'small'")));
  ASSERT_OK_AND_ASSIGN(small, other->GetParam("small"));
  EXPECT_EQ(small.ToVector<float>(), (std::vector<float>{4, 4}));
}

TEST_P(IntegrationTest, GetParamsIntoReusesBuffersThatFit) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  const size_t n = 2500;  // split over the servers
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({50, 50}, Iota(n, 0)), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  const std::vector<std::string> names = {"w"};
  std::vector<Tensor> outs(1);
  ASSERT_OK(client->GetParamsInto(names, absl::MakeSpan(outs)));
  const char* buffer = outs[0].bytes().data();
  EXPECT_EQ(outs[0].ToVector<float>(), Iota(n, 0));

  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({50, 50}, std::vector<float>(n, 2))));
  ASSERT_OK(client->GetParamsInto(names, absl::MakeSpan(outs)));
  EXPECT_EQ(outs[0].bytes().data(), buffer) << "a tensor of the right shape is filled in place";
  EXPECT_EQ(outs[0].ToVector<float>(), Iota(n, -2));

  // A tensor of another shape or type is replaced.
  outs[0] = Tensor::FromValues<double>({3}, {1, 2, 3});
  ASSERT_OK(client->GetParamsInto(names, absl::MakeSpan(outs)));
  EXPECT_EQ(outs[0].type(), v1::FLOAT32);
  EXPECT_EQ(outs[0].shape(), (Shape{50, 50}));
  EXPECT_EQ(outs[0].ToVector<float>(), Iota(n, -2));

  EXPECT_THAT(client->GetParamsInto(names, absl::Span<Tensor>()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("1 names but 0 output")));
}

// Counts protobuf's log lines (in this process: clients and servers alike).
class ProtobufLogCounter {
 public:
  ProtobufLogCounter() { previous_ = google::protobuf::SetLogHandler(&Count); }
  ~ProtobufLogCounter() { google::protobuf::SetLogHandler(previous_); }
  static int count() { return count_.load(); }

 private:
  static void Count(google::protobuf::LogLevel, const char*, int, const std::string&) {
    count_.fetch_add(1);
  }
  static inline std::atomic<int> count_{0};
  google::protobuf::LogHandler* previous_;
};

TEST_P(IntegrationTest, InvalidUtf8NamesAreRefusedAndNeverLogged) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2}, {1, 2}), Sgd(1)));
  ProtobufLogCounter logs;
  const int before = ProtobufLogCounter::count();
  constexpr int kRequests = 50;
  for (int i = 0; i < kRequests; ++i) {
    const std::string name = absl::StrCat("w\xff\xfe", i);
    EXPECT_THAT(client->InitParam(name, Tensor::FromValues<float>({1}, {1}), Sgd(1)),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         ::testing::AllOf(StartsWith("parameter name \"w\\377\\376"),
                                          HasSubstr("name is not valid UTF-8"))));
  }
  ASSERT_OK(client->FinishInitParams());
  for (int i = 0; i < kRequests; ++i) {
    EXPECT_THAT(client->GetParam(absl::StrCat("w\xc0\xaf", i)),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid UTF-8")));
  }
  // Before names were `bytes`, each request logged "String field ... contains
  // invalid UTF-8 data" on the client and again on the server.
  EXPECT_EQ(ProtobufLogCounter::count() - before, 0);
}

TEST_P(IntegrationTest, NamesWithNulAreRefusedAndDoNotAlias) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->InitParam("a", Tensor::FromValues<float>({1}, {1}), Sgd(1)));
  const std::string nul("a\0b", 3);
  EXPECT_THAT(client->InitParam(nul, Tensor::FromValues<float>({1}, {7}), Sgd(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter name \"a\\000b\": name holds a NUL byte at offset 1")));
  EXPECT_THAT(client->InitParam(std::string(kMaxNameBytes + 1, 'n'),
                                Tensor::FromValues<float>({1}, {7}), Sgd(1)),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("the limit is 1024 bytes")));
  ASSERT_OK(client->FinishInitParams());
  EXPECT_THAT(client->GetParam(nul),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NUL byte")));
  ASSERT_OK_AND_ASSIGN(Tensor a, client->GetParam("a"));
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{1}));
}

TEST_P(IntegrationTest, NonFiniteGradientIsRefusedAndChangesNothing) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({3}, {1, 2, 3}), Sgd(1)));
  v1::ParameterConfig skip = Sgd(1);
  skip.set_non_finite(v1::ParameterConfig::SKIP);
  ASSERT_OK(client->InitParam("s", Tensor::FromValues<float>({2}, {1, 2}), skip));
  EXPECT_THAT(client->InitParam("bad", Tensor::FromValues<double>({1}, {std::nan("")}), Sgd(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'bad': initial value: element 0 is NaN")));
  ASSERT_OK(client->FinishInitParams());
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_THAT(client->SendGrad("w", Tensor::FromValues<float>({3}, {0, inf, 0})),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient for parameter 'w': element 1 is inf")));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{1, 2, 3}));

  ASSERT_OK(client->SendGrad("s", Tensor::FromValues<float>({2}, {std::nanf(""), 1})));
  ASSERT_OK_AND_ASSIGN(Tensor s, client->GetParam("s"));
  EXPECT_EQ(s.ToVector<float>(), (std::vector<float>{1, 2}));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  uint64_t skipped = 0;
  for (const v1::ServerStats& server : stats) skipped += server.non_finite_skipped();
  EXPECT_EQ(skipped, 1u);
}

// ---- a batch split over several servers is checked whole (non-finite values) ----

// 3072 floats: 3 blocks of 1024 (4 KiB), one on each of the 3 servers.
constexpr int64_t kSplit = 3072;

// Two names of one-block parameters whose home servers differ.
std::pair<std::string, std::string> NamesOnTwoServers(const Client& client) {
  const int home = client.placement().HomeServer("a");
  for (int i = 0; i < 1000; ++i) {
    std::string other = absl::StrCat("b", i);
    if (client.placement().HomeServer(other) != home) return {"a", other};
  }
  return {"a", "a"};
}

// The first of `prefix`, `prefix`1, `prefix`2, ... whose blocks 0..n-1 lie
// on n different servers: blocks are placed independently (jump consistent
// hashing), and the tests below need one block on each server.
std::string SpreadName(const Client& client, const std::string& prefix, uint32_t n) {
  for (int k = 0; k < 1000; ++k) {
    std::string name = k == 0 ? prefix : absl::StrCat(prefix, k);
    std::set<int> servers;
    for (uint32_t b = 0; b < n; ++b) servers.insert(client.placement().ServerOf(name, b));
    if (servers.size() == n) return name;
  }
  return prefix;
}

uint64_t AppliedOnAllServers(Client& client) {
  absl::StatusOr<std::vector<v1::ServerStats>> stats = client.GetStats();
  EXPECT_OK(stats);
  uint64_t applied = 0;
  if (stats.ok()) {
    for (const v1::ServerStats& s : *stats) applied += s.gradients_applied();
  }
  return applied;
}

// Each way a batch can be pushed: blocking and async, push and push-pull.
absl::Status PushEveryWay(Client& client, const std::vector<NamedTensor>& grads, int way) {
  std::vector<Tensor> outs(grads.size());
  switch (way) {
    case 0:
      return client.SendGrads(grads);
    case 1:
      return client.PushPull(grads, absl::MakeSpan(outs));
    case 2:
      return client.SendGradsAsync(grads).Wait();
    default:
      return client.PushPullAsync(grads, absl::MakeSpan(outs)).Wait();
  }
}

TEST_P(IntegrationTest, NaNInTheLastBlockOfASplitGradientChangesNoServer) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  const std::vector<float> w0 = Iota(kSplit, 1);
  const std::string name = SpreadName(*client, "w", 3);
  ASSERT_OK(client->InitParam(name, Tensor::FromValues<float>({kSplit}, w0), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  std::set<int> servers;
  for (uint32_t b = 0; b < 3; ++b) servers.insert(client->placement().ServerOf(name, b));
  ASSERT_EQ(servers.size(), 3u) << "the test needs the blocks on 3 servers";

  std::vector<float> g(kSplit, 0.5f);
  g[3000] = std::nanf("");  // element 952 of block 2
  for (int way = 0; way < 4; ++way) {
    SCOPED_TRACE(absl::StrCat("way ", way));
    EXPECT_THAT(
        PushEveryWay(*client, {{name, Tensor::FromValues<float>({kSplit}, g)}}, way),
        StatusIs(absl::StatusCode::kInvalidArgument,
                 AllOf(HasSubstr(absl::StrCat("gradient for parameter '", name,
                                              "' block 2 of 3: element 952 of the block (element "
                                              "3000 of the parameter) is NaN")),
                       HasSubstr("nothing of the request was applied"))));
    ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam(name));
    EXPECT_EQ(w.ToVector<float>(), w0);
    EXPECT_EQ(AppliedOnAllServers(*client), 0u);
  }
}

TEST_P(IntegrationTest, NaNInOneParameterOfABatchOverTwoServersAppliesNothing) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  const auto [a, b] = NamesOnTwoServers(*client);
  ASSERT_NE(a, b);
  ASSERT_OK(client->InitParam(a, Tensor::FromValues<float>({2}, {1, 2}), Sgd(1)));
  ASSERT_OK(client->InitParam(b, Tensor::FromValues<float>({2}, {3, 4}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());
  const float inf = std::numeric_limits<float>::infinity();
  // Also from a client that has not seen the parameters (it learns b's mode).
  auto fresh = NewClient();
  ASSERT_NE(fresh, nullptr);
  for (Client* pusher : {client.get(), fresh.get()}) {
    for (int way = 0; way < 4; ++way) {
      SCOPED_TRACE(absl::StrCat(pusher == fresh.get() ? "fresh client, " : "", "way ", way));
      EXPECT_THAT(
          PushEveryWay(*pusher,
                       {{a, Tensor::FromValues<float>({2}, {1, 1})},
                        {b, Tensor::FromValues<float>({2}, {1, -inf})}},
                       way),
          StatusIs(
              absl::StatusCode::kInvalidArgument,
              AllOf(HasSubstr(absl::StrCat("gradient for parameter '", b, "': element 1 is -inf")),
                    HasSubstr("nothing of the request was applied"))));
      ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, client->GetParams({a, b}));
      EXPECT_EQ(got[0].ToVector<float>(), (std::vector<float>{1, 2}));
      EXPECT_EQ(got[1].ToVector<float>(), (std::vector<float>{3, 4}));
      EXPECT_EQ(AppliedOnAllServers(*client), 0u);
    }
  }
}

TEST_P(IntegrationTest, SkipModeSplitGradientIsSkippedByEveryServerAndTheRestApplies) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  v1::ParameterConfig skip = Sgd(1);
  skip.set_non_finite(v1::ParameterConfig::SKIP);
  const std::vector<float> s0 = Iota(kSplit, 1);
  const std::string s_name = SpreadName(*client, "s", 3);  // one block on each server
  ASSERT_OK(client->InitParam(s_name, Tensor::FromValues<float>({kSplit}, s0), skip));
  ASSERT_OK(client->InitParam("a", Tensor::FromValues<float>({2}, {1, 2}), Sgd(1)));
  ASSERT_OK(client->FinishInitParams());

  std::vector<float> g(kSplit, 0.5f);
  g[1500] = std::nanf("");  // in block 1 only
  // Blocking and async push, then push-pull (which returns the parameters).
  for (int way = 0; way < 3; ++way) {
    SCOPED_TRACE(absl::StrCat("way ", way));
    ASSERT_OK(PushEveryWay(*client,
                           {{s_name, Tensor::FromValues<float>({kSplit}, g)},
                            {"a", Tensor::FromValues<float>({2}, {1, 1})}},
                           way == 2 ? 1 : way * 2));
    ASSERT_OK_AND_ASSIGN(std::vector<Tensor> got, client->GetParams({s_name, "a"}));
    EXPECT_EQ(got[0].ToVector<float>(), s0) << "a block of 's' was applied";
    EXPECT_EQ(got[1].ToVector<float>(), (std::vector<float>{-static_cast<float>(way), 1.f - way}));
    ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
    for (const v1::ServerStats& server : stats) {
      // Each server holds one block of "s" and skipped it every time.
      EXPECT_EQ(server.non_finite_skipped(), static_cast<uint64_t>(way + 1))
          << "server " << server.index();
    }
    EXPECT_EQ(client->non_finite_skipped(), static_cast<uint64_t>(way + 1));
  }
  // A client that has not seen "s" learns its mode from the servers.
  auto fresh = NewClient();
  ASSERT_NE(fresh, nullptr);
  ASSERT_OK(fresh->SendGrad(s_name, Tensor::FromValues<float>({kSplit}, g)));
  EXPECT_EQ(fresh->non_finite_skipped(), 1u);
  ASSERT_OK_AND_ASSIGN(Tensor s, client->GetParam(s_name));
  EXPECT_EQ(s.ToVector<float>(), s0);
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  for (const v1::ServerStats& server : stats) EXPECT_EQ(server.non_finite_skipped(), 4u);
}

TEST_P(IntegrationTest, ZeroSizeParametersAreRefusedWithOneTrueMessage) {
  auto client = NewClient();
  ASSERT_NE(client, nullptr);
  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Create(v1::FLOAT32, {0}, ""));
  EXPECT_THAT(client->InitParam("e", empty, Sgd(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter 'e': shape [0] has no elements (a parameter needs at least one "
                       "element)"));
  // A server sent one directly (not through the client) says the same.
  v1::Parameter param;
  param.set_name("e");
  param.set_element_type(v1::FLOAT32);
  param.add_shape(0);
  EXPECT_THAT(cluster_->stores()[0]->Init(param, Sgd(1)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter 'e': shape [0] has no elements (a parameter needs at least one "
                       "element)"));
}

TEST_P(IntegrationTest, ForgedBlockLayoutsAreRefused) {
  // What a hostile or broken client could send with InitParam directly.
  auto channel = grpc::CreateChannel(cluster_->addresses()[0], grpc::InsecureChannelCredentials());
  auto stub = v1::ParameterServer::NewStub(channel);
  auto init = [&](uint32_t index, uint32_t count, uint64_t offset, std::vector<float> values) {
    v1::InitParamRequest request;
    v1::Parameter* param = request.mutable_parameter();
    param->set_name("forged");
    param->set_element_type(v1::FLOAT32);
    param->add_shape(6);
    param->set_content(values.data(), values.size() * sizeof(float));
    param->mutable_block()->set_index(index);
    param->mutable_block()->set_count(count);
    param->mutable_block()->set_offset(offset);
    *request.mutable_config() = Sgd(1);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    v1::InitParamResponse response;
    return stub->InitParam(&context, request, &response);
  };
  grpc::Status huge = init(0, 0xffffffffu, 0, {1});
  EXPECT_EQ(huge.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(huge.error_message(), HasSubstr("4294967295 blocks for a parameter of 6 elements"));
  ASSERT_TRUE(init(0, 2, 0, {1, 2, 3, 4}).ok());
  grpc::Status overlap = init(1, 2, 3, {5, 6, 7});
  EXPECT_EQ(overlap.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_THAT(overlap.error_message(), HasSubstr("other blocks"));
}

INSTANTIATE_TEST_SUITE_P(Transports, IntegrationTest,
                         ::testing::Values(Via::kGrpc, Via::kInProcess), ViaName);

TEST(ClientTest, UnreachableServerFailsWithinTheDeadline) {
  // Start a server to learn a free port, then stop it: nothing listens there.
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(ServerOptions{}));
  const std::string address = server->address();
  server->Shutdown();
  server.reset();

  ClientOptions options;
  options.servers = {address};
  options.timeout = absl::Milliseconds(300);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  const absl::Time start = absl::Now();
  EXPECT_THAT(client->GetParam("w"),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr(address)));
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

TEST(ClientTest, RejectsBadOptions) {
  ClientOptions options;
  EXPECT_THAT(Client::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("no servers")));
  options.servers = {""};
  EXPECT_THAT(Client::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("empty")));
  options.servers = {"127.0.0.1:1"};
  options.block_bytes = 0;
  EXPECT_THAT(Client::Connect(options), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_bytes")));
  options.block_bytes = 1 << 20;
  options.channels_per_server = 0;
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("channels_per_server")));
}

}  // namespace
}  // namespace pserver
