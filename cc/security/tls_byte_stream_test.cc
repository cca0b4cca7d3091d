// The TLS byte stream on its own, between two threads of this process over a
// loopback TCP connection: data written in pieces of any size arrives whole
// and in order both ways (writes are gathered into a buffer and flushed at
// the end of each Write, so nothing may stay behind in it), and a write to a
// peer that has gone fails with an error instead of killing the process with
// SIGPIPE (the test keeps SIGPIPE's default action, which would end it).

#include "cc/security/tls_byte_stream.h"

#include <openssl/ssl.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <random>
#include <string>
#include <thread>
#include <utility>

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
    // TLS records unless a test asks for the AEAD layer (on by default).
    server_tls_.bulk_aead = client_tls_.bulk_aead = false;
  }

  // A connected pair: {client, server}. `offered`: what the server's
  // OpenChannelResponse.bulk_aead would have told the client.
  // `client_first`: what the client writes at once (a server offering the
  // AEAD layer waits in its handshake for the client's first bytes).
  void Connect(bool offered = false, absl::string_view client_first = "") {
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
                                       absl::Now() + kTimeout, offered)
                      : tcp.status();
    if (client.ok() && !client_first.empty()) EXPECT_OK((*client)->Write({client_first}));
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

// Pieces smaller than a record, a record and a byte, larger than the write
// buffer, written both ways, arrive whole and in order.
void ExpectRoundTrips(ByteStream& client, ByteStream& server) {
  const std::string small = RandomBytes(7, 1);
  const std::string record = RandomBytes(16 * 1024 + 1, 2);
  const std::string large = RandomBytes(3 * 1024 * 1024 + 5, 3);
  for (ByteStream* writer : {&client, &server}) {
    ByteStream* reader = writer == &client ? &server : &client;
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

TEST_F(TlsByteStreamTest, PiecesOfEverySizeArriveWholeAndInOrderBothWays) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_FALSE(TlsUsesBulkAead(*client_));
  EXPECT_FALSE(TlsUsesBulkAead(*server_));
  ExpectRoundTrips(*client_, *server_);
}

TEST_F(TlsByteStreamTest, BothEndsOfferingTheAeadLayerSwitchToItAndCarryEverySize) {
  server_tls_.bulk_aead = client_tls_.bulk_aead = true;
  ASSERT_NO_FATAL_FAILURE(Connect(/*offered=*/true));
  EXPECT_TRUE(TlsUsesBulkAead(*client_));
  EXPECT_TRUE(TlsUsesBulkAead(*server_));
  ExpectRoundTrips(*client_, *server_);
}

TEST_F(TlsByteStreamTest, AeadKeysDifferPerDirectionAndPerConnection) {
  server_tls_.bulk_aead = client_tls_.bulk_aead = true;
  ASSERT_NO_FATAL_FAILURE(Connect(/*offered=*/true));
  const auto client1 = BulkAeadKeyIds(*client_);
  const auto server1 = BulkAeadKeyIds(*server_);
  ASSERT_FALSE(client1.first.empty());
  EXPECT_EQ(client1.first, server1.second);  // what one seals the other opens
  EXPECT_EQ(client1.second, server1.first);
  EXPECT_NE(client1.first, client1.second);  // the two directions differ
  ASSERT_NO_FATAL_FAILURE(Connect(/*offered=*/true));
  const auto client2 = BulkAeadKeyIds(*client_);
  EXPECT_NE(client2.first, client1.first);  // a new connection, new keys
  EXPECT_NE(client2.second, client1.second);
  EXPECT_EQ(BulkAeadKeyIds(*server_).first, client2.second);
}

TEST_F(TlsByteStreamTest, APeerThatDoesNotOfferTheAeadLayerKeepsTlsRecords) {
  // An older (or unwilling) client of a server that offers it: the server's
  // look for the switch hands the client's first bytes on as data, however
  // they are read.
  server_tls_.bulk_aead = true;
  ASSERT_NO_FATAL_FAILURE(Connect(/*offered=*/true, "PSB1abcdefgh"));
  EXPECT_FALSE(TlsUsesBulkAead(*client_));
  EXPECT_FALSE(TlsUsesBulkAead(*server_));
  char got[12];
  ASSERT_OK(server_->Read(got, 3));
  ASSERT_OK(server_->Read(got + 3, 9));
  EXPECT_EQ(absl::string_view(got, 12), "PSB1abcdefgh");
  ExpectRoundTrips(*client_, *server_);
  // A willing client of a server that offers nothing (an older server).
  server_tls_.bulk_aead = false;
  client_tls_.bulk_aead = true;
  ASSERT_NO_FATAL_FAILURE(Connect(/*offered=*/false));
  EXPECT_FALSE(TlsUsesBulkAead(*client_));
  EXPECT_FALSE(TlsUsesBulkAead(*server_));
  ExpectRoundTrips(*client_, *server_);
}

TEST_F(TlsByteStreamTest, BothEndsNegotiateAes128GcmAndAPlainSocketHasNoSuite) {
  ASSERT_NO_FATAL_FAILURE(Connect());
  EXPECT_EQ(TlsCipherSuite(*client_), "TLS_AES_128_GCM_SHA256");
  EXPECT_EQ(TlsCipherSuite(*server_), "TLS_AES_128_GCM_SHA256");
  int fds[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
  SocketStream plain(fds[0]);
  close(fds[1]);
  EXPECT_EQ(TlsCipherSuite(plain), "");
}

// The suite the server picks for a plain OpenSSL client offering only
// `client_suites`, in that order, as {client's view, server's view}.
std::pair<std::string, std::string> SuitesFor(const TlsOptions& server_tls,
                                              const TlsOptions& client_tls,
                                              const char* client_suites) {
  int port = 0;
  absl::StatusOr<int> listener = ListenTcp("127.0.0.1", &port);
  if (!listener.ok()) return {"listen failed", ""};
  std::string server_suite = "no handshake";
  std::thread accepting([&] {
    const int fd = accept(*listener, nullptr, nullptr);
    if (fd < 0) return;
    absl::StatusOr<std::unique_ptr<ByteStream>> server =
        StartTlsServer(fd, server_tls, absl::Now() + kTimeout);
    if (server.ok()) server_suite = TlsCipherSuite(**server);
  });
  std::string client_suite = "no handshake";
  absl::StatusOr<std::unique_ptr<ByteStream>> tcp = ConnectTcp("127.0.0.1", port, kTimeout);
  SSL_CTX* ctx = SSL_CTX_new(TLS_client_method());
  SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
  SSL_CTX_set_ciphersuites(ctx, client_suites);
  SSL_CTX_use_certificate_chain_file(ctx, client_tls.cert.c_str());
  SSL_CTX_use_PrivateKey_file(ctx, client_tls.key.c_str(), SSL_FILETYPE_PEM);
  SSL* ssl = SSL_new(ctx);
  if (tcp.ok()) {
    SSL_set_fd(ssl, dynamic_cast<SocketStream&>(**tcp).fd());
    if (SSL_connect(ssl) == 1) {
      client_suite = SSL_CIPHER_standard_name(SSL_get_current_cipher(ssl));
      // The server's handshake ends when it reads the client's Finished.
      SSL_write(ssl, "x", 1);
    }
  }
  if (tcp.ok()) (*tcp)->Shutdown();  // a failed handshake cannot leave the server waiting
  accepting.join();
  SSL_free(ssl);
  SSL_CTX_free(ctx);
  close(*listener);
  return {client_suite, server_suite};
}

TEST_F(TlsByteStreamTest, TheServerPicksAes128GcmWhicheverOrderTheClientOffers) {
  const std::string aes128 = "TLS_AES_128_GCM_SHA256";
  const std::string aes256 = "TLS_AES_256_GCM_SHA384";
  EXPECT_EQ(SuitesFor(server_tls_, client_tls_, "TLS_AES_256_GCM_SHA384:TLS_AES_128_GCM_SHA256"),
            std::make_pair(aes128, aes128));
  // AES-256-GCM stays allowed: a client that offers nothing else gets it.
  EXPECT_EQ(SuitesFor(server_tls_, client_tls_, "TLS_AES_256_GCM_SHA384"),
            std::make_pair(aes256, aes256));
}

TEST_F(TlsByteStreamTest, WritingToAPeerThatHasGoneFailsInsteadOfRaisingSigpipe) {
  for (bool aead : {false, true}) {
    server_tls_.bulk_aead = client_tls_.bulk_aead = aead;
    ASSERT_NO_FATAL_FAILURE(Connect(aead));
    EXPECT_EQ(TlsUsesBulkAead(*client_), aead);
    server_.reset();  // closes its socket: the client's writes meet a reset
    const std::string chunk = RandomBytes(1 << 20, 4);
    absl::Status status;
    for (int i = 0; i < 256 && status.ok(); ++i) status = client_->Write({chunk});
    EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kUnavailable)) << "aead " << aead;
  }
}

}  // namespace
}  // namespace pserver
