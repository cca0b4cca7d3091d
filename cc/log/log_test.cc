#include "cc/log/log.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver::log {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

// A logger writing into `lines` with a clock the test steps.
struct Captured {
  std::vector<std::string> lines;
  absl::Time now = absl::FromUnixMicros(1795000000123456);  // 2026-11-18T11:06:40.123456Z
  Logger logger;

  explicit Captured(LogOptions options = {})
      : logger([&] {
          options.sink = [this](absl::string_view line) { lines.emplace_back(line); };
          options.now = [this] { return now; };
          return options;
        }()) {}
};

TEST(LoggerTest, TextLinesHaveTimeLevelAndServer) {
  Captured c;
  c.logger.Log(Level::kInfo, "3", "claimed index 3 of 4");
  c.logger.Log(Level::kWarning, "(no index yet)", "all 4 indices are taken");
  c.logger.Log(Level::kWarning, "", "accept failed");
  c.logger.Log(Level::kError, "0", "final checkpoint failed: x");
  EXPECT_THAT(c.lines, ElementsAre(
                           "2026-11-18T11:06:40.123456Z INFO pserver 3: claimed index 3 of 4\n",
                           "2026-11-18T11:06:40.123456Z WARNING pserver (no index yet): all 4 "
                           "indices are taken\n",
                           "2026-11-18T11:06:40.123456Z WARNING pserver: accept failed\n",
                           "2026-11-18T11:06:40.123456Z ERROR pserver 0: final checkpoint failed: x\n"));
}

TEST(LoggerTest, JsonIsOneEscapedObjectPerLine) {
  LogOptions options;
  options.format = Format::kJson;
  Captured c(options);
  c.logger.Log(Level::kInfo, "1", "a \"quoted\" path\\x\nand\ta \x01 byte");
  EXPECT_THAT(c.lines,
              ElementsAre("{\"time\":\"2026-11-18T11:06:40.123456Z\",\"level\":\"INFO\","
                          "\"server\":\"1\",\"message\":\"a \\\"quoted\\\" path\\\\x\\nand\\ta "
                          "\\u0001 byte\"}\n"));
}

TEST(LoggerTest, DebugNeedsVerbosity) {
  Captured quiet;
  quiet.logger.Log(Level::kDebug, "0", "detail");
  EXPECT_TRUE(quiet.lines.empty());
  EXPECT_FALSE(quiet.logger.Enabled(Level::kDebug));
  LogOptions options;
  options.verbosity = 1;
  Captured verbose(options);
  verbose.logger.Log(Level::kDebug, "0", "detail");
  EXPECT_THAT(verbose.lines, ElementsAre(HasSubstr(" DEBUG pserver 0: detail")));
}

TEST(LoggerTest, RepeatsAreLimitedAndCounted) {
  LogOptions options;
  options.repeat_burst = 2;
  options.repeat_window = absl::Seconds(10);
  Captured c(options);
  for (int i = 0; i < 5; ++i) c.logger.Log(Level::kWarning, "0", "accept: too many open files");
  c.logger.Log(Level::kWarning, "0", "another message");  // not a repeat of the first
  EXPECT_EQ(c.lines.size(), 3u);
  c.now += absl::Seconds(10);
  c.logger.Log(Level::kWarning, "0", "accept: too many open files");
  ASSERT_EQ(c.lines.size(), 4u);
  EXPECT_THAT(c.lines[3], HasSubstr("accept: too many open files [suppressed 3 repeats]\n"));
  // The count starts over with the new window.
  c.logger.Log(Level::kWarning, "0", "accept: too many open files");
  EXPECT_THAT(c.lines[4], ::testing::EndsWith("accept: too many open files\n"));
}

TEST(LoggerTest, JsonCountsSuppressedRepeats) {
  LogOptions options;
  options.format = Format::kJson;
  options.repeat_burst = 1;
  Captured c(options);
  c.logger.Log(Level::kInfo, "0", "m");
  c.logger.Log(Level::kInfo, "0", "m");
  c.now += options.repeat_window;
  c.logger.Log(Level::kInfo, "0", "m");
  ASSERT_EQ(c.lines.size(), 2u);
  EXPECT_THAT(c.lines[1], HasSubstr("\"message\":\"m\",\"suppressed\":1}\n"));
}

TEST(LoggerTest, ManyDistinctMessagesAreAllWritten) {
  Captured c;
  const size_t n = Logger::kMaxTracked * 3;
  for (size_t i = 0; i < n; ++i) c.logger.Log(Level::kInfo, "0", absl::StrCat("message ", i));
  EXPECT_EQ(c.lines.size(), n);
}

TEST(LoggerTest, ParseFormat) {
  ASSERT_OK_AND_ASSIGN(Format json, ParseFormat("json"));
  EXPECT_EQ(json, Format::kJson);
  ASSERT_OK_AND_ASSIGN(Format text, ParseFormat("text"));
  EXPECT_EQ(text, Format::kText);
  EXPECT_THAT(ParseFormat("xml"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("'text' or 'json'")));
}

}  // namespace
}  // namespace pserver::log
