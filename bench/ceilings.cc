#include "ceilings.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "cc/testing/run_program.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "harness.h"

namespace pserver::bench {

double MemcpyBandwidth(size_t bytes, int rounds) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double start = NowSeconds();
  for (int i = 0; i < rounds; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    src[i % bytes] = dst[(i * 7) % bytes];  // keep the copies observable
  }
  return static_cast<double>(bytes) * rounds / (NowSeconds() - start);
}

namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

// A connected pair of loopback TCP sockets; closes both when it goes away.
struct LoopbackPair {
  int out = -1;  // the writer's end
  int in = -1;   // the reader's end
  ~LoopbackPair() {
    if (out >= 0) close(out);
    if (in >= 0) close(in);
  }
};

absl::Status SetBuffers(int fd, int buffer_bytes) {
  if (buffer_bytes <= 0) return absl::OkStatus();
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof(buffer_bytes)) != 0 ||
      setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof(buffer_bytes)) != 0) {
    return Errno("setsockopt SO_SNDBUF/SO_RCVBUF");
  }
  return absl::OkStatus();
}

// Connects to a listener on 127.0.0.1 and accepts (the connection waits in
// the backlog meanwhile, so one thread does both). `buffer_bytes` > 0 sets
// both ends' buffers before the connection exists, as iperf3 -w does.
absl::StatusOr<std::unique_ptr<LoopbackPair>> ConnectLoopback(int buffer_bytes) {
  auto pair = std::make_unique<LoopbackPair>();
  LoopbackPair listener;  // only its `in` is used
  listener.in = socket(AF_INET, SOCK_STREAM, 0);
  if (listener.in < 0) return Errno("socket");
  PS_RETURN_IF_ERROR(SetBuffers(listener.in, buffer_bytes));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener.in, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener.in, 1) != 0 ||
      getsockname(listener.in, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("bind/listen 127.0.0.1");
  }
  pair->out = socket(AF_INET, SOCK_STREAM, 0);
  if (pair->out < 0) return Errno("socket");
  PS_RETURN_IF_ERROR(SetBuffers(pair->out, buffer_bytes));
  if (connect(pair->out, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    return Errno("connect");
  }
  pair->in = accept(listener.in, nullptr, nullptr);
  if (pair->in < 0) return Errno("accept");
  return pair;
}

// Writes `write_size` chunks until `limit` bytes are sent or `stop_at`
// (NowSeconds) passes, while a reader thread drains the other end; returns
// bytes received / s from the first write until the reader saw EOF.
absl::StatusOr<double> Stream(LoopbackPair& pair, size_t write_size, size_t limit,
                              double stop_at) {
  size_t received = 0;
  std::thread reader([&] {
    std::vector<char> buffer(write_size);
    while (true) {
      const ssize_t n = read(pair.in, buffer.data(), buffer.size());
      if (n <= 0) break;
      received += static_cast<size_t>(n);
    }
  });
  std::vector<char> buffer(write_size, 7);
  const double start = NowSeconds();
  size_t sent = 0;
  while (sent < limit && NowSeconds() < stop_at) {
    const ssize_t n = write(pair.out, buffer.data(), std::min(write_size, limit - sent));
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  shutdown(pair.out, SHUT_WR);
  reader.join();
  const double seconds = NowSeconds() - start;
  if (received != sent || sent == 0) {
    return absl::InternalError(absl::StrCat("socket stream moved ", received, " of ", sent));
  }
  return static_cast<double>(received) / seconds;
}

// A port on 127.0.0.1 free when this returns (for a program that takes one).
absl::StatusOr<int> FreeLoopbackPort() {
  LoopbackPair probe;
  probe.in = socket(AF_INET, SOCK_STREAM, 0);
  if (probe.in < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(probe.in, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      getsockname(probe.in, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    return Errno("bind 127.0.0.1:0");
  }
  return ntohs(addr.sin_port);
}

}  // namespace

absl::StatusOr<double> SocketStreamBandwidth(size_t total, size_t write_size) {
  PS_ASSIGN_OR_RETURN(auto pair, ConnectLoopback(/*buffer_bytes=*/0));
  return Stream(*pair, write_size, total, std::numeric_limits<double>::infinity());
}

absl::StatusOr<double> SocketStreamBandwidthFor(double seconds, size_t write_size,
                                                int buffer_bytes) {
  PS_ASSIGN_OR_RETURN(auto pair, ConnectLoopback(buffer_bytes));
  return Stream(*pair, write_size, std::numeric_limits<size_t>::max(), NowSeconds() + seconds);
}

absl::StatusOr<double> Iperf3Bandwidth(double seconds) {
  PS_ASSIGN_OR_RETURN(const std::string iperf3, FindProgram("iperf3"));
  PS_ASSIGN_OR_RETURN(const int port, FreeLoopbackPort());
  const int whole_seconds = std::max(1, static_cast<int>(std::ceil(seconds)));
  const absl::Time deadline = absl::Now() + absl::Seconds(whole_seconds + 30);
  // One test, then it exits; the destructor kills it (by PID) otherwise.
  PS_ASSIGN_OR_RETURN(auto server, ChildProcess::Spawn(iperf3, {"-s", "-1", "--forceflush", "-B",
                                                               "127.0.0.1", "-p",
                                                               absl::StrCat(port)}));
  PS_RETURN_IF_ERROR(server->WaitForLine("Server listening", deadline).status());
  PS_ASSIGN_OR_RETURN(const std::string json,
                      RunProgram(iperf3,
                                 {"-c", "127.0.0.1", "-p", absl::StrCat(port), "-t",
                                  absl::StrCat(whole_seconds), "-J"},
                                 deadline));
  google::protobuf::Struct report;
  if (!google::protobuf::util::JsonStringToMessage(json, &report).ok()) {
    return absl::InternalError(absl::StrCat("iperf3 -J printed no JSON: ", json.substr(0, 200)));
  }
  const auto& fields = report.fields();
  const auto end = fields.find("end");
  if (end == fields.end()) return absl::InternalError("iperf3 -J: no 'end' in its report");
  const auto& end_fields = end->second.struct_value().fields();
  const auto sum = end_fields.find("sum_received");
  if (sum == end_fields.end()) {
    return absl::InternalError("iperf3 -J: no 'end.sum_received' in its report");
  }
  const auto& sum_fields = sum->second.struct_value().fields();
  const auto bps = sum_fields.find("bits_per_second");
  if (bps == sum_fields.end() || bps->second.number_value() <= 0) {
    return absl::InternalError("iperf3 -J: no 'end.sum_received.bits_per_second'");
  }
  (void)server->WaitForExit(deadline);
  return bps->second.number_value() / 8;
}

// The echo server: a callback generic service answering every method with
// its request bytes.
struct GrpcEcho::Impl {
  class Echo : public grpc::CallbackGenericService {
    grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
      class Reactor : public grpc::ServerGenericBidiReactor {
       public:
        Reactor() { StartRead(&buffer_); }
        void OnReadDone(bool ok) override {
          if (!ok) {
            Finish(grpc::Status::OK);
            return;
          }
          StartWrite(&buffer_);
        }
        void OnWriteDone(bool ok) override {
          if (!ok) {
            Finish(grpc::Status::OK);
            return;
          }
          StartRead(&buffer_);
        }
        void OnDone() override { delete this; }

       private:
        grpc::ByteBuffer buffer_;
      };
      return new Reactor();
    }
  };

  Echo service;
  std::unique_ptr<grpc::Server> server;
  std::unique_ptr<grpc::GenericStub> stub;
};

absl::StatusOr<std::unique_ptr<GrpcEcho>> GrpcEcho::Start() {
  auto echo = std::unique_ptr<GrpcEcho>(new GrpcEcho());
  echo->impl_ = std::make_unique<Impl>();
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&echo->impl_->service);
  builder.SetMaxReceiveMessageSize(-1);  // the only change from the defaults
  echo->impl_->server = builder.BuildAndStart();
  if (echo->impl_->server == nullptr || port == 0) {
    return absl::UnavailableError("cannot start the gRPC echo server on 127.0.0.1");
  }
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);
  echo->impl_->stub = std::make_unique<grpc::GenericStub>(grpc::CreateCustomChannel(
      absl::StrCat("127.0.0.1:", port), grpc::InsecureChannelCredentials(), args));
  return echo;
}

GrpcEcho::~GrpcEcho() {
  if (impl_ && impl_->server) impl_->server->Shutdown(std::chrono::system_clock::now());
}

absl::StatusOr<double> GrpcEcho::Bandwidth(size_t bytes, int calls) {
  std::string payload(bytes, 'x');
  grpc::Slice slice(payload.data(), payload.size());
  const grpc::ByteBuffer request(&slice, 1);
  const double start = NowSeconds();
  for (int i = 0; i < calls; ++i) {
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    grpc::ByteBuffer response;
    grpc::Status status;
    absl::Notification done;
    impl_->stub->UnaryCall(&context, "/bench.Echo/Echo", grpc::StubOptions(), &request,
                           &response, [&](grpc::Status s) {
                             status = std::move(s);
                             done.Notify();
                           });
    done.WaitForNotification();
    if (!status.ok()) return absl::UnavailableError(status.error_message());
    if (response.Length() != bytes) return absl::InternalError("echo returned other bytes");
  }
  return static_cast<double>(bytes) * calls / (NowSeconds() - start);
}

}  // namespace pserver::bench
