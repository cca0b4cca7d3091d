#include "cc/etcd/testing/etcd_process.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "etcd/etcdserver/etcdserverpb/rpc.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace pserver::testing {
namespace {

std::string ErrnoMessage(absl::string_view what) {
  return absl::StrCat(what, ": ", std::strerror(errno));
}

// Two distinct free ports on 127.0.0.1. Both sockets stay bound until both
// are chosen, so the kernel cannot hand out the same port twice.
absl::Status PickPorts(int* first, int* second) {
  int fds[2] = {-1, -1};
  int ports[2] = {0, 0};
  absl::Status status;
  for (int i = 0; i < 2 && status.ok(); ++i) {
    fds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fds[i] < 0) {
      status = absl::InternalError(ErrnoMessage("socket"));
      break;
    }
    sockaddr_in address = {};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = 0;
    socklen_t length = sizeof(address);
    if (bind(fds[i], reinterpret_cast<sockaddr*>(&address), sizeof(address)) != 0 ||
        getsockname(fds[i], reinterpret_cast<sockaddr*>(&address), &length) != 0) {
      status = absl::InternalError(ErrnoMessage("bind 127.0.0.1:0"));
      break;
    }
    ports[i] = ntohs(address.sin_port);
  }
  for (int fd : fds) {
    if (fd >= 0) close(fd);
  }
  *first = ports[0];
  *second = ports[1];
  return status;
}

absl::StatusOr<std::string> MakeDataDir(const std::string& requested) {
  if (!requested.empty()) {
    if (mkdir(requested.c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::InternalError(ErrnoMessage(absl::StrCat("mkdir ", requested)));
    }
    return requested;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp", "/etcd.XXXXXX");
  std::vector<char> buffer(pattern.begin(), pattern.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) {
    return absl::InternalError(ErrnoMessage(absl::StrCat("mkdtemp ", pattern)));
  }
  return std::string(buffer.data());
}

}  // namespace

EtcdProcess::EtcdProcess(EtcdProcessOptions options) : options_(std::move(options)) {}

EtcdProcess::~EtcdProcess() { Stop().IgnoreError(); }

namespace {
// host:port, with an IPv6 host in brackets.
std::string HostPort(const std::string& host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}
}  // namespace

std::string EtcdProcess::endpoint() const { return HostPort(options_.host, client_port_); }

std::string EtcdProcess::peer_url() const {
  return absl::StrCat("http://", HostPort(options_.host, peer_port_));
}

absl::StatusOr<std::unique_ptr<EtcdProcess>> EtcdProcess::Start(EtcdProcessOptions options) {
  static std::atomic<int> started{0};
  if ((options.client_port == 0) != (options.peer_port == 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("EtcdProcessOptions: give both ports or neither (client_port ",
                     options.client_port, ", peer_port ", options.peer_port, ")"));
  }
  absl::Status status;
  // Another process may take a port between PickPorts and etcd's bind: then
  // etcd exits at once and a second pair of ports is tried.
  for (int attempt = 0; attempt < 3; ++attempt) {
    std::unique_ptr<EtcdProcess> etcd(new EtcdProcess(options));
    absl::StatusOr<std::string> data_dir = MakeDataDir(options.data_dir);
    if (!data_dir.ok()) return data_dir.status();
    etcd->data_dir_ = *data_dir;
    etcd->log_path_ = etcd->data_dir_ + ".log";
    etcd->cluster_token_ = options.cluster_token.empty()
                               ? absl::StrCat("pserver-test-", getpid(), "-", started++)
                               : options.cluster_token;
    if (options.client_port == 0) {
      status = PickPorts(&etcd->client_port_, &etcd->peer_port_);
      if (!status.ok()) return status;
    } else {
      etcd->client_port_ = options.client_port;
      etcd->peer_port_ = options.peer_port;
    }
    status = etcd->Spawn();
    if (status.ok() && options.wait_until_serving) status = etcd->WaitServing();
    if (status.ok()) return etcd;
    if (etcd->running() || !absl::StrContains(etcd->LogTail(), "address already in use")) break;
  }
  return status;
}

absl::Status EtcdProcess::Spawn() {
  if (running()) {
    return absl::FailedPreconditionError(absl::StrCat("etcd already running, pid ", pid_));
  }
  const bool tls = !options_.tls.server_cert.empty();
  const std::string client_url = absl::StrCat(tls ? "https" : "http", "://", endpoint());
  const std::string peer = peer_url();
  std::vector<std::string> args = options_.exec_prefix;
  std::vector<std::string> etcd_args = {
      options_.binary,
      "--name=" + options_.name,
      "--data-dir=" + data_dir_,
      "--listen-client-urls=" + client_url,
      "--advertise-client-urls=" + client_url,
      "--listen-peer-urls=" + peer,
      "--initial-advertise-peer-urls=" + peer,
      "--initial-cluster=" + (options_.initial_cluster.empty()
                                  ? absl::StrCat(options_.name, "=", peer)
                                  : options_.initial_cluster),
      "--initial-cluster-state=new",
      "--initial-cluster-token=" + cluster_token_,
      "--logger=zap",
      "--log-outputs=stderr",
  };
  if (tls) {
    etcd_args.push_back("--client-cert-auth");
    etcd_args.push_back("--trusted-ca-file=" + options_.tls.ca);
    etcd_args.push_back("--cert-file=" + options_.tls.server_cert);
    etcd_args.push_back("--key-file=" + options_.tls.server_key);
  }
  args.insert(args.end(), etcd_args.begin(), etcd_args.end());
  // Everything the child needs is prepared before fork: after it, in a
  // multithreaded process, the child may only make async-signal-safe calls.
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  argv.push_back(nullptr);
  const int log_fd = open(log_path_.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return absl::InternalError(ErrnoMessage(absl::StrCat("open ", log_path_)));
  const int null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (null_fd < 0) {
    close(log_fd);
    return absl::InternalError(ErrnoMessage("open /dev/null"));
  }
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent) _exit(126);
    dup2(null_fd, STDIN_FILENO);
    dup2(log_fd, STDOUT_FILENO);
    dup2(log_fd, STDERR_FILENO);
    execv(argv[0], argv.data());
    static const char kMessage[] = "etcd_process: exec failed\n";
    ssize_t ignored = write(STDERR_FILENO, kMessage, sizeof(kMessage) - 1);
    (void)ignored;
    _exit(127);
  }
  const int fork_errno = errno;
  close(log_fd);
  close(null_fd);
  if (pid < 0) {
    errno = fork_errno;
    return absl::InternalError(ErrnoMessage("fork"));
  }
  pid_ = pid;
  return absl::OkStatus();
}

namespace {

// A file's contents; "" when it cannot be read (etcd's TLS handshake then
// fails, and WaitServing reports that).
std::string ReadWholeFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace

absl::Status EtcdProcess::WaitServing() {
  const absl::Time deadline = absl::Now() + options_.start_timeout;
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 50);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 200);
  std::shared_ptr<grpc::ChannelCredentials> credentials = grpc::InsecureChannelCredentials();
  if (!options_.tls.server_cert.empty()) {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadWholeFile(options_.tls.ca);
    ssl.pem_cert_chain = ReadWholeFile(options_.tls.client_cert);
    ssl.pem_private_key = ReadWholeFile(options_.tls.client_key);
    credentials = grpc::SslCredentials(ssl);
  }
  auto channel = grpc::CreateCustomChannel(endpoint(), credentials, args);
  auto kv = etcdserverpb::KV::NewStub(channel);
  std::string last_error = "no answer yet";
  while (absl::Now() < deadline) {
    int wait_status = 0;
    if (waitpid(pid_, &wait_status, WNOHANG) == pid_) {
      pid_ = -1;
      return absl::UnavailableError(absl::StrCat("etcd on ", endpoint(), " exited (wait status ",
                                                 wait_status, ") before serving; log ", log_path_,
                                                 " ends with:\n", LogTail()));
    }
    // A linearizable read answers only once there is a leader.
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + absl::Seconds(1))));
    context.set_wait_for_ready(true);
    etcdserverpb::RangeRequest request;
    request.set_key("/etcd_process/health");
    etcdserverpb::RangeResponse response;
    grpc::Status status = kv->Range(&context, request, &response);
    if (status.ok()) return absl::OkStatus();
    last_error = status.error_message();
    absl::SleepFor(absl::Milliseconds(50));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "etcd on ", endpoint(), " not serving after ", absl::FormatDuration(options_.start_timeout),
      " (last error: ", last_error, "); log ", log_path_, " ends with:\n", LogTail()));
}

absl::Status EtcdProcess::Signal(int signal, absl::Duration wait) {
  if (!running()) return absl::OkStatus();
  if (kill(pid_, signal) != 0 && errno != ESRCH) {
    return absl::InternalError(ErrnoMessage(absl::StrCat("kill ", pid_)));
  }
  const absl::Time deadline = absl::Now() + wait;
  while (true) {
    int wait_status = 0;
    const pid_t reaped = waitpid(pid_, &wait_status, WNOHANG);
    if (reaped == pid_ || (reaped < 0 && errno == ECHILD)) {
      pid_ = -1;
      return absl::OkStatus();
    }
    if (absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(10));
  }
  return absl::DeadlineExceededError(absl::StrCat(
      "etcd pid ", pid_, " still running ", absl::FormatDuration(wait), " after signal ", signal));
}

absl::Status EtcdProcess::Stop() {
  if (Signal(SIGTERM, options_.stop_grace).ok()) return absl::OkStatus();
  return Kill();
}

absl::Status EtcdProcess::Kill() { return Signal(SIGKILL, absl::Seconds(10)); }

absl::Status EtcdProcess::Restart() {
  if (running()) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd pid ", pid_, " is still running; Stop or Kill it first"));
  }
  absl::Status status = Spawn();
  if (status.ok() && options_.wait_until_serving) status = WaitServing();
  return status;
}

std::string EtcdProcess::LogTail() const {
  std::ifstream in(log_path_, std::ios::binary);
  if (!in) return "(no log)";
  std::stringstream buffer;
  buffer << in.rdbuf();
  std::string log = buffer.str();
  constexpr size_t kTail = 4000;
  return log.size() > kTail ? log.substr(log.size() - kTail) : log;
}

}  // namespace pserver::testing
