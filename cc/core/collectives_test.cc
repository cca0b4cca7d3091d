#include "cc/core/collectives.h"

#include <array>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/element_type.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr absl::Duration kLong = absl::Seconds(30);  // never reached when the code is right

absl::Time Long() { return absl::Now() + kLong; }

// Waits (bounded) until `n` rounds are open: callers have arrived and wait.
bool AwaitOpenSlots(const Collectives& c, size_t n) {
  const absl::Time deadline = Long();
  while (c.open_slots() != n) {
    if (absl::Now() > deadline) return false;
    absl::SleepFor(absl::Microseconds(200));
  }
  return true;
}

template <typename T>
std::string Bytes(const std::vector<T>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(T));
}

template <typename T>
std::vector<T> Values(const std::string& bytes) {
  std::vector<T> v(bytes.size() / sizeof(T));
  if (!bytes.empty()) std::memcpy(v.data(), bytes.data(), bytes.size());
  return v;
}

TEST(CollectivesTest, BarrierOfFourThreadsOverTwentyRounds) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 20;
  Collectives c;
  std::array<std::atomic<int>, kRounds + 1> arrived{};
  std::atomic<int> early{0};
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (uint64_t round = 1; round <= kRounds; ++round) {
        arrived[round].fetch_add(1);
        if (!c.Barrier("step", round, kThreads, absl::StrCat("w", t), Long()).ok()) {
          failures.fetch_add(1);
          return;
        }
        // Nobody leaves a round before everyone has arrived at it.
        if (arrived[round].load() != kThreads) early.fetch_add(1);
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(early.load(), 0);
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BarrierOfOneReturnsAtOnce) {
  Collectives c;
  EXPECT_OK(c.Barrier("solo", 1, 1, "w0", absl::InfinitePast()));
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BarrierTimeoutWithdrawsTheArrivalSoARetryCanArrive) {
  Collectives c;
  absl::Status w2_status = absl::UnknownError("not returned");
  std::thread w2([&] { w2_status = c.Barrier("b", 3, 3, "w2", Long()); });
  ASSERT_TRUE(AwaitOpenSlots(c, 1));
  EXPECT_THAT(c.Barrier("b", 3, 3, "w0", absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("barrier 'b' round 3: 2 of 3 arrived (w0, w2)")));
  // w0 was withdrawn: its retry is a fresh arrival, not ALREADY_EXISTS.
  absl::Status w0_status = absl::UnknownError("not returned");
  std::thread w0([&] { w0_status = c.Barrier("b", 3, 3, "w0", Long()); });
  // Until w0 is back, w1 alone with w2 cannot finish the round.
  EXPECT_OK(c.Barrier("b", 3, 3, "w1", Long()));
  w0.join();
  w2.join();
  EXPECT_OK(w0_status);
  EXPECT_OK(w2_status);
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BarrierWhoseCallersAllGaveUpIsFreed) {
  Collectives c;
  EXPECT_THAT(c.Barrier("b", 1, 2, "w0", absl::Now() + absl::Milliseconds(5)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2 arrived (w0)")));
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BarrierRejectsBadArguments) {
  Collectives c;
  EXPECT_THAT(c.Barrier("b", 3, 0, "w0", Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("size")));
  EXPECT_THAT(c.Barrier("b", 3, 2, "", Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("participant is empty")));
  absl::Status w0_status = absl::UnknownError("not returned");
  std::thread w0([&] { w0_status = c.Barrier("b", 3, 4, "w0", Long()); });
  ASSERT_TRUE(AwaitOpenSlots(c, 1));
  EXPECT_THAT(c.Barrier("b", 3, 3, "w1", Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("barrier 'b' round 3 has size 4, got 3")));
  EXPECT_THAT(c.Barrier("b", 3, 4, "w0", Long()),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'w0'")));
  // The same name in another round, or another kind, is another slot.
  EXPECT_THAT(c.Barrier("b", 4, 3, "w1", absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("round 4: 1 of 3")));
  c.Shutdown();
  w0.join();
  EXPECT_THAT(w0_status, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

// Runs one all-reduce round of `inputs.size()` threads; returns each one's
// result.
template <typename T>
std::vector<std::string> RunAllReduce(Collectives& c, const std::string& name, uint64_t round,
                                      const std::vector<std::vector<T>>& inputs, ReduceOp op) {
  std::vector<std::string> outs(inputs.size());
  std::vector<absl::Status> statuses(inputs.size());
  std::vector<std::thread> threads;
  for (size_t p = 0; p < inputs.size(); ++p) {
    threads.emplace_back([&, p] {
      statuses[p] = c.AllReduce(name, round, inputs.size(), absl::StrCat("p", p),
                                kElementTypeOf<T>, Bytes(inputs[p]), op, &outs[p], Long());
    });
  }
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) EXPECT_OK(s) << name << " round " << round;
  return outs;
}

template <typename T>
void CheckAllReduceOfType() {
  Collectives c;
  const std::string name = ElementTypeName(kElementTypeOf<T>);
  uint64_t round = 0;
  for (size_t participants : {1u, 3u}) {
    for (size_t n : {0u, 1u, 3u, 17u, 1000u}) {
      std::vector<std::vector<T>> inputs(participants, std::vector<T>(n));
      for (size_t p = 0; p < participants; ++p) {
        for (size_t i = 0; i < n; ++i) {
          int64_t v = static_cast<int64_t>((i * 7 + p * 13) % 23);
          if (std::is_signed_v<T> && (i + p) % 2 == 1) v = -v;
          if constexpr (std::is_floating_point_v<T>) {
            inputs[p][i] = static_cast<T>(v) / static_cast<T>(3) + static_cast<T>(0.1) * p;
          } else {
            inputs[p][i] = static_cast<T>(v);
          }
        }
      }
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kMean}) {
        ++round;
        std::vector<std::string> outs = RunAllReduce(c, name, round, inputs, op);
        // The expected result, added in participant order as documented.
        std::vector<T> want(n);
        for (size_t i = 0; i < n; ++i) {
          T sum = 0;
          for (size_t p = 0; p < participants; ++p) sum += inputs[p][i];
          if (op == ReduceOp::kMean) {
            if constexpr (std::is_floating_point_v<T>) {
              sum = sum / static_cast<T>(participants);
            } else {
              sum = static_cast<T>(sum / static_cast<T>(participants));  // toward zero
            }
          }
          want[i] = sum;
        }
        for (size_t p = 0; p < participants; ++p) {
          ASSERT_EQ(outs[p].size(), n * sizeof(T));
          EXPECT_EQ(outs[p], outs[0]) << "participants got different bytes";
          EXPECT_EQ(Values<T>(outs[p]), want)
              << name << " n=" << n << " participants=" << participants
              << (op == ReduceOp::kMean ? " mean" : " sum");
        }
      }
    }
  }
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, AllReduceSumsAndAveragesEveryType) {
  CheckAllReduceOfType<int32_t>();
  CheckAllReduceOfType<uint32_t>();
  CheckAllReduceOfType<int64_t>();
  CheckAllReduceOfType<uint64_t>();
  CheckAllReduceOfType<float>();
  CheckAllReduceOfType<double>();
}

TEST(CollectivesTest, AllReduceIntegerMeanTruncatesTowardZeroAndSumsWrap) {
  Collectives c;
  std::vector<std::string> outs =
      RunAllReduce<int32_t>(c, "m", 1, {{-7, 7, -1}, {0, 0, 0}}, ReduceOp::kMean);
  EXPECT_EQ(Values<int32_t>(outs[0]), (std::vector<int32_t>{-3, 3, 0}));
  outs = RunAllReduce<int32_t>(c, "wrap", 1, {{std::numeric_limits<int32_t>::max()}, {1}},
                               ReduceOp::kSum);
  EXPECT_EQ(Values<int32_t>(outs[0]),
            (std::vector<int32_t>{std::numeric_limits<int32_t>::min()}));
}

TEST(CollectivesTest, AllReduceRejectsContributionsThatDisagree) {
  Collectives c;
  const std::vector<float> w0_data = {1, 2, 3, 4};
  std::string w0_out;
  absl::Status w0_status = absl::UnknownError("not returned");
  std::thread w0([&] {
    w0_status = c.AllReduce("g", 2, 2, "w0", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum,
                            &w0_out, Long());
  });
  ASSERT_TRUE(AwaitOpenSlots(c, 1));
  std::string out;
  const std::vector<double> doubles = {1, 2};
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::FLOAT64, Bytes(doubles), ReduceOp::kSum, &out,
                          Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("all-reduce 'g' round 2"), HasSubstr("float64"),
                             HasSubstr("float32"))));
  const std::vector<float> short_data = {1, 2, 3};
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::FLOAT32, Bytes(short_data), ReduceOp::kSum,
                          &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("12 bytes"), HasSubstr("16 bytes"))));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::FLOAT32, Bytes(w0_data), ReduceOp::kMean, &out,
                          Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("mean"), HasSubstr("sum"))));
  EXPECT_THAT(c.AllReduce("g", 2, 3, "w1", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum, &out,
                          Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("all-reduce 'g' round 2 has size 2, got 3")));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w0", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum, &out,
                          Long()),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'w0'")));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::FLOAT32, "12345", ReduceOp::kSum, &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("5 bytes"), HasSubstr("float32"))));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::ELEMENT_TYPE_UNSPECIFIED, "", ReduceOp::kSum,
                          &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("all-reduce")));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum, &out,
                          Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("participant is empty")));
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w1", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum,
                          nullptr, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("output")));
  EXPECT_THAT(c.AllReduce("g", 2, 0, "w1", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum, &out,
                          Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("size")));
  // None of that counted: a good contribution completes the round.
  ASSERT_OK(c.AllReduce("g", 2, 2, "w1", v1::FLOAT32, Bytes(w0_data), ReduceOp::kSum, &out,
                        Long()));
  w0.join();
  ASSERT_OK(w0_status);
  EXPECT_EQ(Values<float>(out), (std::vector<float>{2, 4, 6, 8}));
  EXPECT_EQ(w0_out, out);
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, AllReduceTimeoutWithdrawsSoARetryIsCountedOnce) {
  Collectives c;
  std::string w1_out;
  absl::Status w1_status = absl::UnknownError("not returned");
  std::thread w1([&] {
    w1_status = c.AllReduce("g", 1, 3, "w1", v1::INT64, Bytes(std::vector<int64_t>{10}),
                            ReduceOp::kSum, &w1_out, Long());
  });
  ASSERT_TRUE(AwaitOpenSlots(c, 1));
  std::string out;
  EXPECT_THAT(c.AllReduce("g", 1, 3, "w0", v1::INT64, Bytes(std::vector<int64_t>{1000}),
                          ReduceOp::kSum, &out, absl::Now() + absl::Milliseconds(20)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("all-reduce 'g' round 1: 2 of 3 contributed (w0, w1)")));
  EXPECT_EQ(c.open_slots(), 1u);  // w1 still waits
  std::string w0_out;
  absl::Status w0_status = absl::UnknownError("not returned");
  std::thread w0([&] {
    w0_status = c.AllReduce("g", 1, 3, "w0", v1::INT64, Bytes(std::vector<int64_t>{1}),
                            ReduceOp::kSum, &w0_out, Long());
  });
  ASSERT_OK(c.AllReduce("g", 1, 3, "w2", v1::INT64, Bytes(std::vector<int64_t>{100}),
                        ReduceOp::kSum, &out, Long()));
  w0.join();
  w1.join();
  ASSERT_OK(w0_status);
  ASSERT_OK(w1_status);
  EXPECT_EQ(Values<int64_t>(out), (std::vector<int64_t>{111}));  // 1000 withdrawn
  EXPECT_EQ(w0_out, out);
  EXPECT_EQ(w1_out, out);
  EXPECT_EQ(c.open_slots(), 0u);

  // A round whose only caller gave up is freed.
  EXPECT_THAT(c.AllReduce("g", 2, 2, "w0", v1::INT64, "", ReduceOp::kSum, &out,
                          absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2 contributed")));
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BroadcastReachesThreeReadersAndIsFreed) {
  Collectives c;
  std::vector<std::string> outs(3);
  std::vector<absl::Status> statuses(3, absl::UnknownError("not returned"));
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back(
        [&, r] { statuses[r] = c.BroadcastGet("x", 2, 4, absl::StrCat("r", r), &outs[r], Long()); });
  }
  ASSERT_TRUE(AwaitOpenSlots(c, 1));
  ASSERT_OK(c.BroadcastPut("x", 2, 4, "payload"));
  EXPECT_THAT(c.BroadcastPut("x", 2, 4, "again"),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("broadcast 'x' round 2")));
  for (std::thread& t : readers) t.join();
  EXPECT_EQ(c.open_slots(), 1u);  // the third reader has not come yet
  EXPECT_THAT(c.BroadcastGet("x", 2, 4, "r0", &outs[2], Long()),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("'r0'")));
  // A reader arriving after the put gets the data at once.
  statuses[2] = c.BroadcastGet("x", 2, 4, "r2", &outs[2], absl::InfinitePast());
  for (int r = 0; r < 3; ++r) {
    EXPECT_OK(statuses[r]);
    EXPECT_EQ(outs[r], "payload");
  }
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, BroadcastDeadlineAndBadArguments) {
  Collectives c;
  std::string out;
  EXPECT_THAT(c.BroadcastGet("x", 2, 3, "r0", &out, absl::Now() + absl::Milliseconds(5)),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("broadcast 'x' round 2: no data from the root yet")));
  EXPECT_EQ(c.open_slots(), 0u);
  EXPECT_THAT(c.BroadcastGet("x", 2, 1, "r0", &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("at least 2")));
  EXPECT_THAT(c.BroadcastGet("x", 2, 3, "", &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("participant is empty")));
  EXPECT_THAT(c.BroadcastPut("x", 2, 0, "d"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("size")));
  // The root alone: nothing to keep.
  EXPECT_OK(c.BroadcastPut("solo", 1, 1, "d"));
  EXPECT_EQ(c.open_slots(), 0u);
  ASSERT_OK(c.BroadcastPut("x", 3, 3, "d"));
  EXPECT_THAT(c.BroadcastGet("x", 3, 4, "r0", &out, Long()),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("broadcast 'x' round 3 has size 3, got 4")));
  EXPECT_EQ(c.open_slots(), 1u);  // unread data stays until it expires
}

TEST(CollectivesTest, UnreadBroadcastDataExpires) {
  Collectives::Options options;
  options.broadcast_ttl = absl::ZeroDuration();
  Collectives c(options);
  ASSERT_OK(c.BroadcastPut("x", 1, 3, "d"));
  EXPECT_EQ(c.open_slots(), 1u);
  // The next call drops the expired data; this reader finds none.
  std::string out;
  EXPECT_THAT(c.BroadcastGet("x", 1, 3, "r0", &out, absl::InfinitePast()),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("no data")));
  EXPECT_EQ(c.open_slots(), 0u);
}

TEST(CollectivesTest, ShutdownWakesEveryWaiter) {
  Collectives c;
  std::vector<absl::Status> statuses(3, absl::UnknownError("not returned"));
  std::string out1, out2;
  std::vector<std::thread> threads;
  threads.emplace_back([&] { statuses[0] = c.Barrier("b", 1, 2, "w0", Long()); });
  threads.emplace_back([&] {
    statuses[1] = c.AllReduce("g", 1, 2, "w0", v1::FLOAT32, "", ReduceOp::kSum, &out1, Long());
  });
  threads.emplace_back([&] { statuses[2] = c.BroadcastGet("x", 1, 2, "r0", &out2, Long()); });
  ASSERT_TRUE(AwaitOpenSlots(c, 3));
  ASSERT_OK(c.BroadcastPut("unread", 1, 3, "d"));
  c.Shutdown();
  for (std::thread& t : threads) t.join();
  for (const absl::Status& s : statuses) {
    EXPECT_THAT(s, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server shutting down")));
  }
  EXPECT_EQ(c.open_slots(), 0u);
  EXPECT_THAT(c.Barrier("b", 2, 1, "w0", Long()),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("server shutting down")));
  EXPECT_THAT(c.BroadcastPut("x", 2, 2, "d"), StatusIs(absl::StatusCode::kUnavailable,
                                                      HasSubstr("server shutting down")));
}

// A result an asynchronous call delivers, or none yet.
struct Result {
  absl::Mutex mu;
  bool done ABSL_GUARDED_BY(mu) = false;
  absl::Status status ABSL_GUARDED_BY(mu);
  WaitDone Done() {
    return [this](absl::Status s) {
      absl::MutexLock lock(&mu);
      status = std::move(s);
      done = true;
    };
  }
  bool IsDone() {
    absl::MutexLock lock(&mu);
    return done;
  }
  absl::Status Get() {
    absl::MutexLock lock(&mu);
    return status;
  }
};

TEST(CollectivesTest, AsyncWaitsHoldNoThreadAndCancelDropsTheirChunks) {
  Collectives c;
  constexpr int kCallers = 50;
  std::vector<std::unique_ptr<Result>> results;
  std::vector<CancelWait> cancels;
  std::vector<std::string> outs(kCallers);
  const std::string chunk(1 << 16, '\0');
  for (int i = 0; i < kCallers; ++i) {
    results.push_back(std::make_unique<Result>());
    cancels.push_back(c.AllReduceAsync("g", 1, 1000, absl::StrCat("w", i), v1::FLOAT32, chunk,
                                       ReduceOp::kSum, &outs[i], Long(), results[i]->Done()));
  }
  // All registered, from this one thread, and none completed.
  EXPECT_EQ(c.waiting(), static_cast<size_t>(kCallers));
  EXPECT_EQ(c.held_bytes(), kCallers * chunk.size());
  EXPECT_EQ(c.open_slots(), 1u);
  for (const auto& r : results) EXPECT_FALSE(r->IsDone());
  for (int i = 0; i < kCallers; ++i) {
    cancels[i]();
    ASSERT_TRUE(results[i]->IsDone());  // at once, on the cancelling thread
    EXPECT_THAT(results[i]->Get(),
                StatusIs(absl::StatusCode::kCancelled,
                         AllOf(HasSubstr("all-reduce 'g' round 1"), HasSubstr("cancelled"))));
    EXPECT_EQ(c.held_bytes(), (kCallers - i - 1) * chunk.size());
  }
  EXPECT_EQ(c.waiting(), 0u);
  EXPECT_EQ(c.open_slots(), 0u);
  cancels[0]();  // again: a no-op

  // A cancelled barrier arrival is withdrawn, so the round needs it again.
  Result barrier;
  CancelWait cancel = c.BarrierAsync("b", 1, 2, "w0", Long(), barrier.Done());
  cancel();
  EXPECT_THAT(barrier.Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("1 of 2 arrived")));
  EXPECT_THAT(c.Barrier("b", 1, 2, "w1", absl::Now() + absl::Milliseconds(1)),
              StatusIs(absl::StatusCode::kDeadlineExceeded, HasSubstr("1 of 2 arrived (w1)")));
  // A cancelled broadcast reader leaves unread data untouched.
  std::string data;
  Result reader;
  c.BroadcastGetAsync("x", 1, 3, "r1", &data, Long(), reader.Done())();
  EXPECT_THAT(reader.Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("no data")));
  ASSERT_OK(c.BroadcastPut("x", 1, 3, "hello"));
  EXPECT_EQ(c.held_bytes(), 5u);
  ASSERT_OK(c.BroadcastGet("x", 1, 3, "r1", &data, Long()));
  EXPECT_EQ(data, "hello");
}

TEST(CollectivesTest, DestroyingWithWaitersCompletesThemUnavailable) {
  Result result;
  {
    Collectives c;
    c.BarrierAsync("b", 1, 3, "w0", Long(), result.Done());
    EXPECT_FALSE(result.IsDone());
  }
  EXPECT_THAT(result.Get(), StatusIs(absl::StatusCode::kUnavailable, HasSubstr("shutting down")));
}

TEST(CollectivesTest, HeldBytesAreCappedAndFreedByCancelOrCompletion) {
  constexpr size_t kChunk = 1 << 16;
  Collectives::Options options;
  options.max_held_bytes = 3 * kChunk + kChunk / 2;  // room for three chunks
  Collectives c(options);
  const std::string chunk(kChunk, '\0');
  std::vector<std::unique_ptr<Result>> results;
  std::vector<CancelWait> cancels;
  std::vector<std::string> outs(8);
  auto contribute = [&](absl::string_view name, int size, int who) {
    results.push_back(std::make_unique<Result>());
    cancels.push_back(c.AllReduceAsync(name, 1, size, absl::StrCat("w", who), v1::FLOAT32, chunk,
                                       ReduceOp::kSum, &outs[results.size() - 1], Long(),
                                       results.back()->Done()));
    return results.back().get();
  };
  // Three waiting contributions fill the room: a, a, b.
  Result* a0 = contribute("a", 3, 0);
  contribute("a", 3, 1);
  Result* b0 = contribute("b", 2, 0);
  EXPECT_EQ(c.held_bytes(), 3 * kChunk);

  // A fourth that would wait is refused at once, storing nothing; so is a
  // broadcast put that readers have yet to take.
  Result* refused = contribute("c", 2, 0);
  ASSERT_TRUE(refused->IsDone());
  EXPECT_THAT(
      refused->Get(),
      StatusIs(absl::StatusCode::kUnavailable,
               AllOf(HasSubstr("all-reduce 'c' round 1"), HasSubstr("--max_collective_bytes"),
                     HasSubstr(absl::StrCat("holds ", 3 * kChunk)),
                     HasSubstr(absl::StrCat("needs ", kChunk)), HasSubstr("retry"))));
  EXPECT_THAT(c.BroadcastPut("x", 1, 2, chunk),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("--max_collective_bytes")));
  EXPECT_EQ(c.held_bytes(), 3 * kChunk);
  EXPECT_EQ(c.open_slots(), 2u);  // a and b; the refused rounds left nothing
  EXPECT_EQ(c.waiting(), 3u);

  // A contribution that completes its round is never refused: it frees the
  // round's chunks.
  Result* b1 = contribute("b", 2, 1);
  ASSERT_TRUE(b1->IsDone());
  ASSERT_OK(b1->Get());
  ASSERT_OK(b0->Get());
  EXPECT_EQ(c.held_bytes(), 2 * kChunk);
  // Now one more fits, and then the room is full again.
  Result* c0 = contribute("c", 2, 0);
  EXPECT_FALSE(c0->IsDone());
  EXPECT_THAT(contribute("d", 2, 0)->Get(),
              StatusIs(absl::StatusCode::kUnavailable, HasSubstr("--max_collective_bytes")));

  // Cancelling a waiter frees its chunk at once; a new contribution fits.
  cancels[0]();
  EXPECT_THAT(a0->Get(), StatusIs(absl::StatusCode::kCancelled, HasSubstr("cancelled")));
  EXPECT_EQ(c.held_bytes(), 2 * kChunk);
  Result* d0 = contribute("d", 2, 0);
  EXPECT_FALSE(d0->IsDone());
  EXPECT_EQ(c.held_bytes(), 3 * kChunk);

  // A chunk larger than the whole limit can never fit: refused for good.
  EXPECT_THAT(
      c.AllReduce("e", 1, 2, "w0", v1::FLOAT32, std::string(4 * kChunk, '\0'), ReduceOp::kSum,
                  &outs[0], Long()),
      StatusIs(absl::StatusCode::kResourceExhausted,
               AllOf(HasSubstr("larger than the server's whole limit"),
                     HasSubstr(absl::StrCat("--max_collective_bytes=", options.max_held_bytes)))));
  for (size_t i = 1; i < cancels.size(); ++i) cancels[i]();
  EXPECT_EQ(c.held_bytes(), 0u);
  EXPECT_EQ(c.open_slots(), 0u);
}

}  // namespace
}  // namespace pserver
