#include "cc/server/env_flags.h"

#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/match.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

ABSL_FLAG(int, env_test_port, 0, "test flag");
ABSL_FLAG(std::string, env_test_dir, "", "test flag");
ABSL_FLAG(bool, env_test_switch, false, "test flag");
ABSL_FLAG(double, env_test_seconds, 5, "test flag");

namespace pserver {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::UnorderedElementsAre;

bool OwnedByThisTest(const absl::CommandLineFlag& flag) {
  return absl::EndsWith(flag.Filename(), "env_flags_test.cc");
}

// A null-terminated environ-like array over `entries`.
class Environment {
 public:
  explicit Environment(std::vector<std::string> entries) : entries_(std::move(entries)) {
    for (std::string& entry : entries_) pointers_.push_back(entry.data());
    pointers_.push_back(nullptr);
  }
  char** get() { return pointers_.data(); }

 private:
  std::vector<std::string> entries_;
  std::vector<char*> pointers_;
};

class EnvFlagsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::SetFlag(&FLAGS_env_test_port, 0);
    absl::SetFlag(&FLAGS_env_test_dir, "");
    absl::SetFlag(&FLAGS_env_test_switch, false);
    absl::SetFlag(&FLAGS_env_test_seconds, 5);
  }
};

TEST(EnvironmentVariableForFlagTest, UpperCasesTheNameAfterThePrefix) {
  EXPECT_EQ(EnvironmentVariableForFlag("PSERVER_", "checkpoint_dir"), "PSERVER_CHECKPOINT_DIR");
  EXPECT_EQ(EnvironmentVariableForFlag("PSERVER_", "v"), "PSERVER_V");
}

TEST_F(EnvFlagsTest, SetsEachTypeOfFlagFromItsVariable) {
  Environment env({"PATH=/bin", "X_ENV_TEST_PORT=7000", "X_ENV_TEST_DIR=/var/lib/pserver",
                   "X_ENV_TEST_SWITCH=true", "X_ENV_TEST_SECONDS=0.5"});
  ASSERT_OK_AND_ASSIGN(EnvFlagsApplied applied,
                       ApplyFlagsFromEnvironment("X_", env.get(), OwnedByThisTest));
  EXPECT_THAT(applied.applied, UnorderedElementsAre("X_ENV_TEST_PORT", "X_ENV_TEST_DIR",
                                                    "X_ENV_TEST_SWITCH", "X_ENV_TEST_SECONDS"));
  EXPECT_TRUE(applied.unknown.empty());
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 7000);
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_dir), "/var/lib/pserver");
  EXPECT_TRUE(absl::GetFlag(FLAGS_env_test_switch));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_seconds), 0.5);
}

TEST_F(EnvFlagsTest, AValueMayContainEqualsSignsAndBeEmpty) {
  absl::SetFlag(&FLAGS_env_test_dir, "before");
  Environment env({"X_ENV_TEST_DIR=", "X_ENV_TEST_PORT=1"});
  ASSERT_OK(ApplyFlagsFromEnvironment("X_", env.get(), OwnedByThisTest).status());
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_dir), "");
  Environment with_equals({"X_ENV_TEST_DIR=a=b"});
  ASSERT_OK(ApplyFlagsFromEnvironment("X_", with_equals.get(), OwnedByThisTest).status());
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_dir), "a=b");
}

TEST_F(EnvFlagsTest, TheCommandLineParsedAfterwardsWins) {
  Environment env({"X_ENV_TEST_PORT=7000", "X_ENV_TEST_DIR=/from/env"});
  ASSERT_OK(ApplyFlagsFromEnvironment("X_", env.get(), OwnedByThisTest).status());
  std::vector<std::string> args = {"program", "--env_test_port=8000"};
  std::vector<char*> argv;
  for (std::string& arg : args) argv.push_back(arg.data());
  absl::ParseCommandLine(static_cast<int>(argv.size()), argv.data());
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 8000);
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_dir), "/from/env");
}

TEST_F(EnvFlagsTest, ABadValueNamesTheVariableAndTheFlag) {
  Environment env({"X_ENV_TEST_PORT=seven"});
  absl::StatusOr<EnvFlagsApplied> applied =
      ApplyFlagsFromEnvironment("X_", env.get(), OwnedByThisTest);
  ASSERT_EQ(applied.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(applied.status().message(), HasSubstr("X_ENV_TEST_PORT='seven'"));
  EXPECT_THAT(applied.status().message(), HasSubstr("--env_test_port"));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 0);
}

TEST_F(EnvFlagsTest, UnknownVariablesAndFlagsNotOwnedAreReportedNotApplied) {
  // --flagfile is abseil's, not this test's: X_FLAGFILE names no flag of ours.
  Environment env({"X_ENV_TEST_PROT=7000", "X_FLAGFILE=/etc/passwd", "OTHER_PORT=1",
                   "X_NOEQUALS"});
  ASSERT_OK_AND_ASSIGN(EnvFlagsApplied applied,
                       ApplyFlagsFromEnvironment("X_", env.get(), OwnedByThisTest));
  EXPECT_TRUE(applied.applied.empty());
  EXPECT_THAT(applied.unknown, ElementsAre("X_ENV_TEST_PROT", "X_FLAGFILE"));
  EXPECT_EQ(absl::GetFlag(FLAGS_env_test_port), 0);
}

TEST_F(EnvFlagsTest, NullEnvironmentAppliesNothing) {
  ASSERT_OK_AND_ASSIGN(EnvFlagsApplied applied,
                       ApplyFlagsFromEnvironment("X_", nullptr, OwnedByThisTest));
  EXPECT_TRUE(applied.applied.empty());
  EXPECT_TRUE(applied.unknown.empty());
}

}  // namespace
}  // namespace pserver
