#include "cc/testing/test_certs.h"

#include <filesystem>

#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

absl::Time Deadline() { return absl::Now() + absl::Seconds(60); }

absl::StatusOr<std::string> Openssl(const std::vector<std::string>& args) {
  auto openssl = FindProgram("openssl");
  if (!openssl.ok()) return openssl.status();
  return RunProgram(*openssl, args, Deadline());
}

TEST(TestCertsTest, IssuedCertificateVerifiesAgainstItsCaOnly) {
  ASSERT_OK_AND_ASSIGN(auto certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  ASSERT_OK_AND_ASSIGN(TestCa * other, certs->AddCa("other-ca"));
  CertRequest request;
  request.common_name = "pserver-0";
  request.dns_names = {"localhost"};
  request.ip_addresses = {"127.0.0.1"};
  request.uris = {"pserver://job-a/trainer"};
  ASSERT_OK_AND_ASSIGN(CertFiles files, ca->Issue("server", request));

  EXPECT_OK(Openssl({"verify", "-CAfile", ca->cert_path(), files.cert}));
  EXPECT_THAT(Openssl({"verify", "-CAfile", other->cert_path(), files.cert}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("unable to get local issuer")));
  ASSERT_OK_AND_ASSIGN(std::string text,
                       Openssl({"x509", "-in", files.cert, "-noout", "-subject", "-ext",
                                "subjectAltName"}));
  EXPECT_THAT(text, HasSubstr("CN = pserver-0"));
  EXPECT_THAT(text, HasSubstr("DNS:localhost"));
  EXPECT_THAT(text, HasSubstr("IP Address:127.0.0.1"));
  EXPECT_THAT(text, HasSubstr("URI:pserver://job-a/trainer"));
  // The key belongs to the certificate.
  ASSERT_OK_AND_ASSIGN(std::string cert_key, Openssl({"x509", "-in", files.cert, "-noout",
                                                      "-pubkey"}));
  ASSERT_OK_AND_ASSIGN(std::string key_pub, Openssl({"pkey", "-in", files.key, "-pubout"}));
  EXPECT_EQ(cert_key, key_pub);
}

TEST(TestCertsTest, ExpiredCertificateFailsVerification) {
  ASSERT_OK_AND_ASSIGN(auto certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  ASSERT_OK_AND_ASSIGN(CertFiles files, ca->Issue("old", CertRequest::Expired("trainer")));
  EXPECT_THAT(Openssl({"verify", "-CAfile", ca->cert_path(), files.cert}),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("expired")));
}

TEST(TestCertsTest, ReissuingAStemReplacesTheFiles) {
  ASSERT_OK_AND_ASSIGN(auto certs, TestCerts::Create());
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  CertRequest request;
  request.common_name = "a";
  ASSERT_OK_AND_ASSIGN(CertFiles first, ca->Issue("leaf", request));
  ASSERT_OK_AND_ASSIGN(std::string first_pem, Openssl({"x509", "-in", first.cert, "-noout",
                                                       "-serial"}));
  ASSERT_OK_AND_ASSIGN(CertFiles second, ca->Issue("leaf", request));
  EXPECT_EQ(first.cert, second.cert);
  ASSERT_OK_AND_ASSIGN(std::string second_pem, Openssl({"x509", "-in", second.cert, "-noout",
                                                        "-serial"}));
  EXPECT_NE(first_pem, second_pem);
}

TEST(TestCertsTest, BadNamesAreRefused) {
  ASSERT_OK_AND_ASSIGN(auto certs, TestCerts::Create());
  EXPECT_THAT(certs->AddCa("../x"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
  EXPECT_THAT(certs->AddCa("ca"), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
  EXPECT_THAT(ca->Issue("x", CertRequest{}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("common_name")));
  CertRequest request;
  request.common_name = "a";
  EXPECT_THAT(ca->Issue("a/b", request), StatusIs(absl::StatusCode::kInvalidArgument, ::testing::_));
}

TEST(TestCertsTest, DirectoryIsRemovedWithTheObject) {
  std::string dir;
  {
    ASSERT_OK_AND_ASSIGN(auto certs, TestCerts::Create());
    dir = certs->dir();
    ASSERT_OK_AND_ASSIGN(TestCa * ca, certs->AddCa("ca"));
    ASSERT_OK_AND_ASSIGN(std::string path, certs->WriteFile("junk.key", "not a key"));
    ASSERT_OK(ReplaceFile(ca->cert_path(), path));
    EXPECT_TRUE(std::filesystem::exists(path));
  }
  EXPECT_FALSE(std::filesystem::exists(dir));
}

// What test_cert_tool (and so the Python tests) does: a CA made by one
// object is found and used by another working in the same directory, which
// keeps the directory when it goes.
TEST(TestCertsTest, ACaInAKeptDirectoryIsFoundAgain) {
  ASSERT_OK_AND_ASSIGN(auto owner, TestCerts::Create());
  std::string cert_path;
  {
    ASSERT_OK_AND_ASSIGN(auto first, TestCerts::InDirectory(owner->dir()));
    ASSERT_OK_AND_ASSIGN(TestCa * ca, first->AddCa("ca"));
    cert_path = ca->cert_path();
  }
  EXPECT_TRUE(std::filesystem::exists(cert_path));
  ASSERT_OK_AND_ASSIGN(auto second, TestCerts::InDirectory(owner->dir()));
  ASSERT_OK_AND_ASSIGN(TestCa * found, second->FindCa("ca"));
  EXPECT_EQ(found->cert_path(), cert_path);
  CertRequest request;
  request.common_name = "trainer-0";
  ASSERT_OK_AND_ASSIGN(CertFiles files, found->Issue("trainer", request));
  EXPECT_OK(Openssl({"verify", "-CAfile", cert_path, files.cert}));
  EXPECT_THAT(second->FindCa("nope").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("no CA 'nope'")));
  EXPECT_THAT(TestCerts::InDirectory(owner->dir() + "/missing").status(),
              StatusIs(absl::StatusCode::kNotFound, HasSubstr("is not a directory")));
}

}  // namespace
}  // namespace pserver
