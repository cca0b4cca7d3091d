// The bulk channel over mutual TLS: a TLS client's bulk calls go over the
// channel (TCP + TLS, no Unix socket) with the right data; a channel client
// with a certificate from another CA, or one speaking plaintext, is refused
// by the server's channel (its calls fall back to gRPC, which then decides).
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/synchronization/notification.h"
#include "cc/client/channel_transport.h"
#include "cc/client/client.h"
#include "cc/client/grpc_transport.h"
#include "cc/rpc/byte_stream.h"
#include "cc/security/tls.h"
#include "cc/security/tls_byte_stream.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;

constexpr absl::Duration kTimeout = absl::Seconds(60);

TlsOptions TlsOf(const CertFiles& files, const TestCa& ca) {
  TlsOptions tls;
  tls.cert = files.cert;
  tls.key = files.key;
  tls.ca = ca.cert_path();
  return tls;
}

absl::Status PushOver(Transport& t, RequestId id, const std::vector<float>& grad) {
  GradientView view;
  view.name = "w";
  view.type = v1::FLOAT32;
  view.content = absl::string_view(reinterpret_cast<const char*>(grad.data()),
                                   grad.size() * sizeof(float));
  absl::Notification done;
  absl::Status status;
  t.Push(id, absl::MakeConstSpan(&view, 1), absl::Now() + kTimeout, [&](absl::Status s) {
    status = std::move(s);
    done.Notify();
  });
  done.WaitForNotification();
  return status;
}

class TlsChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(ca_, certs_->AddCa("ca"));
    ASSERT_OK_AND_ASSIGN(other_ca_, certs_->AddCa("other-ca"));
    CertRequest server;
    server.common_name = "pserver-0";
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(CertFiles server_files, ca_->Issue("server", server));
    CertRequest trainer;
    trainer.common_name = "trainer-0";
    ASSERT_OK_AND_ASSIGN(client_files_, ca_->Issue("trainer", trainer));
    ServerOptions options;
    options.tls = TlsOf(server_files, *ca_);
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
    ASSERT_NE(server_->bulk_listener(), nullptr);
    ClientOptions client;
    client.servers = {server_->address()};
    client.tls = Good();
    ASSERT_OK_AND_ASSIGN(client_, Client::Connect(client));
    v1::ParameterConfig sgd;
    sgd.mutable_optimizer()->mutable_sgd();
    sgd.mutable_learning_rate()->set_learning_rate(1.0);
    ASSERT_OK(client_->InitParam("w", Tensor::FromValues<float>({4}, {1, 2, 3, 4}), sgd));
    big_.resize(1 << 20);  // 4 MiB, several blocks and TLS records
    for (size_t i = 0; i < big_.size(); ++i) big_[i] = static_cast<float>(i % 1000);
    ASSERT_OK(client_->InitParam("big", Tensor::FromValues<float>({big_.size()}, big_), sgd));
    ASSERT_OK(client_->FinishInitParams());
  }

  TlsOptions Good() const { return TlsOf(client_files_, *ca_); }

  // A channel whose gRPC side has good certificates and whose channel side
  // uses `channel_tls`.
  std::unique_ptr<ChannelTransport> Channel(TlsOptions channel_tls) {
    auto grpc = GrpcTransport::Create(server_->address(), 1, false, Good());
    EXPECT_OK(grpc.status());
    ChannelTransportOptions options;
    options.tls = std::move(channel_tls);
    return std::make_unique<ChannelTransport>(*std::move(grpc), options);
  }

  std::unique_ptr<TestCerts> certs_;
  TestCa* ca_ = nullptr;
  TestCa* other_ca_ = nullptr;
  CertFiles client_files_;
  std::vector<float> big_;
  std::unique_ptr<Server> server_;
  std::unique_ptr<Client> client_;
};

TEST_F(TlsChannelTest, TlsClientUsesTheChannelOverTcp) {
  EXPECT_TRUE(server_->bulk_listener()->Offer().unix_socket().empty());
  std::unique_ptr<ChannelTransport> channel = Channel(Good());
  ASSERT_OK(PushOver(*channel, {7, 1}, {1, 1, 1, 1}));
  EXPECT_EQ(channel->route(), "tcp");
  EXPECT_GE(channel->connections_opened(), 1);
  ASSERT_OK(PushOver(*channel, {7, 2}, {1, 1, 1, 1}));
  ASSERT_OK_AND_ASSIGN(Tensor w, client_->GetParam("w"));
  EXPECT_EQ(w.ToVector<float>(), (std::vector<float>{-1, 0, 1, 2}));
  // The Client's own bulk calls take the channel too, with the same data.
  Tensor out;
  ASSERT_OK(client_->PushPull("w", Tensor::FromValues<float>({4}, {1, 1, 1, 1}), &out));
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{-2, -1, 0, 1}));
  EXPECT_GE(server_->bulk_listener()->connections(), 1);
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

TEST_F(TlsChannelTest, ClientCertificateFromAnotherCaIsRefusedOnTheChannel) {
  CertRequest request;
  request.common_name = "intruder";
  ASSERT_OK_AND_ASSIGN(CertFiles intruder, other_ca_->Issue("intruder", request));
  TlsOptions bad = TlsOf(intruder, *ca_);  // trusts the server, is not trusted
  std::unique_ptr<ChannelTransport> channel = Channel(bad);
  ASSERT_OK(PushOver(*channel, {8, 1}, {1, 1, 1, 1}));  // over gRPC's good certificates
  EXPECT_EQ(channel->route(), "grpc");
  EXPECT_EQ(channel->connections_opened(), 0);
  // At the stream: the handshake or the first read fails.
  const int port = static_cast<int>(server_->bulk_listener()->Offer().tcp_port());
  ASSERT_OK_AND_ASSIGN(auto tcp, ConnectTcp("127.0.0.1", port, kTimeout));
  absl::StatusOr<std::unique_ptr<ByteStream>> tls =
      StartTlsClient(std::move(tcp), bad, "127.0.0.1", absl::Now() + kTimeout);
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
  ASSERT_OK_AND_ASSIGN(auto tcp, ConnectTcp("127.0.0.1", port, kTimeout));
  EXPECT_THAT(StartTlsClient(std::move(tcp), TlsOf(files, *other_ca_), "127.0.0.1",
                             absl::Now() + kTimeout),
              StatusCodeIs(absl::StatusCode::kUnavailable));
}

TEST_F(TlsChannelTest, PlaintextChannelClientIsRefused) {
  std::unique_ptr<ChannelTransport> channel = Channel({});
  ASSERT_OK(PushOver(*channel, {9, 1}, {1, 1, 1, 1}));
  EXPECT_EQ(channel->route(), "grpc");
  EXPECT_EQ(channel->connections_opened(), 0);
}

}  // namespace
}  // namespace pserver
