// The TLS byte stream on its own, between two threads of this process over a
// loopback TCP connection: data written in pieces of any size arrives whole
// and in order both ways (writes are gathered into a buffer and flushed at
// the end of each Write, so nothing may stay behind in it), and a write to a
// peer that has gone fails with an error instead of killing the process with
// SIGPIPE (the test keeps SIGPIPE's default action, which would end it).

#include "cc/security/tls_byte_stream.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>

#include "absl/strings/string_view.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;

constexpr absl::Duration kTimeout = absl::Seconds(60);  // generous: a loaded machine

class TlsByteStreamTest : public ::testing::Test {
 protected:
  void SetUp() override {
    signal(SIGPIPE, SIG_DFL);  // the default action: a SIGPIPE would end the test
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(TestCa * ca, certs_->AddCa("ca"));
    CertRequest server;
    server.common_name = "server";
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(CertFiles server_files, ca->Issue("server", server));
    CertRequest client;
    client.common_name = "client";
    ASSERT_OK_AND_ASSIGN(CertFiles client_files, ca->Issue("client", client));
    server_tls_ = {server_files.cert, server_files.key, ca->cert_path()};
    client_tls_ = {client_files.cert, client_files.key, ca->cert_path()};
  }

  // A connected pair: {client, server}.
  void Connect() {
    int port = 0;
    ASSERT_OK_AND_ASSIGN(const int listener, ListenTcp("127.0.0.1", &port));
    absl::StatusOr<std::unique_ptr<ByteStream>> server;
    std::thread accepting([&] {
      const int fd = accept(listener, nullptr, nullptr);
      server = fd < 0 ? absl::InternalError("accept failed")
                      : StartTlsServer(fd, server_tls_, absl::Now() + kTimeout);
    });
    absl::StatusOr<std::unique_ptr<ByteStream>> client;
    absl::StatusOr<std::unique_ptr<ByteStream>> tcp = ConnectTcp("127.0.0.1", port, kTimeout);
    client = tcp.ok() ? StartTlsClient(*std::move(tcp), client_tls_, "127.0.0.1",
                                       absl::Now() + kTimeout)
                      : tcp.status();
    accepting.join();
    close(listener);
    ASSERT_OK(client.status());
    ASSERT_OK(server.status());
    client_ = *std::move(client);
    server_ = *std::move(server);
  }

  std::unique_ptr<TestCerts> certs_;
  TlsOptions server_tls_, client_tls_;
  std::unique_ptr<ByteStream> client_, server_;
};

std::string RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 random(seed);
  std::string bytes(n, '\0');
  for (char& c : bytes) c = static_cast<char>(random());
  return bytes;
}

TEST_F(TlsByteStreamTest, PiecesOfEverySizeArriveWholeAndInOrderBothWays) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  // Smaller than a record, a record and a byte, larger than the write buffer.
  const std::string small = RandomBytes(7, 1);
  const std::string record = RandomBytes(16 * 1024 + 1, 2);
  const std::string large = RandomBytes(3 * 1024 * 1024 + 5, 3);
  for (ByteStream* writer : {client_.get(), server_.get()}) {
    ByteStream* reader = writer == client_.get() ? server_.get() : client_.get();
    std::thread writing([&] {
      const absl::string_view parts[] = {small, record, large};
      EXPECT_OK(writer->Write(parts));
      EXPECT_OK(writer->Write({small}));  // a lone tiny write is flushed too
    });
    std::string got(small.size() + record.size() + large.size() + small.size(), '\0');
    ASSERT_OK(reader->Read(got.data(), got.size()));
    writing.join();
    EXPECT_TRUE(got == small + record + large + small);
  }
}

TEST_F(TlsByteStreamTest, WritingToAPeerThatHasGoneFailsInsteadOfRaisingSigpipe) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  server_.reset();  // closes its socket: the client's writes meet a reset
  const std::string chunk = RandomBytes(1 << 20, 4);
  absl::Status status;
  for (int i = 0; i < 256 && status.ok(); ++i) status = client_->Write({chunk});
  EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kUnavailable));
}

}  // namespace
}  // namespace pserver
