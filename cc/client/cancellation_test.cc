#include "cc/client/cancellation.h"

#include <memory>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/client/worker_group.h"
#include "cc/server/in_process_transport.h"
#include "cc/server/local_cluster.h"
#include "cc/testing/status_matchers.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;

TEST(CancellationTest, CancelRunsEveryCallbackOnceAndSticks) {
  Cancellation cancel;
  int runs = 0;
  Cancellation::Registration a = cancel.OnCancel([&] { ++runs; });
  Cancellation::Registration b = cancel.OnCancel([&] { ++runs; });
  EXPECT_FALSE(cancel.cancelled());
  EXPECT_OK(cancel.Check());
  cancel.Cancel();
  cancel.Cancel();
  EXPECT_EQ(runs, 2);
  EXPECT_TRUE(cancel.cancelled());
  EXPECT_THAT(cancel.Check(), StatusCodeIs(absl::StatusCode::kCancelled));
  // Registering after the fact runs at once.
  Cancellation::Registration c = cancel.OnCancel([&] { ++runs; });
  EXPECT_EQ(runs, 3);
}

TEST(CancellationTest, ResetRegistrationIsNotRun) {
  Cancellation cancel;
  int runs = 0;
  {
    Cancellation::Registration gone = cancel.OnCancel([&] { ++runs; });
  }
  Cancellation::Registration moved = cancel.OnCancel([&] { ++runs; });
  Cancellation::Registration target = std::move(moved);
  target.Reset();
  cancel.Cancel();
  EXPECT_EQ(runs, 0);
}

TEST(CancellationTest, WaitForEndsWhenCancelled) {
  Cancellation cancel;
  EXPECT_FALSE(cancel.WaitFor(absl::ZeroDuration()));
  std::thread canceller([&] { cancel.Cancel(); });
  // Would wait a minute without the cancel.
  EXPECT_TRUE(cancel.WaitFor(absl::Seconds(60)));
  canceller.join();
}

TEST(CancellationTest, WaitForRunsTheCheckOnItsThreadUntilItSaysSo) {
  Cancellation cancel;
  const std::thread::id caller = std::this_thread::get_id();
  int checks = 0, elsewhere = 0;
  cancel.SetCheck(
      [&] {
        if (std::this_thread::get_id() != caller) ++elsewhere;
        return ++checks == 3;
      },
      absl::Milliseconds(1));
  // Would wait a minute without the check.
  EXPECT_TRUE(cancel.WaitFor(absl::Seconds(60)));
  EXPECT_EQ(checks, 3);
  EXPECT_EQ(elsewhere, 0);
  // Cancelled: the check is not run again.
  EXPECT_TRUE(cancel.WaitFor(absl::Seconds(60)));
  EXPECT_EQ(checks, 3);
}

// A caller that waits in slices shorter than the check's period (the
// client's retry wait, 10 ms at a time) still has the check run: once at the
// end of every slice. Here the period is an hour, so only that end can run it.
TEST(CancellationTest, AWaitShorterThanTheCheckPeriodStillRunsTheCheck) {
  Cancellation cancel;
  int checks = 0;
  cancel.SetCheck([&] { return ++checks == 2; }, absl::Hours(1));
  EXPECT_FALSE(cancel.WaitFor(absl::Milliseconds(1)));
  EXPECT_EQ(checks, 1);
  EXPECT_TRUE(cancel.WaitFor(absl::Milliseconds(1)));
  EXPECT_EQ(checks, 2);
}

TEST(CancellationTest, AwaitRunsTheCurrentCheckAndKeepsWaitingForTheCondition) {
  Cancellation cancel;
  int checks = 0;
  cancel.SetCheck([&] { return ++checks == 2; }, absl::Milliseconds(1));
  absl::Mutex mu;
  bool done = false;
  Cancellation::Registration finish = cancel.OnCancel([&] {
    absl::MutexLock lock(&mu);  // as a call's completion would: Await released mu
    done = true;
  });
  {
    const Cancellation::Scope scope(&cancel);
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(Cancellation::Await(mu, absl::Condition(&done)));
  }
  EXPECT_EQ(checks, 2);
  EXPECT_TRUE(cancel.cancelled());
  // Without a current cancellation, a timeout is a plain timed wait.
  absl::MutexLock lock(&mu);
  bool never = false;
  EXPECT_FALSE(Cancellation::Await(mu, absl::Condition(&never), absl::Milliseconds(1)));
}

TEST(CancellationTest, ScopeInstallsAndRestoresCurrent) {
  Cancellation outer, inner;
  EXPECT_EQ(Cancellation::Current(), nullptr);
  {
    Cancellation::Scope a(&outer);
    EXPECT_EQ(Cancellation::Current(), &outer);
    {
      Cancellation::Scope b(&inner);
      EXPECT_EQ(Cancellation::Current(), &inner);
      Cancellation::Scope keep(nullptr);
      EXPECT_EQ(Cancellation::Current(), &inner);
    }
    EXPECT_EQ(Cancellation::Current(), &outer);
  }
  EXPECT_EQ(Cancellation::Current(), nullptr);
}

class CancelledCallTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(cluster_, LocalCluster::Start(2));
    ClientOptions options;
    options.servers = cluster_->addresses();
    options.timeout = absl::Seconds(60);
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(options));
  }

  // Runs `fn` on another thread, cancels it, and returns its status; the
  // call would otherwise wait its whole 60 s deadline.
  absl::Status CancelWhileRunning(const std::function<absl::Status(const CallOptions&)>& fn) {
    Cancellation cancel;
    CallOptions call;
    call.cancel = &cancel;
    absl::Status status;
    absl::Notification done;
    const absl::Time start = absl::Now();
    std::thread caller([&] {
      status = fn(call);
      done.Notify();
    });
    cancel.Cancel();
    caller.join();
    EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << "the 60 s call was not ended";
    return status;
  }

  std::unique_ptr<LocalCluster> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(CancelledCallTest, BarrierWaitingForAbsentMemberEndsCancelled) {
  WorkerGroup group(*client_, "g", /*size=*/2, "alone");
  EXPECT_THAT(CancelWhileRunning([&](const CallOptions& call) {
                return group.Barrier(BarrierScope::kWorkers, call);
              }),
              StatusCodeIs(absl::StatusCode::kCancelled));
  // The client still works.
  EXPECT_OK(client_->GetStats().status());
}

TEST_F(CancelledCallTest, CallToAServerThatIsDownEndsCancelled) {
  // A server that stopped: its requests wait for it to come back (within
  // the deadline) until cancelled.
  cluster_->server(1).Shutdown(absl::ZeroDuration());
  EXPECT_THAT(
      CancelWhileRunning([&](const CallOptions& call) { return client_->GetStats(call).status(); }),
      StatusCodeIs(absl::StatusCode::kCancelled));
}

// An in-process client's waits run on the calling thread in the store; they
// look at the cancellation between short slices.
TEST_F(CancelledCallTest, InProcessWaitsEndCancelled) {
  ClientOptions options;
  options.timeout = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> local,
                       Client::Create(options, InProcessTransports(*cluster_)));
  WorkerGroup group(*local, "g", /*size=*/2, "alone");
  EXPECT_THAT(CancelWhileRunning([&](const CallOptions& call) {
                return group.Barrier(BarrierScope::kWorkers, call);
              }),
              StatusCodeIs(absl::StatusCode::kCancelled));
  Tensor sum = Tensor::FromValues<float>({2}, {1, 2});
  EXPECT_THAT(CancelWhileRunning([&](const CallOptions& call) {
                return group.AllReduce(&sum, ReduceOp::kSum, call);
              }),
              StatusCodeIs(absl::StatusCode::kCancelled));
  // A cancellable wait that ends by itself is not disturbed by the slices,
  // however many pass before the other member arrives.
  WorkerGroup one(*local, "h", /*size=*/2, "one");
  WorkerGroup other(*local, "h", /*size=*/2, "other");
  Cancellation cancel;
  CallOptions call;
  call.cancel = &cancel;
  absl::Status first;
  std::thread member([&] { first = one.Barrier(BarrierScope::kWorkers, call); });
  EXPECT_OK(other.Barrier(BarrierScope::kWorkers));
  member.join();
  EXPECT_OK(first);
}

TEST_F(CancelledCallTest, CancelledBeforeTheCallSendsNothing) {
  Cancellation cancel;
  cancel.Cancel();
  CallOptions call;
  call.cancel = &cancel;
  WorkerGroup group(*client_, "g", /*size=*/2, "alone");
  EXPECT_THAT(group.Barrier(BarrierScope::kWorkers, call),
              StatusCodeIs(absl::StatusCode::kCancelled));
}

}  // namespace
}  // namespace pserver
