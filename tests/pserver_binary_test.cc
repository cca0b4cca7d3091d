// Tests of the pserver binary as a user runs it: a child process started with
// flags, whose "listening" line tells the address, that serves a real Client,
// and that stops cleanly on SIGTERM/SIGINT. Every wait has a deadline.
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <regex>
#include <string>
#include <initializer_list>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
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
  void StartServer(uint32_t index, const std::vector<std::string>& extra = {}) {
    std::vector<std::string> args = {"--host=127.0.0.1", "--port=0",
                                      absl::StrCat("--index=", index)};
    args.insert(args.end(), extra.begin(), extra.end());
    ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), args));
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

  // Each (flag, message): pserver started with that one flag exits 1 at
  // once, its stderr saying `message`, never listening.
  template <size_t N>
  void ExpectEachExitsOneSaying(const std::pair<std::string, std::string> (&cases)[N]) {
    for (const auto& [flag, message] : cases) {
      ASSERT_OK_AND_ASSIGN(child_,
                           ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), {flag}));
      ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
      EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << flag << ": "
                                                                 << DescribeWaitStatus(status);
      EXPECT_THAT(child_->err(), HasSubstr(message)) << flag;
      EXPECT_THAT(child_->out(), ::testing::Not(HasSubstr("listening"))) << flag;
    }
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

// Every stderr line: "<UTC time to the microsecond> <LEVEL> pserver <index>: <message>".
TEST_F(PserverProcessTest, LogLinesHaveTimeLevelAndIndex) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/text_log");
  ASSERT_NO_FATAL_FAILURE(StartServer(1, {absl::StrCat("--checkpoint_dir=", dir)}));
  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  const std::vector<std::string> lines = absl::StrSplit(child_->err(), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << child_->err();
  const std::regex line(
      R"(^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z (ERROR|WARNING|INFO|DEBUG) pserver( \S+)?: .+$)");
  for (const std::string& l : lines) EXPECT_TRUE(std::regex_match(l, line)) << l;
  EXPECT_THAT(child_->err(), HasSubstr("Z INFO pserver 1: no checkpoint in "));
  EXPECT_THAT(child_->err(), HasSubstr("Z INFO pserver 1: saved checkpoint "));
}

// --log_format=json: every stderr line is one JSON object (parsed here) with
// time, level, server and message.
TEST_F(PserverProcessTest, JsonLogIsOneObjectPerLine) {
  const std::string dir = absl::StrCat(getenv("TEST_TMPDIR"), "/json_log");
  ASSERT_NO_FATAL_FAILURE(
      StartServer(1, {absl::StrCat("--checkpoint_dir=", dir), "--log_format=json"}));
  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  const std::vector<std::string> lines = absl::StrSplit(child_->err(), '\n', absl::SkipEmpty());
  ASSERT_GE(lines.size(), 2u) << child_->err();
  bool saw_saved = false;
  for (const std::string& l : lines) {
    google::protobuf::Struct object;
    ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(l, &object).ok()) << l;
    const auto& fields = object.fields();
    ASSERT_EQ(fields.count("time") + fields.count("level") + fields.count("server") +
                  fields.count("message"),
              4u)
        << l;
    EXPECT_EQ(fields.at("server").string_value(), "1") << l;
    EXPECT_EQ(fields.at("level").string_value(), "INFO") << l;
    saw_saved |= absl::StartsWith(fields.at("message").string_value(), "saved checkpoint ");
  }
  EXPECT_TRUE(saw_saved) << child_->err();
}

TEST_F(PserverProcessTest, UnknownLogFormatExitsWithStatusOne) {
  ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                                   {"--log_format=xml"}));
  ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << DescribeWaitStatus(status);
  EXPECT_THAT(child_->err(), HasSubstr("--log_format"));
  EXPECT_THAT(child_->err(), HasSubstr("'text' or 'json'"));
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

TEST_F(PserverProcessTest, ReplicasOrDepartLingerOutOfRangeOrReplicasWithoutEtcdExitWithStatusOne) {
  const std::pair<std::string, std::string> cases[] = {
      {"--replicas=0", "--replicas must be in [1, 65], got 0"},
      {"--replicas=66", "--replicas must be in [1, 65], got 66"},
      {"--depart_linger_seconds=-1", "--depart_linger_seconds must be in [0, 3600], got -1"},
      {"--depart_linger_seconds=3601", "--depart_linger_seconds must be in [0, 3600], got 3601"},
      {"--replicas=2", "--replicas > 1 needs etcd (--etcd)"},
  };
  ExpectEachExitsOneSaying(cases);
}

TEST_F(PserverProcessTest, JoinBoundsOutOfRangeExitWithStatusOneNamingTheFlag) {
  const std::pair<std::string, std::string> cases[] = {
      {"--max_joining_bytes=1023", "max_joining_bytes must be in [1024, 2^40], got 1023"},
      {"--join_timeout=0", "join_timeout must be in [1s, 1h], got 0"},
      {"--join_timeout=3601", "join_timeout must be in [1s, 1h], got 1h1s"},
      {"--catch_up_bytes=5", "catch_up_bytes must be 0 or in [1024, 2^40], got 5"},
  };
  ExpectEachExitsOneSaying(cases);
}

// Sets environment variables for the children this test spawns (they inherit
// the environment) and removes them again.
class ScopedEnvironment {
 public:
  ScopedEnvironment(std::initializer_list<std::pair<std::string, std::string>> variables)
      : variables_(variables) {
    for (const auto& [name, value] : variables_) setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnvironment() {
    for (const auto& [name, value] : variables_) unsetenv(name.c_str());
  }
  ScopedEnvironment(const ScopedEnvironment&) = delete;
  ScopedEnvironment& operator=(const ScopedEnvironment&) = delete;

 private:
  std::vector<std::pair<std::string, std::string>> variables_;
};

TEST_F(PserverProcessTest, FlagsComeFromPserverEnvironmentVariables) {
  ScopedEnvironment env(
      {{"PSERVER_INDEX", "5"}, {"PSERVER_HOST", "127.0.0.1"}, {"PSERVER_PORT", "0"},
       {"PSERVER_LOG_FORMAT", "json"}, {"PSERVER_NUM_THREDS", "4"}});
  ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), {}));
  absl::StatusOr<std::string> address =
      WaitForPserverAddress(*child_, 5, absl::Now() + kStartTimeout);
  ASSERT_TRUE(address.ok()) << address.status() << "\noutput:\n" << child_->output();
  // --log_format=json from the environment: the warning about the misspelt
  // variable is a JSON object naming it.
  EXPECT_THAT(child_->err(), HasSubstr("{\""));
  EXPECT_THAT(child_->err(), HasSubstr("PSERVER_NUM_THREDS names no pserver flag"));
  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  EXPECT_THAT(child_->out(), HasSubstr("pserver 5: stopped"));
}

TEST_F(PserverProcessTest, AFlagOnTheCommandLineWinsOverTheEnvironment) {
  ScopedEnvironment env({{"PSERVER_INDEX", "5"}});
  ASSERT_NO_FATAL_FAILURE(StartServer(6));  // --index=6
  ASSERT_NO_FATAL_FAILURE(StopServer(SIGTERM));
  EXPECT_THAT(child_->out(), HasSubstr("pserver 6: stopped"));
}

TEST_F(PserverProcessTest, ABadEnvironmentValueExitsWithStatusOneNamingIt) {
  ScopedEnvironment env({{"PSERVER_PORT", "seven"}});
  ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), {}));
  ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1)
      << DescribeWaitStatus(status) << "\noutput:\n"
      << child_->output();
  EXPECT_THAT(child_->err(), HasSubstr("PSERVER_PORT='seven'"));
  EXPECT_THAT(child_->err(), HasSubstr("--port"));
  EXPECT_THAT(child_->out(), ::testing::Not(HasSubstr("listening")));
}

TEST(PserverHelpTest, HelpListsPserversOwnFlagsAndExitsZero) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChildProcess> child,
                       ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), {"--help"}));
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status) << "\noutput:\n"
      << child->output();
  EXPECT_THAT(child->out(), HasSubstr("Usage: pserver"));
  for (const char* flag : {"--port", "--etcd", "--checkpoint_dir", "--max_message_bytes",
                           "--max_threads", "--max_connection_idle_seconds"}) {
    EXPECT_THAT(child->out(), HasSubstr(flag));
  }
  EXPECT_THAT(child->output(), ::testing::Not(HasSubstr("No flags matched")));
  EXPECT_THAT(child->out(), ::testing::Not(HasSubstr("--flagfile")));  // absl's: --helpfull
  EXPECT_THAT(child->out(), HasSubstr("PSERVER_<FLAG>"));
}

// A TCP socket on a free loopback port that accepts connections into its
// backlog and never answers: an etcd that hangs.
class SilentListener {
 public:
  SilentListener() {
    fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof(addr);
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
      return;
    }
    port_ = ntohs(addr.sin_port);
  }
  ~SilentListener() {
    for (int fd : accepted_) close(fd);
    if (fd_ >= 0) close(fd_);
  }
  int port() const { return port_; }
  // Waits until a connection arrives (and keeps it open, silent).
  bool AcceptOne(absl::Time deadline) {
    pollfd p{fd_, POLLIN, 0};
    const int ms =
        static_cast<int>(std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now())));
    if (poll(&p, 1, ms) != 1) return false;
    const int fd = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) return false;
    accepted_.push_back(fd);
    return true;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::vector<int> accepted_;
};

TEST(PserverStartingTest, SigtermWhileWaitingForEtcdStopsAtOnceSayingSo) {
  SilentListener etcd;
  ASSERT_GT(etcd.port(), 0);
  ASSERT_OK_AND_ASSIGN(
      std::unique_ptr<ChildProcess> child,
      ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                          {"--port=0", absl::StrCat("--etcd=127.0.0.1:", etcd.port()),
                           "--num_servers=1", "--register_timeout=300"}));
  // The server is registering once it connects to "etcd".
  ASSERT_TRUE(etcd.AcceptOne(absl::Now() + kStartTimeout)) << child->output();
  ASSERT_EQ(kill(child->pid(), SIGTERM), 0) << std::strerror(errno);
  // Generous: the old code waited for --register_timeout (300 s).
  absl::StatusOr<int> status = child->WaitForExit(absl::Now() + absl::Seconds(20));
  ASSERT_TRUE(status.ok()) << status.status() << "\noutput:\n" << child->output();
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 1)
      << DescribeWaitStatus(*status) << "\noutput:\n"
      << child->output();
  EXPECT_THAT(child->err(), HasSubstr("received while starting"));
  EXPECT_THAT(child->out(), ::testing::Not(HasSubstr("listening")));
}

}  // namespace
}  // namespace pserver
