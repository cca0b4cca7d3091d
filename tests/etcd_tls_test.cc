// etcd over TLS with client-certificate auth (etcd --client-cert-auth):
// EtcdClient, a server registering and a client discovering through it, and
// what a client without a certificate, or with one from another CA, gets.
// Certificates are made at test time (cc/testing/test_certs.h).
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;
using ::pserver::testing::IsOk;
using ::testing::Not;

class EtcdTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(TestCa * ca, certs_->AddCa("etcd-ca"));
    ASSERT_OK_AND_ASSIGN(TestCa * rogue, certs_->AddCa("rogue-ca"));
    CertRequest server;
    server.common_name = "etcd";
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(CertFiles etcd_files, ca->Issue("etcd", server));
    CertRequest client;
    client.common_name = "pserver";
    ASSERT_OK_AND_ASSIGN(CertFiles client_files, ca->Issue("client", client));
    ASSERT_OK_AND_ASSIGN(CertFiles rogue_files, rogue->Issue("rogue", client));
    tls_ = {ca->cert_path(), client_files.cert, client_files.key};
    rogue_tls_ = {ca->cert_path(), rogue_files.cert, rogue_files.key};

    testing::EtcdProcessOptions options;
    options.tls = {etcd_files.cert, etcd_files.key, ca->cert_path(), client_files.cert,
                   client_files.key};
    ASSERT_OK_AND_ASSIGN(etcd_, testing::EtcdProcess::Start(options));
  }

  absl::StatusOr<std::unique_ptr<EtcdClient>> Connect(const EtcdTlsOptions& tls) {
    EtcdClientOptions options;
    options.endpoints = {etcd_->endpoint()};
    options.prefix = etcd_keys::ClusterPrefix("tls");
    options.timeout = absl::Seconds(3);
    options.tls = tls;
    return EtcdClient::Connect(options);
  }

  std::unique_ptr<TestCerts> certs_;
  EtcdTlsOptions tls_, rogue_tls_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
};

TEST_F(EtcdTlsTest, ClientWithCertificateReadsAndWrites) {
  ASSERT_OK_AND_ASSIGN(auto etcd, Connect(tls_));
  ASSERT_OK(etcd->Put("/k", "v"));
  ASSERT_OK_AND_ASSIGN(KeyValue kv, etcd->Get("/k"));
  EXPECT_EQ(kv.value, "v");
  // "https://" is accepted with TLS options.
  EtcdClientOptions options;
  options.endpoints = {"https://" + etcd_->endpoint()};
  options.tls = tls_;
  ASSERT_OK_AND_ASSIGN(auto https, EtcdClient::Connect(options));
  EXPECT_OK(https->Get("/pserver/tls/k").status());
}

TEST_F(EtcdTlsTest, PlaintextOrForeignCertificateIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto plaintext, Connect(EtcdTlsOptions()));
  EXPECT_THAT(plaintext->Put("/k", "v"), Not(IsOk()));
  ASSERT_OK_AND_ASSIGN(auto rogue, Connect(rogue_tls_));
  EXPECT_THAT(rogue->Put("/k", "v"), Not(IsOk()));
  // Without a client certificate etcd's --client-cert-auth refuses too.
  EtcdTlsOptions ca_only;
  ca_only.ca = tls_.ca;
  ASSERT_OK_AND_ASSIGN(auto anonymous, Connect(ca_only));
  EXPECT_THAT(anonymous->Put("/k", "v"), Not(IsOk()));
}

TEST_F(EtcdTlsTest, BadTlsOptionsAreClearErrors) {
  EtcdTlsOptions missing = tls_;
  missing.key = certs_->dir() + "/no-such.key";
  EXPECT_THAT(Connect(missing), StatusIs(absl::StatusCode::kNotFound, HasSubstr("no-such.key")));
  EtcdTlsOptions half = tls_;
  half.key.clear();
  EXPECT_THAT(Connect(half), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("both")));
  ASSERT_OK_AND_ASSIGN(std::string junk, certs_->WriteFile("junk.pem", "not a certificate"));
  EtcdTlsOptions not_pem = tls_;
  not_pem.cert = junk;
  EXPECT_THAT(Connect(not_pem), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not PEM")));
}

TEST_F(EtcdTlsTest, ServerRegistersAndClientDiscoversOverTls) {
  ServerOptions server_options;
  server_options.etcd_endpoints = {etcd_->endpoint()};
  server_options.cluster = "tls";
  server_options.num_servers = 1;
  server_options.etcd_tls = tls_;
  ASSERT_OK_AND_ASSIGN(auto server, Server::Start(server_options));

  ClientOptions client_options;
  client_options.etcd_endpoints = {etcd_->endpoint()};
  client_options.cluster = "tls";
  client_options.etcd_tls = tls_;
  client_options.discovery_timeout = absl::Seconds(20);
  ASSERT_OK_AND_ASSIGN(auto client, Client::Connect(client_options));
  ASSERT_OK(client->InitParam("w", Tensor::FromValues<float>({1}, {1})));
  ASSERT_OK(client->FinishInitParams());
  EXPECT_GE(client->worker_registrations(), 1) << "the trainer registered over TLS";

  // A client without etcd's client certificate finds nothing.
  client_options.etcd_tls = EtcdTlsOptions();
  client_options.discovery_timeout = absl::Seconds(2);
  EXPECT_THAT(Client::Connect(client_options), Not(IsOk()));
}

}  // namespace
}  // namespace pserver
