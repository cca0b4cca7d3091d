// Tests of the pserver binary as a user runs it: a child process started with
// flags, whose "listening" line tells the address, that serves a real Client,
// and that stops cleanly on SIGTERM/SIGINT. Every wait has a deadline.
#include <signal.h>
#include <sys/wait.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);

// Starts `pserver --port=0 --index=<index>` and waits for its address.
class PserverProcessTest : public ::testing::Test {
 protected:
  void StartServer(uint32_t index) {
    ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                                     {"--host=127.0.0.1", "--port=0",
                                                      absl::StrCat("--index=", index)}));
    absl::StatusOr<std::string> address =
        WaitForPserverAddress(*child_, index, absl::Now() + kStartTimeout);
    ASSERT_TRUE(address.ok()) << address.status() << "\nstdout:\n"
                              << child_->out() << "\nstderr:\n"
                              << child_->err();
    ASSERT_TRUE(absl::StartsWith(*address, "127.0.0.1:")) << *address;
    int port = 0;
    ASSERT_TRUE(absl::SimpleAtoi(absl::string_view(*address).substr(10), &port)) << *address;
    ASSERT_GT(port, 0);
    ASSERT_LE(port, 65535);
    address_ = *address;
  }

  // Sends `signal` and expects a clean exit (status 0) within kStopTimeout.
  void StopServer(int signal) {
    ASSERT_EQ(kill(child_->pid(), signal), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << DescribeWaitStatus(status) << "\nstdout:\n"
        << child_->out() << "\nstderr:\n"
        << child_->err();
  }

  std::unique_ptr<ChildProcess> child_;  // its destructor kills a live child
  std::string address_;
};

TEST_F(PserverProcessTest, ServesAClientAndStopsCleanlyOnSigterm) {
  ASSERT_NO_FATAL_FAILURE(StartServer(2));

  ClientOptions options;
  options.servers = {address_};
  options.timeout = absl::Seconds(10);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));

  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(0.5);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({2, 2}, {1, 2, 3, 4}), config));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({2, 2}, {2, 2, 2, -4})));

  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.type(), v1::FLOAT32);
  EXPECT_THAT(w.shape(), ElementsAre(2, 2));
  EXPECT_THAT(w.ToVector<float>(), ElementsAre(0.0f, 1.0f, 2.0f, 6.0f));  // w - 0.5 g

  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, client->GetStats());
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_EQ(stats[0].index(), 2u);  // from --index=2
  EXPECT_TRUE(stats[0].initialized());
  EXPECT_EQ(stats[0].gradients_applied(), 1u);
  client.reset();

  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  EXPECT_THAT(child_->out(), HasSubstr("shutting down"));
  EXPECT_THAT(child_->out(), HasSubstr("pserver 2: stopped"));
}

TEST_F(PserverProcessTest, StopsCleanlyOnSigint) {
  ASSERT_NO_FATAL_FAILURE(StartServer(0));
  ASSERT_NO_FATAL_FAILURE(StopServer(SIGINT));
  EXPECT_THAT(child_->out(), HasSubstr("shutting down"));
}

TEST_F(PserverProcessTest, OutOfRangePortExitsWithStatusOne) {
  ASSERT_OK_AND_ASSIGN(child_,
                       ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), {"--port=99999"}));
  ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1)
      << DescribeWaitStatus(status) << "\noutput:\n"
      << child_->output();
  EXPECT_THAT(child_->output(), HasSubstr("port"));
  EXPECT_THAT(child_->output(), HasSubstr("99999"));
  EXPECT_THAT(child_->out(), ::testing::Not(HasSubstr("listening")));
}

}  // namespace
}  // namespace pserver
