#include "cc/testing/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

extern char** environ;

namespace pserver {
namespace {

// How long one poll() waits while the child runs; bounds the reaction time,
// not the total wait.
constexpr int kPollMillis = 20;

}  // namespace

std::string RunfilesPath(const std::string& relative, const std::string& argv0) {
  if (access(relative.c_str(), X_OK) == 0) return relative;
  std::vector<std::string> roots;
  for (const char* var : {"TEST_SRCDIR", "RUNFILES_DIR"}) {
    if (const char* dir = std::getenv(var)) roots.push_back(dir);
  }
  if (!argv0.empty()) roots.push_back(argv0 + ".runfiles");
  for (const std::string& root : roots) {
    std::string path = absl::StrCat(root, "/pserver/", relative);
    if (access(path.c_str(), X_OK) == 0) return path;
  }
  return relative;  // the spawn then fails with a message naming it
}

absl::StatusOr<std::unique_ptr<ChildProcess>> ChildProcess::Spawn(
    const std::string& path, const std::vector<std::string>& args) {
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

ChildProcess::~ChildProcess() {
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

absl::StatusOr<std::string> ChildProcess::WaitForLine(absl::string_view prefix,
                                                      absl::Time deadline) {
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

absl::StatusOr<int> ChildProcess::WaitForExit(absl::Time deadline) {
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

bool ChildProcess::ReadAvailable(absl::Time deadline) {
  pollfd polls[2];
  for (int i = 0; i < 2; ++i) polls[i] = pollfd{fds_[i], POLLIN, 0};  // fd -1: skipped
  const int64_t left = absl::ToInt64Milliseconds(deadline - absl::Now());
  const int timeout = static_cast<int>(std::max<int64_t>(0, std::min<int64_t>(kPollMillis, left)));
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

std::string DescribeWaitStatus(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("killed by signal ", WTERMSIG(status));
  return absl::StrCat("wait status ", status);
}

absl::StatusOr<std::string> WaitForPserverAddress(ChildProcess& child, uint32_t index,
                                                  absl::Time deadline) {
  absl::StatusOr<std::string> address =
      child.WaitForLine(absl::StrCat("pserver ", index, " listening on "), deadline);
  if (!address.ok()) {
    return absl::Status(
        address.status().code(),
        absl::StrCat(address.status().message(), "; pserver output:\n", child.output()));
  }
  return address;
}

}  // namespace pserver
