// The server's and client's transport limits against a hostile peer
// (docs/limits.md): a compressed request or reply that would inflate to far
// more than it took to send is refused before it is inflated, and a burst of
// calls that wait does not grow the server's threads past --max_threads.
// Memory and threads are read from /proc of a child `pserver` process (or of
// this process, for the client side). Every wait has a deadline.
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/rpc/grpc_status.h"
#include "cc/testing/child_process.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::AnyOf;
using ::testing::HasSubstr;

constexpr absl::Duration kStartTimeout = absl::Seconds(20);
constexpr absl::Duration kStopTimeout = absl::Seconds(10);

// What the bombs inflate to: 4x the default --max_message_bytes.
constexpr size_t kInflatedBytes = 4 * kDefaultMaxMessageBytes;
// Growth of peak memory that still counts as "not inflated": a quarter of
// the inflated size, far above what a refused call costs.
constexpr int64_t kMaxPeakGrowthBytes = kInflatedBytes / 4;

// A field of /proc/<pid>/status in bytes ("VmHWM:  1234 kB"); -1 if absent.
int64_t ProcStatusBytes(pid_t pid, absl::string_view field) {
  std::ifstream in(absl::StrCat("/proc/", pid, "/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, absl::StrCat(field, ":"))) continue;
    std::vector<absl::string_view> parts =
        absl::StrSplit(line.substr(field.size() + 1), ' ', absl::SkipWhitespace());
    int64_t kb = 0;
    if (!parts.empty() && absl::SimpleAtoi(parts[0], &kb)) return kb * 1024;
  }
  return -1;
}

int64_t ThreadCount(pid_t pid) { return ProcStatusBytes(pid, "Threads") / 1024; }

// Open file descriptors of `pid`; -1 if they cannot be listed.
int OpenFdCount(pid_t pid) {
  DIR* dir = opendir(absl::StrCat("/proc/", pid, "/fd").c_str());
  if (dir == nullptr) return -1;
  int count = 0;
  while (dirent* entry = readdir(dir)) {
    if (entry->d_name[0] != '.') ++count;
  }
  closedir(dir);
  return count;
}

// A TCP connection to `port` on loopback that never sends a byte; -1 on error.
int SilentConnection(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// The peer closed `fd` by `deadline`: reads (of what the server sent, such
// as its HTTP/2 settings) end in end-of-file or an error.
bool ClosedByPeer(int fd, absl::Time deadline) {
  char buffer[4096];
  for (int reads = 0; reads < 1000; ++reads) {
    pollfd p{fd, POLLIN, 0};
    const int64_t ms = std::max<int64_t>(0, absl::ToInt64Milliseconds(deadline - absl::Now()));
    if (poll(&p, 1, static_cast<int>(ms)) != 1) return false;
    const ssize_t n = recv(fd, buffer, sizeof(buffer), MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return true;
  }
  return false;
}

// A file's contents ("" when it cannot be read).
std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

absl::Status GetStats(const std::string& address, absl::Duration timeout,
                      std::shared_ptr<grpc::ChannelCredentials> credentials =
                          grpc::InsecureChannelCredentials()) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a new connection each time
  auto stub =
      v1::ParameterServer::NewStub(grpc::CreateCustomChannel(address, credentials, args));
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
  return FromGrpcStatus(stub->GetStats(&context, request, &response));
}

// A serialized message of `bytes` zeros in one unknown field (number 15):
// every pserver request type parses it. Its slices all point at one static
// MiB of zeros, so building and compressing it costs this process nothing.
grpc::ByteBuffer ZeroMessage(size_t bytes) {
  static const std::string* const kZeros = new std::string(size_t{1} << 20, '\0');
  std::string header(1, static_cast<char>((15 << 3) | 2));  // field 15, length-delimited
  for (uint64_t v = bytes; true; v >>= 7) {
    if (v < 0x80) {
      header.push_back(static_cast<char>(v));
      break;
    }
    header.push_back(static_cast<char>((v & 0x7f) | 0x80));
  }
  std::vector<grpc::Slice> slices;
  slices.emplace_back(header);
  for (size_t sent = 0; sent < bytes; sent += kZeros->size()) {
    slices.emplace_back(kZeros->data(), std::min(kZeros->size(), bytes - sent),
                        grpc::Slice::STATIC_SLICE);
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// One unary call of raw bytes; the reply's size goes to *reply_bytes.
grpc::Status RawCall(grpc::Channel* channel, const std::string& method,
                     const grpc::ByteBuffer& request, grpc_compression_algorithm compression,
                     size_t* reply_bytes = nullptr) {
  grpc::GenericStub stub(channel->shared_from_this());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  context.set_compression_algorithm(compression);
  grpc::ByteBuffer reply;
  grpc::Status status;
  absl::Notification done;
  stub.UnaryCall(&context, method, grpc::StubOptions(), &request, &reply, [&](grpc::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  if (reply_bytes != nullptr) *reply_bytes = reply.Length();
  return status;
}

// A channel that allows what pserver's own clients refuse: every
// compression algorithm and messages of any size.
std::shared_ptr<grpc::Channel> PermissiveChannel(const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  args.SetMaxSendMessageSize(-1);
  return grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), args);
}

class PserverChild {
 public:
  // `nofile`: the server's file descriptor limit, soft and hard (0:
  // inherited); `nofile_hard`: a higher hard limit (0: the same).
  void Start(std::vector<std::string> flags, int nofile = 0, int nofile_hard = 0) {
    flags.push_back("--host=127.0.0.1");
    flags.push_back("--port=0");
    if (nofile > 0) {
      const std::string limit =
          nofile_hard > 0 ? absl::StrCat(nofile, ":", nofile_hard) : absl::StrCat(nofile);
      flags.insert(flags.begin(),
                   {absl::StrCat("--nofile=", limit), RunfilesPath("cc/server/pserver")});
      ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn("/usr/bin/prlimit", flags));
    } else {
      ASSERT_OK_AND_ASSIGN(child_, ChildProcess::Spawn(RunfilesPath("cc/server/pserver"), flags));
    }
    absl::StatusOr<std::string> address =
        WaitForPserverAddress(*child_, 0, absl::Now() + kStartTimeout);
    ASSERT_TRUE(address.ok()) << address.status() << "\n" << child_->output();
    address_ = *address;
  }
  void Stop() {
    if (child_ == nullptr) return;
    ASSERT_EQ(kill(child_->pid(), SIGTERM), 0) << std::strerror(errno);
    ASSERT_OK_AND_ASSIGN(int status, child_->WaitForExit(absl::Now() + kStopTimeout));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status) << "\n"
                                                               << child_->output();
  }
  pid_t pid() const { return child_->pid(); }
  const std::string& address() const { return address_; }
  int port() const {
    int port = 0;
    return absl::SimpleAtoi(address_.substr(address_.rfind(':') + 1), &port) ? port : 0;
  }
  std::string output() const { return child_->output(); }

 private:
  std::unique_ptr<ChildProcess> child_;  // its destructor kills a live child
  std::string address_;
};

// ---- compressed and oversized requests -------------------------------------------

TEST(TransportLimitsTest, CompressedRequestIsRefusedBeforeItIsInflated) {
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({}));
  auto channel = PermissiveChannel(server.address());
  const int64_t peak_before = ProcStatusBytes(server.pid(), "VmHWM");
  ASSERT_GT(peak_before, 0);

  grpc::Status status = RawCall(channel.get(), "/pserver.v1.ParameterServer/SendGrad",
                                ZeroMessage(kInflatedBytes), GRPC_COMPRESS_GZIP);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::UNIMPLEMENTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("gzip"));
  EXPECT_THAT(status.error_message(), HasSubstr("disabled"));

  const int64_t peak_after = ProcStatusBytes(server.pid(), "VmHWM");
  EXPECT_LT(peak_after - peak_before, kMaxPeakGrowthBytes)
      << "the server's peak memory grew from " << peak_before << " to " << peak_after
      << " bytes for a request inflating to " << kInflatedBytes;

  // Uncompressed requests are served as before.
  v1::GetStatsRequest stats_request;
  v1::GetStatsResponse stats;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  EXPECT_TRUE(
      v1::ParameterServer::NewStub(channel)->GetStats(&context, stats_request, &stats).ok());
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

TEST(TransportLimitsTest, RequestOverMaxMessageBytesIsRefusedNamingTheLimit) {
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({"--max_message_bytes=65536"}));
  auto channel = PermissiveChannel(server.address());
  grpc::Status status = RawCall(channel.get(), "/pserver.v1.ParameterServer/SendGrad",
                                ZeroMessage(100000), GRPC_COMPRESS_NONE);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  EXPECT_THAT(status.error_message(), HasSubstr("65536"));
  // Under the limit: the server reads it (and refuses what it holds).
  status = RawCall(channel.get(), "/pserver.v1.ParameterServer/SendGrad", ZeroMessage(1000),
                   GRPC_COMPRESS_NONE);
  EXPECT_NE(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << status.error_message();
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

TEST(TransportLimitsTest, BadLimitFlagExitsNamingIt) {
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChildProcess> child,
                       ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                           {"--port=0", "--max_message_bytes=10"}));
  ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStopTimeout));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 1) << DescribeWaitStatus(status);
  EXPECT_THAT(child->output(), HasSubstr("max_message_bytes"));
}

TEST(TransportLimitsTest, ClientRefusesRequestSizesPastTheServersLimit) {
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({}));
  ClientOptions options;
  options.servers = {server.address()};
  options.block_bytes = kMaxRequestPayloadBytes + 1;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_THAT(client.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("block_bytes")));
  EXPECT_THAT(client.status().message(), HasSubstr("--max_message_bytes"));
  options.block_bytes = kMaxRequestPayloadBytes;
  options.max_request_bytes = kMaxRequestPayloadBytes + 1;
  client = Client::Connect(options);
  EXPECT_THAT(client.status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("max_request_bytes")));

  // At the largest sizes allowed, a tensor of one whole block passes.
  options.max_request_bytes = kMaxRequestPayloadBytes;
  options.timeout = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> ok, Client::Connect(options));
  const int64_t n = static_cast<int64_t>(kMaxRequestPayloadBytes / sizeof(float));
  ASSERT_OK(ok->InitParam("w", Tensor::FromValues<float>({n}, std::vector<float>(n, 1.0f))));
  ASSERT_OK(ok->FinishInitParams());
  ASSERT_OK(ok->SendGrad("w", Tensor::FromValues<float>({n}, std::vector<float>(n, 1.0f))));
  ASSERT_OK_AND_ASSIGN(Tensor w, ok->GetParam("w"));
  EXPECT_EQ(w.shape()[0], n);
  ok.reset();
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// ---- a rogue server's compressed reply --------------------------------------------

// Answers every call with a gzip-compressed reply of kInflatedBytes zeros.
class BombService : public grpc::CallbackGenericService {
  class Reactor : public grpc::ServerGenericBidiReactor {
   public:
    explicit Reactor(grpc::GenericCallbackServerContext* context) {
      context->set_compression_algorithm(GRPC_COMPRESS_GZIP);
      StartRead(&request_);
    }
    void OnReadDone(bool ok) override {
      if (!ok) {
        Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "no request"));
        return;
      }
      reply_ = ZeroMessage(kInflatedBytes);
      StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
    }
    void OnDone() override { delete this; }

   private:
    grpc::ByteBuffer request_;
    grpc::ByteBuffer reply_;
  };

  grpc::ServerGenericBidiReactor* CreateReactor(
      grpc::GenericCallbackServerContext* context) override {
    return new Reactor(context);
  }
};

TEST(TransportLimitsTest, ClientRefusesACompressedReplyBeforeInflatingIt) {
  BombService bomb;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&bomb);
  builder.SetMaxSendMessageSize(-1);
  std::unique_ptr<grpc::Server> rogue = builder.BuildAndStart();
  ASSERT_NE(rogue, nullptr);
  ASSERT_GT(port, 0);

  // pserver's client channel settings (cc/client/grpc_transport.cc).
  auto channel =
      grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                grpc::InsecureChannelCredentials(), DefaultChannelArguments());
  const int64_t peak_before = ProcStatusBytes(getpid(), "VmHWM");
  size_t reply_bytes = 0;
  grpc::Status status = RawCall(channel.get(), "/pserver.v1.ParameterServer/GetStats",
                                ZeroMessage(10), GRPC_COMPRESS_NONE, &reply_bytes);
  const int64_t peak_after = ProcStatusBytes(getpid(), "VmHWM");
  EXPECT_FALSE(status.ok()) << "a reply of " << reply_bytes << " bytes was accepted";
  EXPECT_THAT(status.error_code(),
              AnyOf(grpc::StatusCode::UNIMPLEMENTED, grpc::StatusCode::RESOURCE_EXHAUSTED,
                    grpc::StatusCode::INTERNAL))
      << status.error_message();
  EXPECT_LT(peak_after - peak_before, kMaxPeakGrowthBytes)
      << "this process's peak memory grew from " << peak_before << " to " << peak_after
      << " bytes for a reply inflating to " << kInflatedBytes;
  rogue->Shutdown(absl::ToChronoTime(absl::Now() + absl::Seconds(1)));
}

// ---- threads ------------------------------------------------------------------------

TEST(TransportLimitsTest, WaitingCallsDoNotGrowThreadsPastMaxThreads) {
  constexpr int kMaxThreads = 8;
  constexpr int kCalls = 48;  // the old code ran every one on a thread
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_threads=", kMaxThreads)}));
  const int64_t threads_before = ThreadCount(server.pid());
  ASSERT_GT(threads_before, 0);

  // kCalls barrier calls that never complete (size 1000) and wait for
  // their deadline, each on its own connection.
  std::atomic<int> finished{0};
  std::vector<grpc::StatusCode> codes(kCalls);
  std::vector<std::thread> callers;
  callers.reserve(kCalls);
  for (int i = 0; i < kCalls; ++i) {
    callers.emplace_back([&, i] {
      grpc::ChannelArguments args;
      args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = v1::ParameterServer::NewStub(
          grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
      v1::BarrierRequest request;
      request.set_name("never");
      request.set_size(1000);
      request.set_participant(absl::StrCat("p", i));
      v1::BarrierResponse response;
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(4)));
      codes[i] = stub->Barrier(&context, request, &response).error_code();
      finished.fetch_add(1);
    });
  }
  // Samples the server's threads until every call has ended (each within
  // its 4 s deadline; the loop is bounded by a 60 s deadline too).
  int64_t threads_peak = threads_before;
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (finished.load() < kCalls && absl::Now() < deadline) {
    threads_peak = std::max(threads_peak, ThreadCount(server.pid()));
    absl::SleepFor(absl::Milliseconds(5));
  }
  for (std::thread& t : callers) t.join();
  // gRPC's own threads (timers, executor) may start under load: a few spare.
  constexpr int kSpareThreads = 4;
  EXPECT_LE(threads_peak, threads_before + kMaxThreads + kSpareThreads)
      << "the server grew from " << threads_before << " to " << threads_peak << " threads";
  for (int i = 0; i < kCalls; ++i) {
    EXPECT_THAT(codes[i],
                AnyOf(grpc::StatusCode::DEADLINE_EXCEEDED, grpc::StatusCode::RESOURCE_EXHAUSTED))
        << "call " << i;
  }
  // The server still serves once the burst is over.
  v1::GetStatsRequest stats_request;
  v1::GetStatsResponse stats;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  EXPECT_TRUE(stub->GetStats(&context, stats_request, &stats).ok());
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// Two participants of one barrier on one connection. With
// --max_concurrent_streams=1 the second call waits in the client for the
// stream the first one holds, so the barrier can never complete: both end
// DEADLINE_EXCEEDED (whatever the timing: the two can never be at the server
// at once). With 2 streams the same two calls complete the barrier.
TEST(TransportLimitsTest, CallsPastMaxConcurrentStreamsWaitInTheClient) {
  for (const int streams : {1, 2}) {
    SCOPED_TRACE(absl::StrCat("--max_concurrent_streams=", streams));
    PserverChild server;
    ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_concurrent_streams=", streams)}));
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    std::unique_ptr<v1::ParameterServer::Stub> stub = v1::ParameterServer::NewStub(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    {
      // A first answer on the connection: the client has the server's
      // SETTINGS (its stream limit) before the barrier calls start.
      grpc::ClientContext context;
      context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
      v1::GetStatsResponse stats;
      ASSERT_TRUE(stub->GetStats(&context, v1::GetStatsRequest(), &stats).ok());
    }
    // Limited: the calls end at this deadline; not limited: they complete
    // well before it.
    const absl::Time deadline = absl::Now() + absl::Seconds(streams == 1 ? 5 : 60);
    std::vector<grpc::StatusCode> codes(2);
    std::vector<std::thread> callers;
    for (int i = 0; i < 2; ++i) {
      callers.emplace_back([&, i] {
        v1::BarrierRequest request;
        request.set_name("two");
        request.set_size(2);
        request.set_participant(absl::StrCat("p", i));
        v1::BarrierResponse response;
        grpc::ClientContext context;
        context.set_deadline(absl::ToChronoTime(deadline));
        codes[i] = stub->Barrier(&context, request, &response).error_code();
      });
    }
    for (std::thread& t : callers) t.join();
    const grpc::StatusCode expected =
        streams == 1 ? grpc::StatusCode::DEADLINE_EXCEEDED : grpc::StatusCode::OK;
    EXPECT_EQ(codes[0], expected);
    EXPECT_EQ(codes[1], expected);
    ASSERT_NO_FATAL_FAILURE(server.Stop());
  }
}


// ---- exactly-once state: many client ids -------------------------------------------

// A push of 1.0 to every element of the 3-float parameter "w" as `client`'s
// request `sequence` (what a pserver client sends, with ids of our choice).
grpc::Status PushAs(v1::ParameterServer::Stub& stub, uint64_t client, uint64_t sequence) {
  v1::SendGradsRequest request;
  v1::Gradient* grad = request.add_gradients();
  grad->set_name("w");
  grad->set_element_type(v1::FLOAT32);
  const std::vector<float> ones = {1, 1, 1};
  grad->set_content(std::string(reinterpret_cast<const char*>(ones.data()), sizeof(float) * 3));
  request.set_client_id(client);
  request.set_sequence(sequence);
  v1::SendGradsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  return stub.SendGrads(&context, request, &response);
}

uint64_t DuplicatesIgnored(v1::ParameterServer::Stub& stub) {
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  const grpc::Status status = stub.GetStats(&context, request, &response);
  EXPECT_TRUE(status.ok()) << status.error_message();
  return response.stats().duplicates_ignored();
}

// An outsider pushing under many client ids cannot grow the server's
// exactly-once state past --max_exactly_once_clients: the longest-idle
// client is forgotten (its late retry is applied again), the recent ones
// are still deduplicated, and the server keeps serving.
TEST(TransportLimitsTest, ManyClientIdsAreBoundedByMaxExactlyOnceClients) {
  constexpr int kMaxClients = 16;
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_exactly_once_clients=", kMaxClients)}));
  ClientOptions options;
  options.servers = {server.address()};
  options.timeout = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({3}, {0, 0, 0})));
  ASSERT_OK(client->FinishInitParams());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));

  constexpr uint64_t kFirst = 0x1000;
  ASSERT_TRUE(PushAs(*stub, kFirst, 1).ok());
  ASSERT_TRUE(PushAs(*stub, kFirst, 1).ok());  // a retry: acknowledged, not applied
  ASSERT_EQ(DuplicatesIgnored(*stub), 1u);
  // 1000 other client ids, one push each.
  constexpr uint64_t kOthers = 1000;
  for (uint64_t id = kFirst + 1; id <= kFirst + kOthers; ++id) {
    const grpc::Status status = PushAs(*stub, id, 1);
    ASSERT_TRUE(status.ok()) << id << ": " << status.error_message();
  }
  // The newest are remembered: their retries change nothing.
  ASSERT_OK_AND_ASSIGN(Tensor before, client->GetParam("w"));
  for (uint64_t id = kFirst + kOthers - kMaxClients + 1; id <= kFirst + kOthers; ++id) {
    ASSERT_TRUE(PushAs(*stub, id, 1).ok()) << id;
  }
  EXPECT_EQ(DuplicatesIgnored(*stub), 1u + kMaxClients);
  ASSERT_OK_AND_ASSIGN(Tensor same, client->GetParam("w"));
  EXPECT_EQ(same.ToVector<float>(), before.ToVector<float>());
  // The first was forgotten: its retry is applied again.
  ASSERT_TRUE(PushAs(*stub, kFirst, 1).ok());
  EXPECT_EQ(DuplicatesIgnored(*stub), 1u + kMaxClients);
  ASSERT_OK_AND_ASSIGN(Tensor after, client->GetParam("w"));
  EXPECT_NE(after.ToVector<float>(), before.ToVector<float>());
  client.reset();
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

TEST(TransportLimitsTest, ZeroOutsiderStateLimitsExitNamingThem) {
  for (const char* flag :
       {"max_exactly_once_clients", "max_workers_per_table", "max_held_add_bytes"}) {
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ChildProcess> child,
                         ChildProcess::Spawn(RunfilesPath("cc/server/pserver"),
                                             {"--host=127.0.0.1", "--port=0",
                                              absl::StrCat("--", flag, "=0")}));
    ASSERT_OK_AND_ASSIGN(int status, child->WaitForExit(absl::Now() + kStartTimeout));
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) != 0) << DescribeWaitStatus(status);
    EXPECT_THAT(child->output(), HasSubstr(flag));
  }
}

// ---- parameter memory: many InitParams ----------------------------------------------

// A trainer initializing parameters in a loop cannot make the server
// allocate past --max_param_bytes: every InitParam past it is
// RESOURCE_EXHAUSTED naming the parameter and the flag, nothing is stored,
// and the server serves what it holds. The budgets are said at start.
TEST(TransportLimitsTest, ParametersInitializedInALoopAreBoundedByMaxParamBytes) {
  constexpr int kFit = 16;  // float32 [64] with plain SGD: 256 bytes each
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_param_bytes=", kFit * 256)}));
  EXPECT_THAT(server.output(), HasSubstr("memory budgets: parameters 4096 bytes (--max_param_bytes)"));
  ClientOptions options;
  options.servers = {server.address()};
  options.timeout = absl::Seconds(60);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client, Client::Connect(options));
  const std::vector<float> values(64, 0.5f);
  for (int i = 0; i < kFit; ++i) {
    ASSERT_OK(client->InitParam(absl::StrCat("p", i), Tensor::FromValues<float>({64}, values)));
  }
  for (int i = kFit; i < 200; ++i) {
    const std::string name = absl::StrCat("p", i);
    const absl::Status status = client->InitParam(name, Tensor::FromValues<float>({64}, values));
    ASSERT_THAT(status, StatusIs(absl::StatusCode::kResourceExhausted,
                                 AllOf(HasSubstr(absl::StrCat("'", name, "'")),
                                       HasSubstr("--max_param_bytes=4096"))))
        << i;
  }
  ASSERT_OK(client->FinishInitParams());
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  v1::GetStatsRequest request;
  v1::GetStatsResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  ASSERT_TRUE(stub->GetStats(&context, request, &response).ok());
  EXPECT_EQ(response.stats().parameters(), static_cast<uint64_t>(kFit));
  EXPECT_EQ(response.stats().parameter_bytes(), static_cast<uint64_t>(kFit) * 256);
  ASSERT_OK_AND_ASSIGN(Tensor first, client->GetParam("p0"));
  EXPECT_EQ(first.ToVector<float>(), values);
  EXPECT_THAT(client->GetParam(absl::StrCat("p", kFit)).status(),
              StatusCodeIs(absl::StatusCode::kNotFound));
  client.reset();
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// ---- table clocks: many worker ids ---------------------------------------------------

grpc::StatusCode Join(v1::ParameterServer::Stub& stub, const std::string& worker,
                      v1::ClockRequest::Op op = v1::ClockRequest::JOIN) {
  v1::ClockRequest request;
  request.set_table("t");
  request.set_worker(worker);
  request.set_op(op);
  v1::ClockResponse response;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  return stub.Clock(&context, request, &response).error_code();
}

// Joins under many worker ids, or a worker id of megabytes, cannot grow a
// table's clocks: past --max_workers_per_table a join is refused until one
// leaves; an id longer than 1024 bytes is refused.
TEST(TransportLimitsTest, WorkersJoiningATableAreBoundedByMaxWorkersPerTable) {
  constexpr int kMaxWorkers = 4;
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_workers_per_table=", kMaxWorkers)}));
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  {
    v1::CreateTableRequest create;
    create.set_name("t");
    create.mutable_config()->set_dim(1);
    v1::CreateTableResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    const grpc::Status status = stub->CreateTable(&context, create, &response);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  EXPECT_EQ(Join(*stub, std::string(size_t{1} << 20, 'w')), grpc::StatusCode::INVALID_ARGUMENT);
  for (int i = 0; i < kMaxWorkers; ++i) {
    ASSERT_EQ(Join(*stub, absl::StrCat("w", i)), grpc::StatusCode::OK) << i;
  }
  for (int i = kMaxWorkers; i < 100; ++i) {
    ASSERT_EQ(Join(*stub, absl::StrCat("w", i)), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
  }
  ASSERT_EQ(Join(*stub, "w0", v1::ClockRequest::LEAVE), grpc::StatusCode::OK);
  EXPECT_EQ(Join(*stub, "w99"), grpc::StatusCode::OK);
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// A client creating tables in a loop: past --max_tables every create is
// RESOURCE_EXHAUSTED naming the flag and nothing is created.
TEST(TransportLimitsTest, TablesCreatedInALoopAreBoundedByMaxTables) {
  constexpr int kMaxTables = 4;
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start({absl::StrCat("--max_tables=", kMaxTables)}));
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(server.address(), grpc::InsecureChannelCredentials()));
  const auto create = [&](int i, std::string* message) {
    v1::CreateTableRequest create;
    create.set_name(absl::StrCat("t", i));
    create.mutable_config()->set_dim(1);
    v1::CreateTableResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
    const grpc::Status status = stub->CreateTable(&context, create, &response);
    *message = status.error_message();
    return status.error_code();
  };
  std::string message;
  for (int i = 0; i < kMaxTables; ++i) ASSERT_EQ(create(i, &message), grpc::StatusCode::OK) << i;
  for (int i = kMaxTables; i < 200; ++i) {
    ASSERT_EQ(create(i, &message), grpc::StatusCode::RESOURCE_EXHAUSTED) << i;
    ASSERT_THAT(message, HasSubstr("--max_tables=4")) << i;
  }
  v1::TableStatsResponse stats;
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  ASSERT_TRUE(stub->TableStats(&context, v1::TableStatsRequest(), &stats).ok());
  EXPECT_EQ(stats.tables_size(), kMaxTables);
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// ---- idle and half-open connections ------------------------------------------------

TEST(TransportLimitsTest, IdleConnectionsAreClosedSoNewClientsGetIn) {
  constexpr int kNofile = 64;
  constexpr int kSilentConnections = 100;  // more than the server has descriptors
  constexpr int kIdleChannels = 8;
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(
      server.Start({"--handshake_timeout_seconds=1", "--max_connection_idle_seconds=1"}, kNofile));
  const int fds_before = OpenFdCount(server.pid());
  ASSERT_GT(fds_before, 0);

  // Connections that finished their handshake, made a call and went idle
  // (their channels stay open here).
  std::vector<std::shared_ptr<grpc::Channel>> idle;
  for (int i = 0; i < kIdleChannels; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    idle.push_back(
        grpc::CreateCustomChannel(server.address(), grpc::InsecureChannelCredentials(), args));
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
    ASSERT_TRUE(
        v1::ParameterServer::NewStub(idle.back())->GetStats(&context, request, &response).ok());
  }
  // Connections that never say a word, more than the server can hold.
  std::vector<int> silent;
  for (int i = 0; i < kSilentConnections; ++i) {
    const int fd = SilentConnection(server.port());
    ASSERT_GE(fd, 0) << std::strerror(errno);
    silent.push_back(fd);
  }
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int fd : fds) close(fd);
    }
  } close_all{silent};

  // A new client gets in once the server has closed enough of them; the old
  // code kept them for gRPC's 120 s handshake timeout.
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::Status call = GetStats(server.address(), absl::Seconds(2));
  for (int attempt = 0; !call.ok() && attempt < 600 && absl::Now() < deadline; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));  // a refused connection fails at once
    call = GetStats(server.address(), absl::Seconds(2));
  }
  EXPECT_OK(call) << "no new client got in\n" << server.output();

  // Every silent connection is closed by the server.
  int closed = 0;
  for (int fd : silent) {
    if (ClosedByPeer(fd, deadline)) ++closed;
  }
  EXPECT_EQ(closed, kSilentConnections);
  // And the idle ones: the server's descriptors come back down.
  int fds_now = OpenFdCount(server.pid());
  for (int attempt = 0; fds_now > fds_before && attempt < 600 && absl::Now() < deadline;
       ++attempt) {
    absl::SleepFor(absl::Milliseconds(50));
    fds_now = OpenFdCount(server.pid());
  }
  EXPECT_LE(fds_now, fds_before) << "the server held " << fds_before << " descriptors before, "
                                 << fds_now << " now";
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

// With TLS gRPC's own listener accepts (gRPC 1.51 can take no TLS connection
// from pserver's Listener), and it stops accepting for good at the first
// EMFILE (grpc/grpc#20418). pserver raises its soft descriptor limit to the
// hard one at start, and closes connections that say nothing within
// --handshake_timeout_seconds: under a soft limit of 64, more silent
// connections than that neither lock clients out nor stay open.
TEST(TransportLimitsTest, TlsServerRaisesItsDescriptorLimitAndClosesSilentConnections) {
  constexpr int kSoftNofile = 64;
  constexpr int kHardNofile = 4096;
  constexpr int kSilentConnections = 100;  // more than the soft limit
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<TestCerts> certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  CertRequest server_request;
  server_request.common_name = "pserver";
  server_request.ip_addresses = {"127.0.0.1"};
  ASSERT_OK_AND_ASSIGN(CertFiles server_files, ca->Issue("server", server_request));
  CertRequest client_request;
  client_request.common_name = "trainer";
  ASSERT_OK_AND_ASSIGN(CertFiles client_files, ca->Issue("client", client_request));
  PserverChild server;
  ASSERT_NO_FATAL_FAILURE(server.Start(
      {"--handshake_timeout_seconds=1", "--tls_cert=" + server_files.cert,
       "--tls_key=" + server_files.key, "--tls_ca=" + ca->cert_path()},
      kSoftNofile, kHardNofile));
  EXPECT_THAT(server.output(), HasSubstr(absl::StrCat("descriptor limit raised from ",
                                                      kSoftNofile, " to ", kHardNofile)));

  std::vector<int> silent;
  struct CloseAll {
    std::vector<int>& fds;
    ~CloseAll() {
      for (int fd : fds) close(fd);
    }
  } close_all{silent};
  for (int i = 0; i < kSilentConnections; ++i) {
    const int fd = SilentConnection(server.port());
    ASSERT_GE(fd, 0) << std::strerror(errno);
    silent.push_back(fd);
  }

  grpc::SslCredentialsOptions tls;
  tls.pem_root_certs = ReadFileOrEmpty(ca->cert_path());
  tls.pem_cert_chain = ReadFileOrEmpty(client_files.cert);
  tls.pem_private_key = ReadFileOrEmpty(client_files.key);
  const absl::Time deadline = absl::Now() + absl::Seconds(60);
  absl::Status call = GetStats(server.address(), absl::Seconds(5), grpc::SslCredentials(tls));
  for (int attempt = 0; !call.ok() && attempt < 60 && absl::Now() < deadline; ++attempt) {
    absl::SleepFor(absl::Milliseconds(100));
    call = GetStats(server.address(), absl::Seconds(5), grpc::SslCredentials(tls));
  }
  EXPECT_OK(call) << "no TLS client got in\n" << server.output();
  int closed = 0;
  for (int fd : silent) {
    if (ClosedByPeer(fd, deadline)) ++closed;
  }
  EXPECT_EQ(closed, kSilentConnections);
  ASSERT_NO_FATAL_FAILURE(server.Stop());
}

}  // namespace
}  // namespace pserver
