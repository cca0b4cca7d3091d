#include "cc/auth/authorizer.h"

#include <cstdio>
#include <fstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

constexpr char kTrainerToken[] = "trainer-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";
constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kOtherJobToken[] = "other-job-token-0123456789";

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return absl::StrCat(dir != nullptr ? dir : "/tmp", "/", name);
}

// Writes `text` to a new file renamed over `path` (a new inode).
void WriteFile(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".new";
  {
    std::ofstream out(tmp);
    out << text;
  }
  ASSERT_EQ(std::rename(tmp.c_str(), path.c_str()), 0);
}

std::string TokensText() {
  return absl::StrCat("# role job token\n", "trainer job-a ", kTrainerToken, "\n\n",
                      "reader job-a ", kReaderToken, "\n", "admin job-a ", kAdminToken, "\n",
                      "trainer job-b ", kOtherJobToken, "\n");
}

Credentials Token(const std::string& token) {
  Credentials c;
  c.bearer_token = token;
  return c;
}

TEST(RoleTest, EveryMethodOfTheServiceHasARole) {
  // Linking service.pb registers the service's descriptor.
  ASSERT_NE(v1::OpenChannelRequest::descriptor(), nullptr);
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          "pserver.v1.ParameterServer");
  ASSERT_NE(service, nullptr);
  for (int i = 0; i < service->method_count(); ++i) {
    EXPECT_OK(RequiredRole(service->method(i)->name()).status()) << service->method(i)->name();
  }
  EXPECT_EQ(MethodsWithRoles().size(), static_cast<size_t>(service->method_count()));
  EXPECT_THAT(RequiredRole("NoSuchMethod"), StatusIs(absl::StatusCode::kNotFound,
                                                     HasSubstr("NoSuchMethod")));
}

TEST(RoleTest, RolesAreOrdered) {
  EXPECT_EQ(*RequiredRole("GetParams"), Role::kReader);
  EXPECT_EQ(*RequiredRole("SendGrads"), Role::kTrainer);
  EXPECT_EQ(*RequiredRole("Save"), Role::kAdmin);
  EXPECT_TRUE(RoleAllows(Role::kAdmin, Role::kTrainer));
  EXPECT_TRUE(RoleAllows(Role::kTrainer, Role::kReader));
  EXPECT_FALSE(RoleAllows(Role::kReader, Role::kTrainer));
  EXPECT_FALSE(RoleAllows(Role::kTrainer, Role::kAdmin));
  EXPECT_THAT(ParseRole("root"), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("root")));
}

TEST(TokenFileTest, RefusesBadLines) {
  EXPECT_THAT(ParseTokens("trainer job-a\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 1")));
  EXPECT_THAT(ParseTokens("\nroot job-a 0123456789abcdef0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: unknown role")));
  EXPECT_THAT(ParseTokens("reader job-a short\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("characters")));
  EXPECT_THAT(ParseTokens("reader a 0123456789abcdef0\nadmin b 0123456789abcdef0\n"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("line 2: the token is given twice")));
}

TEST(TokenFileTest, ConstantTimeEquals) {
  EXPECT_TRUE(ConstantTimeEquals("abc", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("ab", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abcd", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("", "abc"));
  EXPECT_FALSE(ConstantTimeEquals("abc", ""));
  EXPECT_TRUE(ConstantTimeEquals("", ""));
}

TEST(TokenFileTest, ReReadsTheFileWhenItChanges) {
  const std::string path = TempPath("tokens_reread");
  WriteFile(path, TokensText());
  absl::Time now = absl::FromUnixSeconds(1000);  // a clock of the test's own
  ASSERT_OK_AND_ASSIGN(auto file, TokenFile::Load(path, [&now] { return now; }));
  ASSERT_OK_AND_ASSIGN(Principal who, file->Find(kTrainerToken));
  EXPECT_EQ(who.role, Role::kTrainer);
  EXPECT_EQ(who.job, "job-a");
  EXPECT_EQ(file->reads(), 1);

  WriteFile(path, "admin job-a new-admin-token-0123456789\n");
  // Within the interval since the last look the file is not looked at: the
  // tokens read before stay in force, however many calls come.
  now += kTokenFileCheckInterval - absl::Nanoseconds(1);
  for (int i = 0; i < 1000; ++i) ASSERT_OK(file->Find(kTrainerToken).status());
  EXPECT_EQ(file->checks(), 0);
  EXPECT_EQ(file->reads(), 1);

  // Once it has passed, the next call looks, once, and reads the new file.
  now += absl::Nanoseconds(1);
  EXPECT_THAT(file->Find(kTrainerToken), StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("not one")));
  ASSERT_OK_AND_ASSIGN(who, file->Find("new-admin-token-0123456789"));
  EXPECT_EQ(who.role, Role::kAdmin);
  EXPECT_EQ(file->reads(), 2);
  EXPECT_EQ(file->checks(), 1);

  // A broken file keeps the tokens in force.
  WriteFile(path, "this is not a tokens file\n");
  now += kTokenFileCheckInterval;
  EXPECT_OK(file->Find("new-admin-token-0123456789").status());
  EXPECT_EQ(file->reads(), 2);
  EXPECT_EQ(file->checks(), 2);
}

TEST(TokenFileTest, MissingFileIsNotFound) {
  EXPECT_THAT(TokenFile::Load(TempPath("no_such_tokens")),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no_such_tokens")));
}

TEST(CertRuleTest, ParsesAndMatches) {
  ASSERT_OK_AND_ASSIGN(CertRule cn, CertRule::Parse("cn:<role>.<job>"));
  ASSERT_OK_AND_ASSIGN(Principal who, cn.Match({"trainer.job-a", {}}));
  EXPECT_EQ(who.role, Role::kTrainer);
  EXPECT_EQ(who.job, "job-a");
  EXPECT_THAT(cn.Match({"trainer.job-a.extra", {}}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("trainer.job-a.extra")));
  EXPECT_THAT(cn.Match({"root.job-a", {}}), StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("cn:<role>.<job>")));

  ASSERT_OK_AND_ASSIGN(CertRule san, CertRule::Parse("san:spiffe://<job>/<role>"));
  ASSERT_OK_AND_ASSIGN(who, san.Match({"ignored", {"DNS:host", "spiffe://job-b/reader"}}));
  EXPECT_EQ(who.role, Role::kReader);
  EXPECT_EQ(who.job, "job-b");
  EXPECT_THAT(san.Match({"reader.job-b", {}}),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("none")));
}

TEST(CertRuleTest, RefusesBadRules) {
  for (const char* rule : {"<role>.<job>", "cn:<role>", "cn:<role><job>", "cn:<role>x<job>",
                           "san:<who>/<role>", "cn:<role>.<job>.<job>"}) {
    EXPECT_THAT(CertRule::Parse(rule), StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr(rule)))
        << rule;
  }
}

class AuthorizerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    AuthOptions options;
    options.job = "job-a";
    options.tokens_file = TempPath("tokens_authorizer");
    options.cert_rule = "cn:<role>.<job>";
    WriteFile(options.tokens_file, TokensText());
    ASSERT_OK_AND_ASSIGN(auth_, Authorizer::Create(options));
  }
  std::unique_ptr<Authorizer> auth_;
};

TEST_F(AuthorizerTest, RolesAllowTheirMethods) {
  EXPECT_OK(auth_->Check(Token(kReaderToken), "GetParams"));
  EXPECT_OK(auth_->Check(Token(kTrainerToken), "SendGrads"));
  EXPECT_OK(auth_->Check(Token(kTrainerToken), "GetParams"));
  EXPECT_OK(auth_->Check(Token(kAdminToken), "Save"));
  EXPECT_OK(auth_->Check(Token(kAdminToken), "PushPull"));
}

TEST_F(AuthorizerTest, RefusalsNameRoleJobAndMethod) {
  EXPECT_THAT(auth_->Check(Token(kReaderToken), "SendGrads"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role reader of job job-a may not SendGrads")));
  EXPECT_THAT(auth_->Check(Token(kTrainerToken), "Save"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role trainer of job job-a may not Save")));
  EXPECT_THAT(auth_->Check(Token(kOtherJobToken), "GetParams"),
              StatusIs(absl::StatusCode::kPermissionDenied,
                       HasSubstr("role trainer of job job-b may not GetParams on a server of job job-a")));
  EXPECT_THAT(auth_->Check(Credentials(), "GetParams"),
              StatusIs(absl::StatusCode::kUnauthenticated, HasSubstr("bearer token or a client certificate")));
  EXPECT_THAT(auth_->Check(Token("wrong-token-0123456789"), "GetParams"),
              StatusCodeIs(absl::StatusCode::kUnauthenticated));
  EXPECT_THAT(auth_->Check(Token(kAdminToken), "NoSuchMethod"),
              StatusCodeIs(absl::StatusCode::kNotFound));
}

TEST_F(AuthorizerTest, CertificateNamesTheRole) {
  Credentials cert;
  cert.cert = CertNames{"reader.job-a", {}};
  EXPECT_OK(auth_->Check(cert, "GetParams"));
  EXPECT_THAT(auth_->Check(cert, "PushPull"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("role reader of job job-a may not PushPull")));
  cert.cert = CertNames{"trainer.job-b", {}};
  EXPECT_THAT(auth_->Check(cert, "GetParams"),
              StatusIs(absl::StatusCode::kPermissionDenied, HasSubstr("of job job-b")));
}

TEST(AuthorizerOptionsTest, OffAllowsEverythingAndOnNeedsAJob) {
  ASSERT_OK_AND_ASSIGN(auto off, Authorizer::Create(AuthOptions()));
  EXPECT_FALSE(off->enabled());
  EXPECT_OK(off->Check(Credentials(), "Save"));
  AuthOptions no_job;
  no_job.cert_rule = "cn:<role>.<job>";
  EXPECT_THAT(Authorizer::Create(no_job),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--job")));
}

}  // namespace
}  // namespace pserver
