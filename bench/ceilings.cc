#include "ceilings.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "harness.h"

namespace pserver::bench {
namespace {

absl::Status Errno(const char* what) {
  return absl::InternalError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

double MemcpyBandwidth(size_t bytes, int rounds) {
  std::vector<char> src(bytes, 1), dst(bytes, 0);
  const double start = NowSeconds();
  for (int i = 0; i < rounds; ++i) {
    std::memcpy(dst.data(), src.data(), bytes);
    src[i % bytes] = dst[(i * 7) % bytes];  // keep the copies observable
  }
  return static_cast<double>(bytes) * rounds / (NowSeconds() - start);
}

absl::StatusOr<double> SocketStreamBandwidth(size_t total, size_t write_size) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  if (listener < 0) return Errno("socket");
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      listen(listener, 1) != 0 ||
      getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    close(listener);
    return Errno("bind/listen 127.0.0.1");
  }
  size_t received = 0;
  std::thread reader([&] {
    const int conn = accept(listener, nullptr, nullptr);
    if (conn < 0) return;
    std::vector<char> buffer(write_size);
    while (received < total) {
      const ssize_t n = read(conn, buffer.data(), buffer.size());
      if (n <= 0) break;
      received += static_cast<size_t>(n);
    }
    close(conn);
  });
  const int out = socket(AF_INET, SOCK_STREAM, 0);
  if (out < 0 || connect(out, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    absl::Status status = Errno("connect");
    if (out >= 0) close(out);
    shutdown(listener, SHUT_RDWR);
    close(listener);
    reader.join();
    return status;
  }
  std::vector<char> buffer(write_size, 7);
  const double start = NowSeconds();
  size_t sent = 0;
  while (sent < total) {
    const ssize_t n = write(out, buffer.data(), std::min(write_size, total - sent));
    if (n <= 0) break;
    sent += static_cast<size_t>(n);
  }
  close(out);
  reader.join();
  const double seconds = NowSeconds() - start;
  close(listener);
  if (received != total) {
    return absl::InternalError(absl::StrCat("socket stream moved ", received, " of ", total));
  }
  return static_cast<double>(total) / seconds;
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
