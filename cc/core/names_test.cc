#include "cc/core/names.h"

#include <string>

#include "absl/status/status.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;

TEST(ValidateNameTest, AcceptsNonEmptyUtf8WithoutNulUpToTheLimit) {
  EXPECT_OK(ValidateName("parameter", "w"));
  EXPECT_OK(ValidateName("parameter", "layer1/weights:0"));
  EXPECT_OK(ValidateName("table", "\xc3\xa9t\xc3\xa9"));         // été
  EXPECT_OK(ValidateName("table", "\xe6\x9d\x83\xe9\x87\x8d"));  // 权重
  EXPECT_OK(ValidateName("table", "\xf0\x9f\x98\x80"));          // U+1F600
  EXPECT_OK(ValidateName("table", "\xf4\x8f\xbf\xbf"));          // U+10FFFF
  EXPECT_OK(ValidateName("parameter", std::string(kMaxNameBytes, 'x')));
}

TEST(ValidateNameTest, EachRefusalSaysWhy) {
  EXPECT_THAT(ValidateName("parameter", ""),
              StatusIs(absl::StatusCode::kInvalidArgument, "parameter name \"\": name is empty"));
  EXPECT_THAT(ValidateName("table", std::string("a\0b", 3)),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "table name \"a\\000b\": name holds a NUL byte at offset 1"));
  EXPECT_THAT(ValidateName("parameter", "ab\xff"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter name \"ab\\377\": name is not valid UTF-8 (byte 0xff at "
                       "offset 2)"));
  // Error messages quote the first 64 bytes of a long name.
  EXPECT_THAT(ValidateName("parameter", std::string(kMaxNameBytes + 1, 'x')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       "parameter name \"" + std::string(64, 'x') +
                           "...\": name is 1025 bytes long, the limit is 1024 bytes"));
}

TEST(FirstInvalidUtf8Test, FindsTheFirstByteOfABadSequence) {
  EXPECT_EQ(FirstInvalidUtf8(""), 0u);
  EXPECT_EQ(FirstInvalidUtf8("abc"), 3u);
  EXPECT_EQ(FirstInvalidUtf8("a\x80"), 1u);             // a lone continuation byte
  EXPECT_EQ(FirstInvalidUtf8("a\xc0\xaf"), 1u);         // overlong "/"
  EXPECT_EQ(FirstInvalidUtf8("\xc1\xbf"), 0u);          // overlong
  EXPECT_EQ(FirstInvalidUtf8("\xe0\x80\xaf"), 0u);      // overlong, three bytes
  EXPECT_EQ(FirstInvalidUtf8("\xf0\x80\x80\xaf"), 0u);  // overlong, four bytes
  EXPECT_EQ(FirstInvalidUtf8("\xed\xa0\x80"), 0u);      // U+D800, a surrogate
  EXPECT_EQ(FirstInvalidUtf8("\xf4\x90\x80\x80"), 0u);  // above U+10FFFF
  EXPECT_EQ(FirstInvalidUtf8("\xf5\x80\x80\x80"), 0u);
  EXPECT_EQ(FirstInvalidUtf8("ok\xe2\x82"), 2u);     // truncated
  EXPECT_EQ(FirstInvalidUtf8("\xe2\x82\xac!"), 4u);  // U+20AC then "!"
}

}  // namespace
}  // namespace pserver
