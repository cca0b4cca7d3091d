// Mutual TLS between Client and Server: a call goes through with
// certificates from the right CA; each wrong setup is refused with a message
// that says which; a server with missing files does not start; replacing the
// files rotates the server's certificate without a restart; the bulk channel
// is mutual TLS too, and refuses a certificate from another CA or plaintext.
#include "cc/security/tls.h"

#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "absl/synchronization/notification.h"
#include "cc/client/call_group.h"
#include "cc/client/channel_transport.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/core/status_macros.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/frame.h"
#include "cc/security/bulk_aead.h"
#include "cc/security/tls_byte_stream.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/server.h"
#include "cc/testing/child_process.h"
#include "cc/testing/sockets.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/support/channel_arguments.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

TlsOptions TlsOf(const CertFiles& files, const TestCa& ca) {
  TlsOptions tls;
  tls.cert = files.cert;
  tls.key = files.key;
  tls.ca = ca.cert_path();
  tls.reload_interval = absl::Seconds(1);
  return tls;
}

class TlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(ca_, certs_->AddCa("ca"));
    ASSERT_OK_AND_ASSIGN(other_ca_, certs_->AddCa("other-ca"));
    CertRequest server;
    server.common_name = "pserver-0";
    server.dns_names = {"localhost", "pserver-0.test"};
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(server_files_, ca_->Issue("server", server));
    CertRequest trainer;
    trainer.common_name = "trainer-0";
    ASSERT_OK_AND_ASSIGN(client_files_, ca_->Issue("trainer", trainer));
  }

  void StartServer(TlsOptions tls) {
    ServerOptions options;
    options.tls = std::move(tls);
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
  }
  void StartTlsServer() { StartServer(TlsOf(server_files_, *ca_)); }
  // Starts the server on copies of server_files_ in live_, files a test
  // replaces (by rename) to rotate the server's certificate.
  void StartServerOnLiveFiles() {
    ASSERT_OK_AND_ASSIGN(live_.cert, certs_->WriteFile("live.pem", ""));
    ASSERT_OK_AND_ASSIGN(live_.key, certs_->WriteFile("live.key", ""));
    ASSERT_OK(ReplaceFile(server_files_.cert, live_.cert));
    ASSERT_OK(ReplaceFile(server_files_.key, live_.key));
    StartServer(TlsOf(live_, *ca_));
  }
  // Replaces live_ (by rename, the key first) with a certificate for
  // 127.0.0.1 from other_ca_.
  void RotateLiveFilesToOtherCa() {
    CertRequest rotated;
    rotated.common_name = "pserver-0-rotated";
    rotated.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(CertFiles next, other_ca_->Issue("rotated", rotated));
    ASSERT_OK(ReplaceFile(next.key, live_.key));
    ASSERT_OK(ReplaceFile(next.cert, live_.cert));
  }

  std::unique_ptr<Client> ClientWith(TlsOptions tls,
                                     absl::Duration timeout = absl::Seconds(3)) {
    ClientOptions options;
    options.servers = {server_->address()};
    options.timeout = timeout;
    options.tls = std::move(tls);
    auto client = Client::Connect(options);
    EXPECT_OK(client.status());
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::unique_ptr<TestCerts> certs_;
  TestCa* ca_ = nullptr;
  TestCa* other_ca_ = nullptr;
  CertFiles server_files_;
  CertFiles client_files_;
  CertFiles live_;
  std::unique_ptr<Server> server_;
};

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream out;
  out << in.rdbuf();
  return out.str();
}

v1::ParameterConfig Sgd() {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(1.0);
  return config;
}

TEST_F(TlsTest, PushAndPullOverMutualTls) {
  StartTlsServer();
  std::unique_ptr<Client> client = ClientWith(TlsOf(client_files_, *ca_));
  ASSERT_NE(client, nullptr);
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd()));
  ASSERT_OK(client->FinishInitParams());
  ASSERT_OK(client->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})));
  ASSERT_OK_AND_ASSIGN(Tensor w, client->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
  Tensor out;
  ASSERT_OK(client->PushPull("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1}), &out));
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{-1, 0, 1, 2}));
  // With TLS the bulk channel is TLS too (cc/security/tls_channel_test.cc).
  EXPECT_NE(server_->bulk_listener(), nullptr);
}

TEST_F(TlsTest, ServerNameOverrideIsChecked) {
  StartTlsServer();
  TlsOptions named = TlsOf(client_files_, *ca_);
  named.server_name = "pserver-0.test";
  std::unique_ptr<Client> good = ClientWith(named);
  ASSERT_NE(good, nullptr);
  EXPECT_OK(good->GetStats().status());
  named.server_name = "someone-else.test";
  std::unique_ptr<Client> wrong = ClientWith(named);
  ASSERT_NE(wrong, nullptr);
  EXPECT_THAT(wrong->GetStats(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                          HasSubstr("does not name the host")));
}

TEST_F(TlsTest, PlaintextClientToTlsServerIsToldTheServerMayRequireTls) {
  StartTlsServer();
  std::unique_ptr<Client> client = ClientWith({});
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       AllOf(HasSubstr(server_->address()), HasSubstr("requires TLS"))));
}

TEST_F(TlsTest, TlsClientToPlaintextServerIsToldTheServerHasNoTls) {
  StartServer({});
  std::unique_ptr<Client> client = ClientWith(TlsOf(client_files_, *ca_));
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                           HasSubstr("the server does not speak TLS")));
}

TEST_F(TlsTest, ClientCertificateFromAnotherCaIsRefused) {
  StartTlsServer();
  CertRequest request;
  request.common_name = "intruder";
  ASSERT_OK_AND_ASSIGN(CertFiles intruder, other_ca_->Issue("intruder", request));
  std::unique_ptr<Client> client = ClientWith(TlsOf(intruder, *ca_));
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("the server refused this client's certificate")));
}

TEST_F(TlsTest, ServerCertificateFromAnotherCaIsRefusedByTheClient) {
  StartTlsServer();
  std::unique_ptr<Client> client = ClientWith(TlsOf(client_files_, *other_ca_));
  ASSERT_NE(client, nullptr);
  EXPECT_THAT(client->GetStats(),
              StatusIs(absl::StatusCode::kDeadlineExceeded,
                       HasSubstr("the server's certificate is not signed by this client's CA")));
}

TEST_F(TlsTest, ExpiredClientCertificateIsRefusedAtConnectAndByTheServer) {
  StartTlsServer();
  ASSERT_OK_AND_ASSIGN(CertFiles expired, ca_->Issue("expired", CertRequest::Expired("old")));
  ClientOptions options;
  options.servers = {server_->address()};
  options.tls = TlsOf(expired, *ca_);
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr(expired.cert), HasSubstr("expired on"))));
  // A client that does not check its own certificate is refused by the
  // server's handshake: the channel never gets ready.
  grpc::ChannelArguments arguments;
  auto channel = grpc::CreateCustomChannel(server_->address(),
                                           MakeChannelCredentials(TlsOf(expired, *ca_)),
                                           arguments);
  EXPECT_FALSE(channel->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(2))));
  auto good = grpc::CreateCustomChannel(server_->address(),
                                        MakeChannelCredentials(TlsOf(client_files_, *ca_)),
                                        arguments);
  EXPECT_TRUE(good->WaitForConnected(absl::ToChronoTime(absl::Now() + absl::Seconds(30))));
}

TEST_F(TlsTest, ServerStartFailsNamingTheBadFile) {
  ServerOptions options;
  options.tls = TlsOf(server_files_, *ca_);
  options.tls.key = certs_->dir() + "/no-such.key";
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kNotFound,
                       AllOf(HasSubstr("--tls_key"), HasSubstr("no-such.key"))));
  ASSERT_OK_AND_ASSIGN(std::string junk, certs_->WriteFile("junk.key", "not a key\n"));
  options.tls.key = junk;
  EXPECT_THAT(Server::Start(options), StatusIs(absl::StatusCode::kInvalidArgument,
                                               AllOf(HasSubstr("--tls_key"), HasSubstr(junk))));
  options.tls.key = client_files_.key;  // a key, but not the certificate's
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("is not the private key of --tls_cert"),
                             HasSubstr(client_files_.key))));
  options.tls.key.clear();
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("together"), HasSubstr("missing: --tls_key"))));
  options.tls = TlsOf(server_files_, *ca_);
  options.tls.ca = server_files_.key;
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("--tls_ca"), HasSubstr("holds no PEM CA certificate"))));
}

TEST_F(TlsTest, ClientWithServerNameButNoTlsIsRefused) {
  ClientOptions options;
  options.servers = {"127.0.0.1:7000"};
  options.tls.server_name = "pserver-0.test";
  EXPECT_THAT(Client::Connect(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("TLS is off")));
}

// The server's certificate is replaced by one from a second CA while it
// runs: new connections see the new one (a client trusting only the new CA
// gets through, one trusting only the old does not), and a client connected
// before keeps working over its connection.
TEST_F(TlsTest, ReplacingTheFilesRotatesTheServerCertificateWithoutRestart) {
  ASSERT_NO_FATAL_FAILURE(StartServerOnLiveFiles());
  std::unique_ptr<Client> before = ClientWith(TlsOf(client_files_, *ca_));
  ASSERT_NE(before, nullptr);
  ASSERT_OK(before->GetStats().status());

  ASSERT_NO_FATAL_FAILURE(RotateLiveFilesToOtherCa());

  // The server re-reads its files every second; each attempt makes a new
  // client (a new connection) and waits at most 2 s.
  bool rotated_seen = false;
  for (int attempt = 0; attempt < 30 && !rotated_seen; ++attempt) {
    std::unique_ptr<Client> after =
        ClientWith(TlsOf(client_files_, *other_ca_), absl::Seconds(2));
    ASSERT_NE(after, nullptr);
    rotated_seen = after->GetStats().ok();
  }
  EXPECT_TRUE(rotated_seen) << "no new connection saw the rotated certificate";
  std::unique_ptr<Client> stale = ClientWith(TlsOf(client_files_, *ca_), absl::Seconds(2));
  ASSERT_NE(stale, nullptr);
  EXPECT_THAT(stale->GetStats(), StatusIs(absl::StatusCode::kDeadlineExceeded,
                                          HasSubstr("not signed by this client's CA")));
  EXPECT_OK(before->GetStats().status());
}

// The pserver binary's --tls_* flags: a missing key stops it at start,
// naming the file; all three make it serve mutual TLS.
TEST_F(TlsTest, PserverBinaryTakesTheTlsFlags) {
  const std::string binary = RunfilesPath("cc/server/pserver");
  const std::string missing = certs_->dir() + "/missing.key";
  ASSERT_OK_AND_ASSIGN(auto bad, ChildProcess::Spawn(binary, {"--port=0",
                                                              "--tls_cert=" + server_files_.cert,
                                                              "--tls_key=" + missing,
                                                              "--tls_ca=" + ca_->cert_path()}));
  ASSERT_OK_AND_ASSIGN(int status, bad->WaitForExit(absl::Now() + absl::Seconds(60)));
  EXPECT_NE(status, 0);
  EXPECT_THAT(bad->output(), AllOf(HasSubstr("--tls_key"), HasSubstr(missing)));

  ASSERT_OK_AND_ASSIGN(auto good, ChildProcess::Spawn(binary, {"--port=0",
                                                               "--tls_cert=" + server_files_.cert,
                                                               "--tls_key=" + server_files_.key,
                                                               "--tls_ca=" + ca_->cert_path()}));
  ASSERT_OK_AND_ASSIGN(std::string address,
                       WaitForPserverAddress(*good, 0, absl::Now() + absl::Seconds(60)));
  ClientOptions options;
  options.servers = {address};
  options.tls = TlsOf(client_files_, *ca_);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(options));
  EXPECT_OK(client->GetStats().status());
  kill(good->pid(), SIGTERM);
  EXPECT_OK(good->WaitForExit(absl::Now() + absl::Seconds(30)).status());
}

constexpr absl::Duration kChannelTimeout = absl::Seconds(60);

// Pulls "w" over `t`, dropping the data.
absl::Status PullW(Transport& t) {
  std::vector<v1::ParamRef> refs(1);
  refs[0].set_name("w");
  absl::Notification done;
  absl::Status status;
  t.Pull(
      refs, [](const v1::Parameter&, const Segments&) { return absl::OkStatus(); },
      absl::Now() + kChannelTimeout, [&](absl::Status s) {
        status = std::move(s);
        done.Notify();
      });
  done.WaitForNotification();
  return status;
}

// The bulk channel over mutual TLS: a TLS client's bulk calls go over the
// channel (TCP + TLS, no Unix socket) with the right data; a channel client
// with a certificate from another CA, or one speaking plaintext, is refused
// by the server's channel (its calls then fall back to gRPC).
class TlsChannelTest : public TlsTest {
 protected:
  void SetUp() override {
    TlsTest::SetUp();
    StartTlsServer();
    ASSERT_NE(server_->bulk_listener(), nullptr);
    client_ = ClientWith(Good(), kChannelTimeout);
    ASSERT_NE(client_, nullptr);
    ASSERT_OK(client_->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd()));
    big_.resize(1 << 20);  // 4 MiB, several blocks and TLS records
    for (size_t i = 0; i < big_.size(); ++i) big_[i] = static_cast<float>(i % 1000);
    ASSERT_OK(client_->InitParam("big", Tensor::FromValues<float>({big_.size()}, big_), Sgd()));
    ASSERT_OK(client_->FinishInitParams());
  }

  TlsOptions Good() const { return TlsOf(client_files_, *ca_); }

  // A channel whose gRPC side has good certificates and whose channel side
  // uses `channel_tls`.
  std::unique_ptr<ChannelTransport> Channel(TlsOptions channel_tls,
                                            bool unsent_bytes_on_loopback = false) {
    auto grpc = GrpcTransport::Create(server_->address(), 1, false, Good());
    EXPECT_OK(grpc.status());
    ChannelTransportOptions options;
    options.tls = std::move(channel_tls);
    options.unsent_bytes_on_loopback = unsent_bytes_on_loopback;
    return std::make_unique<ChannelTransport>(*std::move(grpc), options);
  }

  std::vector<float> big_;
  std::unique_ptr<Client> client_;
};

TEST_F(TlsChannelTest, TlsClientUsesTheChannelOverTcp) {
  EXPECT_TRUE(server_->bulk_listener()->Offer().unix_socket().empty());
  std::unique_ptr<ChannelTransport> channel = Channel(Good());
  ASSERT_OK(PullW(*channel));
  EXPECT_EQ(channel->route(), "tcp");
  EXPECT_GE(channel->connections_opened(), 1);
  // The Client's own bulk calls take the channel too, with the right data.
  Tensor out;
  ASSERT_OK(client_->PushPull("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1}), &out));
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
  EXPECT_GE(server_->bulk_listener()->connections(), 1);
}

// The TCP socket beneath each TLS connection of the channel limits its
// unsent bytes (ChannelTransportOptions::unsent_bytes, 128 KiB by default;
// on loopback, as here, only with unsent_bytes_on_loopback).
TEST_F(TlsChannelTest, TheSocketBeneathTlsLimitsItsUnsentBytes) {
  std::unique_ptr<ChannelTransport> channel = Channel(Good(), /*unsent_bytes_on_loopback=*/true);
  for (int i = 0; i < 4; ++i) ASSERT_OK(PullW(*channel));  // round both connections
  ASSERT_EQ(channel->route(), "tcp");
  // The channel's two connections limit theirs; any of the fixture's client
  // (default options, loopback) leave the kernel's default.
  const std::vector<int> fds =
      TcpSocketsConnectedTo(static_cast<int>(server_->bulk_listener()->Offer().tcp_port()));
  int limited = 0;
  for (const int fd : fds) {
    const int limit = UnsentBytesLimitOf(fd);
    EXPECT_THAT(limit, ::testing::AnyOf(0, 128 << 10));
    if (limit == 128 << 10) ++limited;
  }
  EXPECT_EQ(limited, 2);
}

TEST_F(TlsChannelTest, LargeTensorRoundTripsOverTheChannel) {
  ASSERT_OK_AND_ASSIGN(Tensor got, client_->GetParam("big"));
  EXPECT_EQ(got.ToVector<float>(), big_);
  std::vector<float> ones(big_.size(), 1.0f);
  ASSERT_OK(client_->SendGrad("big", Tensor::FromValues<float>({ones.size()}, ones)));
  ASSERT_OK_AND_ASSIGN(got, client_->GetParam("big"));
  for (float& x : big_) x -= 1;
  EXPECT_EQ(got.ToVector<float>(), big_);
  EXPECT_GE(server_->bulk_listener()->connections(), 1);
}

// A Client over the channel with the AEAD layer and with TLS records: its
// pulls and push+pulls read each block straight from the stream into the
// output tensor (once the layout is known), with the values a pull over
// the fixture's client gives.
TEST_F(TlsChannelTest, PulledBlocksGoStraightIntoTheTensorOverAeadAndTlsRecords) {
  for (bool aead : {true, false}) {
    SCOPED_TRACE(aead ? "AEAD layer" : "TLS records");
    TlsOptions tls = Good();
    tls.bulk_aead = aead;
    std::unique_ptr<ChannelTransport> owned = Channel(tls);
    ChannelTransport* channel = owned.get();
    std::vector<std::unique_ptr<Transport>> transports;
    transports.push_back(std::move(owned));
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<Client> client,
                         Client::Create(ClientOptions(), std::move(transports)));
    const std::vector<std::string> names = {"big", "w"};
    std::vector<Tensor> outs(2);
    ASSERT_OK(client->GetParamsInto(names, absl::MakeSpan(outs)));  // learns the layouts
    const uint64_t before = channel->pulled_bytes_in_place();
    const uint64_t buffered = channel->pulled_bytes_buffered();  // block 0 of each, above
    ASSERT_OK(client->GetParamsInto(names, absl::MakeSpan(outs)));
    EXPECT_EQ(channel->pulled_bytes_in_place() - before, (big_.size() + 4) * sizeof(float));
    ASSERT_OK_AND_ASSIGN(Tensor want, client_->GetParam("big"));
    EXPECT_EQ(outs[0].bytes(), want.bytes());
    EXPECT_EQ(channel->route(), "tcp");

    const uint64_t before_push = channel->pulled_bytes_in_place();
    Tensor out;
    ASSERT_OK(client->PushPull(
        "big", Tensor::FromValues<float>({big_.size()}, std::vector<float>(big_.size(), 1)), &out));
    EXPECT_EQ(channel->pulled_bytes_in_place() - before_push, big_.size() * sizeof(float));
    ASSERT_OK_AND_ASSIGN(want, client_->GetParam("big"));
    EXPECT_EQ(out.bytes(), want.bytes());
    EXPECT_EQ(channel->pulled_bytes_buffered(), buffered);
  }
}

// A parameter of `floats` values i % 1000, pushed and pulled through
// `client` over its bulk channel: what comes back is exact both ways.
void ExpectBulkRoundTrip(Client& client, size_t floats) {
  std::vector<float> big(floats);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<float>(i % 1000);
  ASSERT_OK(client.InitParam("big", Tensor::FromValues<float>({big.size()}, big), Sgd()));
  ASSERT_OK(client.FinishInitParams());
  ASSERT_OK_AND_ASSIGN(Tensor got, client.GetParam("big"));
  EXPECT_EQ(got.ToVector<float>(), big);
  std::vector<float> ones(big.size(), 1.0f);
  Tensor out;
  ASSERT_OK(client.PushPull("big", Tensor::FromValues<float>({ones.size()}, ones), &out));
  for (float& x : big) x -= 1;
  EXPECT_EQ(out.ToVector<float>(), big);
}

// The server's count of AEAD connections, as GetStats tells it (equal to the
// bulk listener's own count).
uint64_t AeadConnectionsOf(Client& client, Server& server) {
  absl::StatusOr<std::vector<v1::ServerStats>> stats = client.GetStats();
  EXPECT_OK(stats.status());
  if (!stats.ok() || stats->size() != 1) return ~uint64_t{0};
  EXPECT_EQ((*stats)[0].bulk_aead_connections(), server.bulk_listener()->aead_connections());
  return (*stats)[0].bulk_aead_connections();
}

// The AEAD layer is on by default at both ends (when the CPU runs it).
TEST_F(TlsTest, TheAeadLayerIsOnByDefault) {
  EXPECT_TRUE(TlsOptions().bulk_aead);
  StartTlsServer();  // TlsOf: bulk_aead left at its default
  ASSERT_NE(server_->bulk_listener(), nullptr);
  EXPECT_EQ(server_->bulk_listener()->Offer().bulk_aead(), BulkAeadAvailable() ? 1u : 0u);
  std::unique_ptr<Client> client = ClientWith(TlsOf(client_files_, *ca_), kChannelTimeout);
  ASSERT_NE(client, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectBulkRoundTrip(*client, 1 << 19));  // 2 MiB
  EXPECT_GE(server_->bulk_listener()->connections(), 1);
  const uint64_t aead = AeadConnectionsOf(*client, *server_);
  if (BulkAeadAvailable()) {
    EXPECT_GE(aead, 1u);
  } else {
    EXPECT_EQ(aead, 0u);
  }
}

// Server on/off x client on/off (ServerOptions.tls.bulk_aead, the server's
// --tls_bulk_aead; the client's TlsOptions::bulk_aead): in every cell the
// bulk calls carry exact data both ways over the channel; the connections
// use the AEAD layer only when both ends want it, TLS records otherwise.
class TlsAeadMatrixTest : public TlsTest,
                          public ::testing::WithParamInterface<std::tuple<bool, bool>> {};

TEST_P(TlsAeadMatrixTest, DataIsExactAndTheStreamIsAeadOnlyWhenBothEndsWantIt) {
  const auto [server_wants, client_wants] = GetParam();
  TlsOptions server_tls = TlsOf(server_files_, *ca_);
  server_tls.bulk_aead = server_wants;
  StartServer(server_tls);
  ASSERT_NE(server_->bulk_listener(), nullptr);
  const bool both = server_wants && client_wants && BulkAeadAvailable();
  EXPECT_EQ(server_->bulk_listener()->Offer().bulk_aead(),
            server_wants && BulkAeadAvailable() ? 1u : 0u);
  TlsOptions client_tls = TlsOf(client_files_, *ca_);
  client_tls.bulk_aead = client_wants;
  std::unique_ptr<Client> client = ClientWith(client_tls, kChannelTimeout);
  ASSERT_NE(client, nullptr);
  ASSERT_NO_FATAL_FAILURE(ExpectBulkRoundTrip(*client, 3 << 18));  // 3 MiB: several records
  EXPECT_GE(server_->bulk_listener()->connections(), 1);  // the channel carried them
  const uint64_t aead = AeadConnectionsOf(*client, *server_);
  if (both) {
    EXPECT_GE(aead, 1u);
  } else {
    EXPECT_EQ(aead, 0u);
  }
}

INSTANTIATE_TEST_SUITE_P(
    ServerXClient, TlsAeadMatrixTest,
    ::testing::Combine(::testing::Bool(), ::testing::Bool()),
    [](const ::testing::TestParamInfo<std::tuple<bool, bool>>& info) {
      return absl::StrCat("Server", std::get<0>(info.param) ? "On" : "Off", "Client",
                          std::get<1>(info.param) ? "On" : "Off");
    });

// The pserver binary: without the flag it offers the AEAD layer and a
// default client's bulk connection uses it; --tls_bulk_aead=false keeps TLS
// records for the same client. Data exact either way.
TEST_F(TlsTest, PserverBinaryOffersTheAeadLayerUnlessTurnedOff) {
  const std::string binary = RunfilesPath("cc/server/pserver");
  for (const bool off : {false, true}) {
    SCOPED_TRACE(off ? "--tls_bulk_aead=false" : "default");
    std::vector<std::string> args = {"--port=0", "--tls_cert=" + server_files_.cert,
                                     "--tls_key=" + server_files_.key,
                                     "--tls_ca=" + ca_->cert_path()};
    if (off) args.push_back("--tls_bulk_aead=false");
    ASSERT_OK_AND_ASSIGN(auto child, ChildProcess::Spawn(binary, args));
    absl::StatusOr<std::string> address =
        WaitForPserverAddress(*child, 0, absl::Now() + absl::Seconds(60));
    if (address.ok()) {
      ClientOptions options;
      options.servers = {*address};
      options.timeout = kChannelTimeout;
      options.tls = TlsOf(client_files_, *ca_);  // bulk_aead: the default
      absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
      EXPECT_OK(client.status());
      if (client.ok()) {
        EXPECT_NO_FATAL_FAILURE(ExpectBulkRoundTrip(**client, 1 << 19));
        absl::StatusOr<std::vector<v1::ServerStats>> stats = (*client)->GetStats();
        EXPECT_OK(stats.status());
        if (stats.ok() && stats->size() == 1) {
          if (!off && BulkAeadAvailable()) {
            EXPECT_GE((*stats)[0].bulk_aead_connections(), 1u);
          } else {
            EXPECT_EQ((*stats)[0].bulk_aead_connections(), 0u);
          }
        }
      }
    }
    EXPECT_OK(address.status());
    kill(child->pid(), SIGTERM);
    EXPECT_OK(child->WaitForExit(absl::Now() + absl::Seconds(30)).status());
  }
}

TEST_F(TlsChannelTest, ClientCertificateFromAnotherCaIsRefusedOnTheChannel) {
  CertRequest request;
  request.common_name = "intruder";
  ASSERT_OK_AND_ASSIGN(CertFiles intruder, other_ca_->Issue("intruder", request));
  TlsOptions bad = TlsOf(intruder, *ca_);  // trusts the server, is not trusted
  std::unique_ptr<ChannelTransport> channel = Channel(bad);
  ASSERT_OK(PullW(*channel));  // over gRPC's good certificates
  EXPECT_EQ(channel->route(), "grpc");
  EXPECT_EQ(channel->connections_opened(), 0);
  // At the stream: the handshake or the first read fails.
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_OK_AND_ASSIGN(auto tcp, ConnectTcp("127.0.0.1", port, kChannelTimeout));
  absl::StatusOr<std::unique_ptr<ByteStream>> tls =
      StartTlsClient(std::move(tcp), bad, "127.0.0.1", absl::Now() + kChannelTimeout);
  if (tls.ok()) {
    char byte;
    ASSERT_OK((*tls)->Write({absl::string_view("x")}));
    EXPECT_THAT((*tls)->Read(&byte, 1), StatusCodeIs(absl::StatusCode::kUnavailable));
  }
}

TEST_F(TlsChannelTest, ServerCertificateFromAnotherCaIsRefusedByTheChannelClient) {
  CertRequest request;
  request.common_name = "trainer-1";
  ASSERT_OK_AND_ASSIGN(CertFiles files, other_ca_->Issue("trainer-1", request));
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_OK_AND_ASSIGN(auto tcp, ConnectTcp("127.0.0.1", port, kChannelTimeout));
  EXPECT_THAT(StartTlsClient(std::move(tcp), TlsOf(files, *other_ca_), "127.0.0.1",
                             absl::Now() + kChannelTimeout),
              StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsChannelTest, PlaintextChannelClientIsRefused) {
  std::unique_ptr<ChannelTransport> channel = Channel({});
  ASSERT_OK(PullW(*channel));
  EXPECT_EQ(channel->route(), "grpc");
  EXPECT_EQ(channel->connections_opened(), 0);
}

// The bulk channel reads the server's files for each new connection: once
// they are replaced by a certificate from another CA, the next channel
// connection presents it, with no reload interval and no restart. A channel
// client trusting only the old CA is then refused at the handshake (and its
// calls keep to gRPC); one trusting only the new CA connects and carries the
// calls. (The gRPC side, re-read on a timer, trusts both CAs here, so only
// the channel's own handshake decides.)
TEST_F(TlsTest, ReplacingTheFilesRotatesTheChannelCertificateAtTheNextConnection) {
  ASSERT_NO_FATAL_FAILURE(StartServerOnLiveFiles());
  ASSERT_NE(server_->bulk_listener(), nullptr);
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  {
    std::unique_ptr<Client> setup = ClientWith(TlsOf(client_files_, *ca_), kChannelTimeout);
    ASSERT_NE(setup, nullptr);
    ASSERT_OK(setup->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd()));
    ASSERT_OK(setup->FinishInitParams());
  }
  ASSERT_OK_AND_ASSIGN(std::string both_cas,
                       certs_->WriteFile("both-cas.pem", ReadAll(ca_->cert_path()) +
                                                             ReadAll(other_ca_->cert_path())));
  TlsOptions trusts_both = TlsOf(client_files_, *ca_);
  trusts_both.ca = both_cas;
  const TlsOptions trusts_old = TlsOf(client_files_, *ca_);
  const TlsOptions trusts_new = TlsOf(client_files_, *other_ca_);
  // A channel whose OpenChannel goes over gRPC trusting both CAs and whose
  // own connections use `channel_tls`.
  auto channel_with = [&](const TlsOptions& channel_tls) {
    auto grpc = GrpcTransport::Create(server_->address(), 1, false, trusts_both);
    EXPECT_OK(grpc.status());
    ChannelTransportOptions options;
    options.tls = channel_tls;
    return std::make_unique<ChannelTransport>(*std::move(grpc), options);
  };
  // A bare handshake with the channel's listener.
  auto handshake = [&](const TlsOptions& tls) -> absl::Status {
    PS_ASSIGN_OR_RETURN(auto tcp, ConnectTcp("127.0.0.1", port, kChannelTimeout));
    return StartTlsClient(std::move(tcp), tls, "127.0.0.1", absl::Now() + kChannelTimeout)
        .status();
  };

  // The certificate the next connection presents is trusted by `trusting`,
  // refused by `refusing`; a channel trusting it opens a connection.
  auto expect_presented = [&](const TlsOptions& trusting, const TlsOptions& refusing) {
    EXPECT_OK(handshake(trusting));
    EXPECT_THAT(handshake(refusing), StatusIs(absl::StatusCode::kUnavailable,
                                              HasSubstr("certificate verify failed")));
    std::unique_ptr<ChannelTransport> channel = channel_with(trusting);
    ASSERT_OK(PullW(*channel));
    EXPECT_EQ(channel->route(), "tcp");
    EXPECT_GE(channel->connections_opened(), 1);
  };

  // Before: the old CA's certificate.
  expect_presented(trusts_old, trusts_new);

  ASSERT_NO_FATAL_FAILURE(RotateLiveFilesToOtherCa());

  // After: the very next connection presents the new CA's certificate, and
  // a channel trusting only the old CA keeps to gRPC.
  expect_presented(trusts_new, trusts_old);
  std::unique_ptr<ChannelTransport> stale_channel = channel_with(trusts_old);
  ASSERT_OK(PullW(*stale_channel));  // over gRPC, which trusts both
  EXPECT_EQ(stale_channel->route(), "grpc");
  EXPECT_EQ(stale_channel->connections_opened(), 0);
}

// Pushes a gradient of ones to the 4 floats of "w" over `t`.
absl::Status PushOnesToW(Transport& t, uint64_t sequence) {
  const std::vector<float> ones(4, 1.0f);
  GradientView view;
  view.name = "w";
  view.type = v1::FLOAT32;
  view.content = absl::string_view(reinterpret_cast<const char*>(ones.data()),
                                   ones.size() * sizeof(float));
  CallGroup group;
  t.Push({77, sequence}, absl::MakeConstSpan(&view, 1), absl::Now() + kChannelTimeout,
         group.Add("w"));
  return group.Wait();
}

// Roles from client certificates on the bulk channel (--auth_cert_rule): a
// client identified by its certificate alone (no bearer token) gets the
// channel, its role and job read from the certificate the TLS handshake
// verified, by the same rule as on gRPC; each frame is authorized against it.
class TlsCertRoleChannelTest : public TlsTest {
 protected:
  void SetUp() override {
    TlsTest::SetUp();
    CertRequest request;
    request.common_name = "trainer.job-a";
    ASSERT_OK_AND_ASSIGN(trainer_, ca_->Issue("trainer-a", request));
    request.common_name = "reader.job-a";
    ASSERT_OK_AND_ASSIGN(reader_, ca_->Issue("reader-a", request));
    ServerOptions options;
    options.tls = TlsOf(server_files_, *ca_);
    options.job = "job-a";
    options.auth_cert_rule = "cn:<role>.<job>";
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
    ASSERT_NE(server_->bulk_listener(), nullptr);
    trainer_client_ = ClientWith(TlsOf(trainer_, *ca_), kChannelTimeout);
    ASSERT_NE(trainer_client_, nullptr);
    ASSERT_OK(trainer_client_->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), Sgd()));
    ASSERT_OK(trainer_client_->FinishInitParams());
  }

  // A channel presenting `who`'s certificate (and no token) on both sides.
  std::unique_ptr<ChannelTransport> ChannelAs(const CertFiles& who) {
    auto grpc = GrpcTransport::Create(server_->address(), 1, false, TlsOf(who, *ca_));
    EXPECT_OK(grpc.status());
    ChannelTransportOptions options;
    options.tls = TlsOf(who, *ca_);
    return std::make_unique<ChannelTransport>(*std::move(grpc), options);
  }

  CertFiles trainer_, reader_;
  std::unique_ptr<Client> trainer_client_;
};

TEST_F(TlsCertRoleChannelTest, CertOnlyTrainerPushesOverTheChannel) {
  std::unique_ptr<ChannelTransport> channel = ChannelAs(trainer_);
  ASSERT_OK(PushOnesToW(*channel, 1));
  EXPECT_EQ(channel->route(), "tcp");
  EXPECT_GE(channel->connections_opened(), 1);
  ASSERT_OK_AND_ASSIGN(Tensor w, trainer_client_->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{0, 1, 2, 3}));
  // The Client's own pushes take the channel too.
  ASSERT_OK(trainer_client_->SendGrad("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1})));
  EXPECT_GE(server_->bulk_listener()->connections(), 1);
}

TEST_F(TlsCertRoleChannelTest, CertOnlyReaderIsRefusedAPushOnTheChannel) {
  std::unique_ptr<ChannelTransport> channel = ChannelAs(reader_);
  ASSERT_OK(PullW(*channel));
  EXPECT_EQ(channel->route(), "tcp");
  EXPECT_THAT(PushOnesToW(*channel, 1),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role reader of job job-a may not SendGrads")));
  EXPECT_EQ(channel->route(), "tcp");  // refused by the channel, which stays
  ASSERT_OK_AND_ASSIGN(Tensor w, trainer_client_->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{1, 2, 3, 4}));  // nothing applied
}

// Another job's certificate is refused OpenChannel (on gRPC) already, so it
// never holds a channel connection; its push is refused naming both jobs.
TEST_F(TlsCertRoleChannelTest, CertificateOfAnotherJobGetsNoChannel) {
  CertRequest request;
  request.common_name = "trainer.job-b";
  ASSERT_OK_AND_ASSIGN(CertFiles other, ca_->Issue("trainer-b", request));
  std::unique_ptr<ChannelTransport> channel = ChannelAs(other);
  EXPECT_THAT(PushOnesToW(*channel, 1),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("of job job-b may not SendGrads on a server of job job-a")));
  EXPECT_EQ(channel->route(), "grpc");
  EXPECT_EQ(channel->connections_opened(), 0);
}

// A SAN rule reads the channel peer's URI subject alternative name (the
// common name here matches nothing), among DNS and IP names.
TEST_F(TlsCertRoleChannelTest, SanRuleReadsTheUriOnTheChannel) {
  ServerOptions options;
  options.tls = TlsOf(server_files_, *ca_);
  options.job = "job-a";
  options.auth_cert_rule = "san:spiffe://<job>/<role>";
  ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
  CertRequest request;
  request.common_name = "not-a-role";
  request.dns_names = {"reader.test"};
  request.ip_addresses = {"10.1.2.3"};
  request.uris = {"spiffe://job-a/reader"};
  ASSERT_OK_AND_ASSIGN(CertFiles files, ca_->Issue("san-reader", request));
  std::unique_ptr<ChannelTransport> channel = ChannelAs(files);
  EXPECT_THAT(PushOnesToW(*channel, 1),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role reader of job job-a may not SendGrads")));
  EXPECT_EQ(channel->route(), "tcp");
}

}  // namespace
}  // namespace pserver

namespace pserver {
namespace {

// Writes a request frame: its header, then `payload`.
absl::Status WriteFrame(ByteStream& stream, FrameMethod method, uint64_t id,
                        uint64_t payload_bytes, absl::string_view payload) {
  char header[kFrameHeaderBytes];
  EncodeRequestHeader({method, id, 0, payload_bytes}, header);
  return stream.Write({absl::string_view(header, sizeof(header)), payload});
}

// The next reply frame's status (its message and payload read and dropped).
absl::Status ReadReplyStatus(ByteStream& stream) {
  char encoded[kReplyHeaderBytes];
  PS_RETURN_IF_ERROR(stream.Read(encoded, sizeof(encoded)));
  PS_ASSIGN_OR_RETURN(ReplyHeader header, DecodeReplyHeader(encoded, kDefaultMaxMessageBytes));
  std::string message(header.message_bytes, '\0');
  std::string payload(header.payload_bytes, '\0');
  PS_RETURN_IF_ERROR(stream.Read(message.data(), message.size()));
  PS_RETURN_IF_ERROR(stream.Read(payload.data(), payload.size()));
  return absl::Status(header.code, message);
}

// A frame stalled inside a record, on the AEAD layer and on TLS records: the
// server's frame deadline (--bulk_frame_receive_timeout_seconds) closes the
// connection whatever layer is blocked on the socket, and the request
// budget the frame held is given back: a frame of the whole budget is then
// read (and refused as malformed, not as "retry later").
TEST_F(TlsTest, AFrameStalledInsideARecordIsDroppedByItsDeadlineOnEitherLayer) {
  constexpr uint64_t kBudget = uint64_t{1} << 20;
  for (const bool aead : {true, false}) {
    SCOPED_TRACE(aead ? "AEAD layer" : "TLS records");
    ServerOptions options;
    options.tls = TlsOf(server_files_, *ca_);
    options.tls.bulk_aead = aead;
    options.max_bulk_request_bytes_in_flight = kBudget;
    options.bulk_frame_receive_timeout = absl::Seconds(1);
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
    BulkListener& bulk = *server_->bulk_listener();
    // A greeted connection over TLS (and the AEAD layer when both ends
    // have it); `fd`: a descriptor of its socket (the caller closes it),
    // for bytes sent under the TLS layer.
    const auto greeted = [&](int* fd) -> absl::StatusOr<std::unique_ptr<ByteStream>> {
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ByteStream> tcp,
                          ConnectTcp("127.0.0.1", static_cast<int>(bulk.Offer().tcp_port()),
                                     kChannelTimeout));
      // A second descriptor of the socket: the TLS stream takes the first over.
      if (fd != nullptr) *fd = dup(static_cast<SocketStream*>(tcp.get())->fd());
      PS_ASSIGN_OR_RETURN(
          std::unique_ptr<ByteStream> stream,
          StartTlsClient(std::move(tcp), TlsOf(client_files_, *ca_), "127.0.0.1",
                         absl::Now() + kChannelTimeout, bulk.Offer().bulk_aead() == 1));
      PS_RETURN_IF_ERROR(WriteFrame(*stream, FrameMethod::kHello, 1, bulk.Offer().token().size(),
                                    bulk.Offer().token()));
      PS_RETURN_IF_ERROR(ReadReplyStatus(*stream));
      return std::move(stream);
    };
    int fd = -1;
    ASSERT_OK_AND_ASSIGN(std::unique_ptr<ByteStream> stalled, greeted(&fd));
    EXPECT_EQ(TlsUsesBulkAead(*stalled), aead && BulkAeadAvailable());
    // The header promises the whole budget; some payload comes in whole
    // records, then one byte of the next record, and nothing more.
    ASSERT_OK(WriteFrame(*stalled, FrameMethod::kGetParams, 2, kBudget, std::string(4096, '\xff')));
    const ssize_t sent = send(fd, "\x17", 1, MSG_NOSIGNAL);
    close(fd);
    ASSERT_EQ(sent, 1);
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    for (int i = 0; i < 120000 && absl::Now() < deadline && bulk.frames_timed_out() < 1; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    ASSERT_EQ(bulk.frames_timed_out(), 1u);
    for (int i = 0; i < 120000 && absl::Now() < deadline && bulk.request_bytes_held() > 0; ++i) {
      absl::SleepFor(absl::Milliseconds(1));
    }
    EXPECT_EQ(bulk.request_bytes_held(), 0u);
    EXPECT_THAT(ReadReplyStatus(*stalled), StatusCodeIs(absl::StatusCode::kUnavailable));
    // The whole budget is free: a frame of that size is read to its end.
    // (Retried on a new connection should this loaded machine not read it
    // within its own deadline, as a client would.)
    absl::Status answer = absl::UnknownError("not sent");
    for (int attempt = 0; attempt < 20 && answer.code() != absl::StatusCode::kInvalidArgument;
         ++attempt) {
      ASSERT_OK_AND_ASSIGN(std::unique_ptr<ByteStream> stream, greeted(nullptr));
      answer = WriteFrame(*stream, FrameMethod::kGetParams, 3, kBudget,
                          std::string(kBudget, '\xff'));
      if (answer.ok()) answer = ReadReplyStatus(*stream);
    }
    EXPECT_THAT(answer, StatusCodeIs(absl::StatusCode::kInvalidArgument));
    server_.reset();
  }
}

}  // namespace
}  // namespace pserver
