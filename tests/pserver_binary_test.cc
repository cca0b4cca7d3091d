// Tests of the pserver binary as a user runs it: a child process started with
// flags, whose "listening" line tells the address, that serves a real Client,
// and that stops cleanly on SIGTERM/SIGINT. Every wait has a deadline.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

extern char** environ;

namespace pserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);
// How long one poll() waits while the child runs; bounds the reaction time,
// not the total wait.
constexpr int kPollMillis = 20;

// Where `bazel test` puts the binary: the test runs in the runfiles root of
// the "pserver" workspace; $TEST_SRCDIR/pserver is the same place spelled out.
std::string PserverBinary() {
  const std::string relative = "cc/server/pserver";
  if (access(relative.c_str(), X_OK) == 0) return relative;
  const char* srcdir = std::getenv("TEST_SRCDIR");
  if (srcdir != nullptr) {
    std::string path = absl::StrCat(srcdir, "/pserver/", relative);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return relative;  // the spawn then fails with a message naming it
}

// A child process with its stdout and stderr captured through pipes. The
// destructor kills (SIGKILL) and reaps the child if it is still running.
// Not thread-safe.
class ChildProcess {
 public:
  static absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& path,
                                                             const std::vector<std::string>& args) {
    auto child = std::unique_ptr<ChildProcess>(new ChildProcess());
    int out[2] = {-1, -1};
    int err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) {
        if (fd >= 0) close(fd);
      }
      return absl::InternalError(absl::StrCat("pipe2: ", std::strerror(e)));
    }
    child->fds_[0] = out[0];
    child->fds_[1] = err[0];

    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);

    // The child starts with no blocked signals and default handlers, whatever
    // the test runner set up.
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    sigset_t empty;
    sigemptyset(&empty);
    posix_spawnattr_setsigmask(&attr, &empty);
    sigset_t defaults;
    sigemptyset(&defaults);
    for (int sig : {SIGTERM, SIGINT, SIGPIPE, SIGHUP}) sigaddset(&defaults, sig);
    posix_spawnattr_setsigdefault(&attr, &defaults);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);

    std::vector<std::string> argv_strings;
    argv_strings.push_back(path);
    argv_strings.insert(argv_strings.end(), args.begin(), args.end());
    std::vector<char*> argv;
    for (std::string& arg : argv_strings) argv.push_back(arg.data());
    argv.push_back(nullptr);

    pid_t pid = -1;
    const int rc = posix_spawn(&pid, path.c_str(), &actions, &attr, argv.data(), environ);
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    close(out[1]);
    close(err[1]);
    if (rc != 0) {
      return absl::InternalError(absl::StrCat("posix_spawn ", path, ": ", std::strerror(rc)));
    }
    child->pid_ = pid;
    return child;
  }

  ChildProcess(const ChildProcess&) = delete;
  ChildProcess& operator=(const ChildProcess&) = delete;

  ~ChildProcess() {
    if (pid_ > 0 && !exit_status_.has_value()) {
      kill(pid_, SIGKILL);
      int status = 0;
      // After SIGKILL the child ends promptly; EINTR is the only reason to retry.
      for (int attempt = 0; attempt < 100; ++attempt) {
        if (waitpid(pid_, &status, 0) != -1 || errno != EINTR) break;
      }
    }
    for (int fd : fds_) {
      if (fd >= 0) close(fd);
    }
  }

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  std::string output() const { return absl::StrCat(out_, err_); }

  // Reads output until a complete stdout line starts with `prefix` and
  // returns the rest of that line. DEADLINE_EXCEEDED at `deadline`, or
  // FAILED_PRECONDITION if the child exits or closes stdout first.
  absl::StatusOr<std::string> WaitForLine(absl::string_view prefix, absl::Time deadline) {
    size_t scanned = 0;  // stdout before this offset holds no match
    while (true) {
      // Check every complete line not looked at yet.
      size_t newline;
      while ((newline = out_.find('\n', scanned)) != std::string::npos) {
        absl::string_view line(out_.data() + scanned, newline - scanned);
        scanned = newline + 1;
        if (absl::StartsWith(line, prefix)) return std::string(line.substr(prefix.size()));
      }
      if (fds_[0] < 0) {
        return absl::FailedPreconditionError(
            absl::StrCat("stdout closed before a line starting with '", prefix, "'"));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError(
            absl::StrCat("no line starting with '", prefix, "' before the deadline"));
      }
      ReadAvailable(deadline);
    }
  }

  // Waits for the child to exit, reading its output meanwhile, and returns
  // its wait status; DEADLINE_EXCEEDED at `deadline`.
  absl::StatusOr<int> WaitForExit(absl::Time deadline) {
    while (!exit_status_.has_value()) {
      int status = 0;
      const pid_t done = waitpid(pid_, &status, WNOHANG);
      if (done == pid_) {
        exit_status_ = status;
        break;
      }
      if (done == -1 && errno != EINTR) {
        return absl::InternalError(absl::StrCat("waitpid: ", std::strerror(errno)));
      }
      if (absl::Now() >= deadline) {
        return absl::DeadlineExceededError("the child did not exit before the deadline");
      }
      ReadAvailable(deadline);
    }
    // The child is gone: whatever it wrote is in the pipes; read it all.
    const absl::Time drain_deadline = absl::Now() + absl::Seconds(1);
    while ((fds_[0] >= 0 || fds_[1] >= 0) && absl::Now() < drain_deadline) {
      if (!ReadAvailable(drain_deadline)) break;
    }
    return *exit_status_;
  }

 private:
  ChildProcess() = default;

  // Waits up to kPollMillis (never past `deadline`) for output and appends
  // what came; closes a pipe at its end. False if nothing was readable.
  bool ReadAvailable(absl::Time deadline) {
    pollfd polls[2];
    for (int i = 0; i < 2; ++i) polls[i] = pollfd{fds_[i], POLLIN, 0};  // fd -1: skipped
    const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
    const int timeout =
        static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kPollMillis, left)));
    const int ready = poll(polls, 2, timeout);
    if (ready <= 0) return false;
    std::string* sinks[2] = {&out_, &err_};
    for (int i = 0; i < 2; ++i) {
      if (polls[i].fd < 0 || (polls[i].revents & (POLLIN | POLLHUP | POLLERR)) == 0) continue;
      char buffer[4096];
      const ssize_t n = read(fds_[i], buffer, sizeof(buffer));
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds_[i]);
        fds_[i] = -1;
      }
    }
    return true;
  }

  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};  // the read ends of stdout and stderr
  std::string out_;
  std::string err_;
  std::optional<int> exit_status_;
};

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

// Starts `pserver --port=0 --index=<index>` and waits for its address.
class PserverProcessTest : public ::testing::Test {
 protected:
  void StartServer(uint32_t index) {
    ASSERT_OK_AND_ASSIGN(child_,
                         ChildProcess::Spawn(PserverBinary(), {"--host=127.0.0.1", "--port=0",
                                                               absl::StrCat("--index=", index)}));
    const std::string prefix = absl::StrCat("pserver ", index, " listening on ");
    absl::StatusOr<std::string> address = child_->WaitForLine(prefix, absl::Now() + kStartTimeout);
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
  ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(PserverBinary(), {"--port=99999"}));
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
