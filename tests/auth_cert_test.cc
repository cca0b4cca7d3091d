// Roles from client certificates (docs/security.md): the service's gRPC face
// behind mutual TLS, with --auth_cert_rule=cn:<role>.<job>; the role and job
// are read from the verified certificate (grpc::AuthContext). Certificates
// are made with openssl at test time (cc/testing/test_certs.h).
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/auth/authorizer.h"
#include "cc/core/parameter_store.h"
#include "cc/core/tables.h"
#include "cc/server/dispatcher.h"
#include "cc/server/service.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.grpc.pb.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

class AuthCertTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_OK_AND_ASSIGN(certs_, TestCerts::Create());
    ASSERT_OK_AND_ASSIGN(ca_, certs_->AddCa("ca"));
    CertRequest server;
    server.common_name = "pserver";
    server.ip_addresses = {"127.0.0.1"};
    ASSERT_OK_AND_ASSIGN(CertFiles server_files, ca_->Issue("server", server));

    AuthOptions auth;
    auth.job = "job-a";
    auth.cert_rule = "cn:<role>.<job>";
    ASSERT_OK_AND_ASSIGN(auth_, Authorizer::Create(auth));
    dispatcher_ = std::make_unique<Dispatcher>(&store_, &tables_, 0);
    service_ = std::make_unique<ParameterServerService>(dispatcher_.get(),
                                                        ServiceSecurity{auth_.get(), ""});
    grpc::SslServerCredentialsOptions ssl(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_root_certs = Read(ca_->cert_path());
    ssl.pem_key_cert_pairs.push_back({Read(server_files.key), Read(server_files.cert)});
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::SslServerCredentials(ssl), &port_);
    service_->RegisterWith(&builder);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }

  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  // A stub presenting a certificate with common name `cn`.
  std::unique_ptr<v1::ParameterServer::Stub> StubFor(const std::string& cn) {
    CertRequest request;
    request.common_name = cn;
    absl::StatusOr<CertFiles> files = ca_->Issue("client-" + std::to_string(stubs_++), request);
    EXPECT_OK(files.status());
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = Read(ca_->cert_path());
    ssl.pem_cert_chain = Read(files->cert);
    ssl.pem_private_key = Read(files->key);
    return v1::ParameterServer::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(port_), grpc::SslCredentials(ssl)));
  }

  grpc::Status GetStats(v1::ParameterServer::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    return stub.GetStats(&context, request, &response);
  }
  grpc::Status Save(v1::ParameterServer::Stub& stub) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(20)));
    v1::SaveRequest request;
    v1::SaveResponse response;
    return stub.Save(&context, request, &response);
  }

  std::unique_ptr<TestCerts> certs_;
  TestCa* ca_ = nullptr;
  int stubs_ = 0;
  ParameterStore store_;
  Tables tables_;
  std::unique_ptr<Authorizer> auth_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::unique_ptr<ParameterServerService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

TEST_F(AuthCertTest, CertificateNamesTheRole) {
  auto reader = StubFor("reader.job-a");
  EXPECT_TRUE(GetStats(*reader).ok()) << GetStats(*reader).error_message();
  const grpc::Status save = Save(*reader);
  EXPECT_EQ(save.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(save.error_message(), HasSubstr("role reader of job job-a may not Save"));

  auto admin = StubFor("admin.job-a");
  // Past the role check: the dispatcher has no checkpoints.
  EXPECT_NE(Save(*admin).error_code(), grpc::StatusCode::PERMISSION_DENIED);
}

TEST_F(AuthCertTest, OtherJobOrUnmatchedNameIsRefused) {
  auto other = StubFor("trainer.job-b");
  grpc::Status status = GetStats(*other);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("of job job-b may not GetStats on a server of job job-a"));
  auto unmatched = StubFor("someone");
  status = GetStats(*unmatched);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::PERMISSION_DENIED);
  EXPECT_THAT(status.error_message(), HasSubstr("(someone) do not match cn:<role>.<job>"));
}

}  // namespace
}  // namespace pserver
