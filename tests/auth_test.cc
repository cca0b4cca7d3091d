// Roles on a real server (docs/security.md): bearer tokens over gRPC and
// over the bulk channel, the job check, and what an unauthenticated caller
// gets. The role table and token file are tested in //cc/auth:authorizer_test.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/client/client.h"
#include "cc/core/tensor.h"
#include "cc/server/bulk_listener.h"
#include "cc/server/server.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kTrainer[] = "trainer-token-job-a-0001";
constexpr char kReader[] = "reader-token-job-a-00001";
constexpr char kAdmin[] = "admin-token-job-a-000001";
constexpr char kTrainerB[] = "trainer-token-job-b-0001";

std::string WriteTokens() {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = absl::StrCat(dir != nullptr ? dir : "/tmp", "/auth_test_tokens");
  std::ofstream out(path);
  out << "trainer job-a " << kTrainer << "\n"
      << "reader job-a " << kReader << "\n"
      << "admin job-a " << kAdmin << "\n"
      << "trainer job-b " << kTrainerB << "\n";
  return path;
}

class AuthTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    ServerOptions options;
    options.job = "job-a";
    options.auth_tokens_file = WriteTokens();
    ASSERT_OK_AND_ASSIGN(server_, Server::Start(options));
    ASSERT_OK_AND_ASSIGN(auto admin, Connect(kAdmin));
    ASSERT_OK(admin->InitParam("w", Tensor::FromValues<float>({2}, {1, 2})));
    ASSERT_OK(admin->FinishInitParams());
  }

  // A client with `token`; over the bulk channel when the parameter says so.
  absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& token) {
    ClientOptions options;
    options.servers = {server_->address()};
    options.token = token;
    options.bulk_channel = GetParam();
    options.timeout = absl::Seconds(20);
    return Client::Connect(options);
  }

  std::unique_ptr<Server> server_;
};

TEST_P(AuthTest, TrainerPushesAndPulls) {
  ASSERT_OK_AND_ASSIGN(auto trainer, Connect(kTrainer));
  ASSERT_OK(trainer->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})));
  ASSERT_OK_AND_ASSIGN(Tensor w, trainer->GetParam("w"));
  EXPECT_EQ(w.num_elements(), 2);
  if (GetParam()) {
    EXPECT_GE(server_->bulk_listener()->connections(), 1) << "the bulk channel was used";
  }
  // A trainer may not save.
  EXPECT_THAT(trainer->SaveCheckpoint(),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role trainer of job job-a may not Save")));
}

TEST_P(AuthTest, ReaderReadsButMayNotPush) {
  ASSERT_OK_AND_ASSIGN(auto reader, Connect(kReader));
  ASSERT_OK(reader->GetParam("w").status());
  EXPECT_THAT(reader->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role reader of job job-a may not SendGrads")));
  EXPECT_THAT(reader->InitParam("v", Tensor::FromValues<float>({1}, {1})),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role reader of job job-a may not InitParam")));
}

TEST_P(AuthTest, AdminMaySave) {
  ASSERT_OK_AND_ASSIGN(auto admin, Connect(kAdmin));
  // Past the role check: this server has no checkpoint directory.
  EXPECT_THAT(admin->SaveCheckpoint(), StatusIs(absl::StatusCode::kFailedPrecondition,
                                                HasSubstr("checkpoint")));
}

TEST_P(AuthTest, OnlyAnAdminGetsAStateChecksum) {
  v1::GetStatsRequest request;
  request.set_state_checksum(true);
  ASSERT_OK_AND_ASSIGN(auto reader, Connect(kReader));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> plain, reader->GetStats());
  ASSERT_EQ(plain.size(), 1u);
  EXPECT_FALSE(plain[0].has_state_checksum());
  EXPECT_THAT(reader->GetStats(request),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("GetStats with state_checksum needs the role that may Save: "
                                 "role reader of job job-a may not Save")));
  ASSERT_OK_AND_ASSIGN(auto admin, Connect(kAdmin));
  ASSERT_OK_AND_ASSIGN(std::vector<v1::ServerStats> stats, admin->GetStats(request));
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_TRUE(stats[0].has_state_checksum());
}

TEST_P(AuthTest, AnotherJobIsRefused) {
  ASSERT_OK_AND_ASSIGN(auto other, Connect(kTrainerB));
  EXPECT_THAT(other->GetParam("w"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role trainer of job job-b may not GetParams on a server of "
                                 "job job-a")));
}

TEST_P(AuthTest, NoOrUnknownTokenIsUnauthenticated) {
  ASSERT_OK_AND_ASSIGN(auto anonymous, Connect(""));
  EXPECT_THAT(anonymous->GetParam("w"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("requires a bearer token")));
  ASSERT_OK_AND_ASSIGN(auto wrong, Connect("not-a-token-of-this-server"));
  EXPECT_THAT(wrong->SendGrad("w", Tensor::FromValues<float>({2}, {1, 1})),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("bearer token")));
}

INSTANTIATE_TEST_SUITE_P(GrpcAndBulkChannel, AuthTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return info.param ? "BulkChannel" : "GrpcOnly";
                         });

TEST(AuthOptionsTest, ServerRefusesBadAuthFlags) {
  ServerOptions options;
  options.auth_tokens_file = WriteTokens();
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--job")));
  options.job = "job-a";
  options.auth_tokens_file = "/nonexistent/tokens";
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("/nonexistent/tokens")));
  options.auth_tokens_file = "";
  options.auth_cert_rule = "cn:<who>";
  EXPECT_THAT(Server::Start(options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--auth_cert_rule")));
}

}  // namespace
}  // namespace pserver
