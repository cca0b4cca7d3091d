// The C ABI's TLS setters: a server and a client started through them talk
// mutual TLS; bad files are refused at the setter, naming the file; a client
// without TLS is refused by a TLS server with a message that says so; the
// bulk AEAD setters reach the server and the client.
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/capi/pserver.h"
#include "cc/capi/pserver_cluster.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;

struct Status {
  Status() : st(pserver_status_new()) {}
  ~Status() { pserver_status_delete(st); }
  int32_t code() const { return pserver_status_code(st); }
  std::string message() const { return pserver_status_message(st); }
  pserver_status_t* st;
};

class CapiTlsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(ca_, certs_->AddCa("ca"));
    CertRequest server;
    server.common_name = "pserver-0";
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(server_files_, ca_->Issue("server", server));
    CertRequest trainer;
    trainer.common_name = "trainer";
    ASSERT_OK_AND_ASSIGN(client_files_, ca_->Issue("trainer", trainer));

    pserver_server_options_t* options = pserver_server_options_new();
    Status status;
    pserver_server_options_set_tls(options, server_files_.cert.c_str(),
                                   server_files_.key.c_str(), ca_->cert_path().c_str(), 1,
                                   status.st);
    ASSERT_EQ(status.code(), PSERVER_OK) << status.message();
    server_ = pserver_server_new(options, status.st);
    pserver_server_options_delete(options);
    ASSERT_EQ(status.code(), PSERVER_OK) << status.message();
  }
  void TearDown() override { pserver_server_delete(server_); }

  // A client of the server with `tls` applied to its options; the status of
  // a stats call through it.
  std::string StatsThrough(bool tls, Status& status) {
    pserver_client_options_t* options = pserver_client_options_new();
    pserver_client_options_add_server(options, pserver_server_address(server_));
    pserver_client_options_set_timeout_ms(options, 3000);
    if (tls) {
      pserver_client_options_set_tls(options, client_files_.cert.c_str(),
                                     client_files_.key.c_str(), ca_->cert_path().c_str(),
                                     status.st);
      EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
    }
    pserver_client_t* client = pserver_client_new(options, status.st);
    pserver_client_options_delete(options);
    EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
    pserver_server_stats_t stats[1];
    pserver_client_stats(client, stats, 1, sizeof(stats[0]), status.st);
    pserver_client_delete(client);
    return status.message();
  }

  std::unique_ptr<TestCerts> certs_;
  TestCa* ca_ = nullptr;
  CertFiles server_files_;
  CertFiles client_files_;
  pserver_server_t* server_ = nullptr;
};

TEST_F(CapiTlsTest, TlsClientIsServed) {
  Status status;
  StatsThrough(/*tls=*/true, status);
  EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
}

TEST_F(CapiTlsTest, PlaintextClientIsToldTheServerMayRequireTls) {
  Status status;
  EXPECT_THAT(StatsThrough(/*tls=*/false, status), HasSubstr("requires TLS"));
  EXPECT_EQ(status.code(), PSERVER_DEADLINE_EXCEEDED);
}

TEST_F(CapiTlsTest, SettersRefuseBadFilesNamingThem) {
  pserver_client_options_t* options = pserver_client_options_new();
  Status status;
  const std::string missing = certs_->dir() + "/missing.key";
  pserver_client_options_set_tls(options, client_files_.cert.c_str(), missing.c_str(),
                                 ca_->cert_path().c_str(), status.st);
  EXPECT_EQ(status.code(), PSERVER_NOT_FOUND);
  EXPECT_THAT(status.message(), AllOf(HasSubstr("tls_key"), HasSubstr(missing)));
  pserver_client_options_set_tls(options, client_files_.cert.c_str(), nullptr, nullptr,
                                 status.st);
  EXPECT_EQ(status.code(), PSERVER_INVALID_ARGUMENT);
  EXPECT_THAT(status.message(), HasSubstr("missing: --tls_key, --tls_ca"));
  // All three empty: TLS off, accepted.
  pserver_client_options_set_tls(options, "", nullptr, "", status.st);
  EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
  pserver_client_options_delete(options);

  pserver_server_options_t* server_options = pserver_server_options_new();
  pserver_server_options_set_tls(server_options, server_files_.cert.c_str(),
                                 server_files_.key.c_str(), ca_->cert_path().c_str(), -1,
                                 status.st);
  EXPECT_EQ(status.code(), PSERVER_INVALID_ARGUMENT);
  EXPECT_THAT(status.message(), HasSubstr("reload_seconds"));
  pserver_server_options_delete(server_options);
}

// pserver_server_options_set_tls_bulk_aead x
// pserver_client_options_set_tls_bulk_aead (both on by default): the data
// comes back exact in every cell, and the server counts a bulk connection
// on the AEAD layer (pserver_server_stats_t.bulk_aead_connections) only when
// both ends leave it on. (This CPU has AES-NI: the C++ tls_test checks the
// case of one that has not.)
TEST_F(CapiTlsTest, BulkAeadSettersReachBothEnds) {
  for (const int server_on : {-1, 0, 1}) {  // -1: the default (on)
    for (const int client_on : {-1, 0, 1}) {
      SCOPED_TRACE(absl::StrCat("server ", server_on, " client ", client_on));
      pserver_server_options_t* server_options = pserver_server_options_new();
      Status status;
      pserver_server_options_set_tls(server_options, server_files_.cert.c_str(),
                                     server_files_.key.c_str(), ca_->cert_path().c_str(), 1,
                                     status.st);
      if (server_on >= 0) pserver_server_options_set_tls_bulk_aead(server_options, server_on);
      pserver_server_t* server = pserver_server_new(server_options, status.st);
      pserver_server_options_delete(server_options);
      ASSERT_EQ(status.code(), PSERVER_OK) << status.message();

      pserver_client_options_t* options = pserver_client_options_new();
      pserver_client_options_add_server(options, pserver_server_address(server));
      pserver_client_options_set_timeout_ms(options, 60000);
      if (client_on >= 0) pserver_client_options_set_tls_bulk_aead(options, client_on);
      pserver_client_options_set_tls(options, client_files_.cert.c_str(),
                                     client_files_.key.c_str(), ca_->cert_path().c_str(),
                                     status.st);  // after: the setting is kept
      pserver_client_t* client = pserver_client_new(options, status.st);
      pserver_client_options_delete(options);
      ASSERT_EQ(status.code(), PSERVER_OK) << status.message();

      std::vector<float> values(1 << 18);  // 1 MiB
      for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i % 1000);
      const int64_t shape[1] = {static_cast<int64_t>(values.size())};
      pserver_param_config_t* config = pserver_param_config_new();
      pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, values.data(),
                                values.size() * sizeof(float), config, status.st);
      pserver_param_config_delete(config);
      EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
      pserver_client_finish_init(client, status.st);
      EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
      std::vector<float> got(values.size(), -1.0f);
      pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, got.data(),
                               got.size() * sizeof(float), status.st);
      EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
      EXPECT_EQ(got, values);
      pserver_server_stats_t stats[1] = {};
      EXPECT_EQ(pserver_client_stats(client, stats, 1, sizeof(stats[0]), status.st), 1u);
      EXPECT_EQ(status.code(), PSERVER_OK) << status.message();
      if (server_on != 0 && client_on != 0) {
        EXPECT_GE(stats[0].bulk_aead_connections, 1u);
      } else {
        EXPECT_EQ(stats[0].bulk_aead_connections, 0u);
      }
      pserver_client_delete(client);
      pserver_server_delete(server);
    }
  }
}

}  // namespace
}  // namespace pserver
