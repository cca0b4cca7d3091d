#include "cc/server/peer_channel.h"

#include <cstdlib>
#include <fstream>
#include <string>

#include "absl/status/status.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

std::string WriteFile(const std::string& name, const std::string& text) {
  const char* dir = std::getenv("TEST_TMPDIR");
  const std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

TEST(ReadPeerTokenTest, ReadsTheTokenWithoutSurroundingWhitespace) {
  const std::string path = WriteFile("token_ok", "  0123456789abcdef0123\n");
  absl::StatusOr<std::string> token = ReadPeerToken(path);
  ASSERT_TRUE(token.ok()) << token.status();
  EXPECT_EQ(*token, "0123456789abcdef0123");
}

TEST(ReadPeerTokenTest, AMissingFileIsNamed) {
  absl::StatusOr<std::string> token = ReadPeerToken("/nonexistent/peer_token");
  EXPECT_EQ(token.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(token.status().message(), HasSubstr("--peer_token_file /nonexistent/peer_token"));
}

TEST(ReadPeerTokenTest, AShortTokenOrOneWithSpacesIsRefusedNamingTheFile) {
  for (const std::string& text : {std::string("short"), std::string(""),
                                  std::string("0123456789 abcdef0123"),
                                  std::string("0123456789\x01" "abcdef0123")}) {
    const std::string path = WriteFile("token_bad", text);
    absl::StatusOr<std::string> token = ReadPeerToken(path);
    EXPECT_EQ(token.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_THAT(token.status().message(), HasSubstr(path)) << text;
  }
}

}  // namespace
}  // namespace pserver
