// The table frames' codec: round trips, and every malformed frame refused
// with an error naming what is wrong.
#include "cc/rpc/table_frame.h"

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_join.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using ::testing::HasSubstr;

constexpr size_t kMaxName = 1024;

// The payload of `frame` as one 8-byte aligned buffer (as a receive buffer
// is), `shift` bytes in.
struct Payload {
  std::vector<uint64_t> storage;
  absl::string_view bytes;
};
Payload Encode(const TableFrame& frame, size_t shift = 0) {
  std::string head;
  const std::string joined = absl::StrJoin(EncodeTableFrame(frame, &head), "");
  Payload p;
  p.storage.assign((joined.size() + shift) / 8 + 1, 0);
  char* at = reinterpret_cast<char*>(p.storage.data()) + shift;
  std::memcpy(at, joined.data(), joined.size());
  p.bytes = absl::string_view(at, joined.size());
  return p;
}

// Field `at` of the header of `bytes` set to `value`.
template <typename T>
std::string With(absl::string_view bytes, size_t at, T value) {
  std::string out(bytes);
  std::memcpy(out.data() + at, &value, sizeof(T));
  return out;
}

TEST(TableFrameTest, APushRoundTripsWithItsKeysReadInPlace) {
  const std::vector<uint64_t> keys = {7, 1ull << 63, 0, 7};
  const std::vector<float> values = {1, 2, 3, 4, 5, 6, 7, 8};
  TableFrame frame;
  frame.table = "emb";
  frame.worker = "w3";
  frame.clock = -2;
  frame.client_id = 0xabcdef;
  frame.sequence = 42;
  frame.value_type = 5;
  frame.keys = keys;
  frame.values = absl::string_view(reinterpret_cast<const char*>(values.data()), 32);
  std::string head;
  auto parts = EncodeTableFrame(frame, &head);
  ASSERT_EQ(parts.size(), 3u);
  // The keys and values are the caller's memory, not copies.
  EXPECT_EQ(parts[1].data(), reinterpret_cast<const char*>(keys.data()));
  EXPECT_EQ(parts[2].data(), frame.values.data());
  EXPECT_EQ(head.size() % 8, 0u);

  Payload p = Encode(frame);
  std::vector<uint64_t> scratch;
  auto decoded = DecodeTableFrame(p.bytes, /*push=*/true, kMaxName, &scratch);
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_EQ(decoded->table, "emb");
  EXPECT_EQ(decoded->worker, "w3");
  EXPECT_EQ(decoded->clock, -2);
  EXPECT_EQ(decoded->client_id, 0xabcdefu);
  EXPECT_EQ(decoded->sequence, 42u);
  EXPECT_EQ(decoded->value_type, 5);
  EXPECT_THAT(decoded->keys, ElementsAreArray(keys));
  EXPECT_EQ(decoded->values, frame.values);
  // Read in place: the keys view the payload.
  EXPECT_TRUE(scratch.empty());
  EXPECT_GE(reinterpret_cast<const char*>(decoded->keys.data()), p.bytes.data());
  EXPECT_LT(reinterpret_cast<const char*>(decoded->keys.data()), p.bytes.data() + p.bytes.size());
}

TEST(TableFrameTest, UnalignedKeysAreCopied) {
  const std::vector<uint64_t> keys = {3, 4, 5};
  TableFrame frame;
  frame.table = "t";
  frame.keys = keys;
  Payload p = Encode(frame, /*shift=*/3);
  std::vector<uint64_t> scratch;
  auto decoded = DecodeTableFrame(p.bytes, /*push=*/false, kMaxName, &scratch);
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_THAT(decoded->keys, ElementsAre(3, 4, 5));
  EXPECT_EQ(decoded->keys.data(), scratch.data());
  EXPECT_TRUE(decoded->values.empty());
}

TEST(TableFrameTest, AnEmptyPullRoundTrips) {
  TableFrame frame;
  frame.table = "t";
  Payload p = Encode(frame);
  std::vector<uint64_t> scratch;
  auto decoded = DecodeTableFrame(p.bytes, /*push=*/false, kMaxName, &scratch);
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_TRUE(decoded->keys.empty());
}

TableFrame APush(const std::vector<uint64_t>& keys, const std::string& values) {
  TableFrame frame;
  frame.table = "emb";
  frame.keys = keys;
  frame.values = values;
  frame.client_id = 1;
  frame.sequence = 1;
  return frame;
}

TEST(TableFrameTest, EveryTruncationIsRefused) {
  const std::vector<uint64_t> keys = {1, 2};
  const std::string values(16, 'v');
  Payload p = Encode(APush(keys, values));
  std::vector<uint64_t> scratch;
  for (size_t n = 0; n < p.bytes.size(); ++n) {
    EXPECT_THAT(DecodeTableFrame(p.bytes.substr(0, n), true, kMaxName, &scratch).status(),
                StatusIs(absl::StatusCode::kInvalidArgument,
                         n < kTableFrameHeaderBytes ? HasSubstr("shorter than its 56-byte header")
                                                    : HasSubstr("does not match its header")))
        << n;
  }
}

TEST(TableFrameTest, AnOverlongFrameIsRefused) {
  const std::vector<uint64_t> keys = {1, 2};
  Payload p = Encode(APush(keys, std::string(16, 'v')));
  std::string longer(p.bytes);
  longer += "x";
  std::vector<uint64_t> scratch;
  EXPECT_THAT(DecodeTableFrame(longer, true, kMaxName, &scratch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("truncated, overlong or corrupt")));
}

TEST(TableFrameTest, LengthsThatDoNotAddUpAreRefused) {
  const std::vector<uint64_t> keys = {1, 2};
  Payload p = Encode(APush(keys, std::string(16, 'v')));
  std::vector<uint64_t> scratch;
  const auto refused = StatusIs(absl::StatusCode::kInvalidArgument,
                                HasSubstr("does not match its header"));
  // One key more or fewer than the bytes hold (values then too long/short).
  EXPECT_THAT(DecodeTableFrame(With<uint64_t>(p.bytes, 16, 3), true, kMaxName, &scratch).status(),
              refused);
  EXPECT_THAT(DecodeTableFrame(With<uint64_t>(p.bytes, 16, 1), true, kMaxName, &scratch).status(),
              refused);
  // A key count whose byte size overflows.
  EXPECT_THAT(DecodeTableFrame(With<uint64_t>(p.bytes, 16, uint64_t{1} << 61), true, kMaxName,
                               &scratch)
                  .status(),
              refused);
  EXPECT_THAT(DecodeTableFrame(With<uint64_t>(p.bytes, 24, std::numeric_limits<uint64_t>::max()),
                               true, kMaxName, &scratch)
                  .status(),
              refused);
  // A table name longer than the frame.
  EXPECT_THAT(DecodeTableFrame(With<uint32_t>(p.bytes, 8, 1000), true, kMaxName, &scratch).status(),
              refused);
}

TEST(TableFrameTest, HeadersThatLieAreRefused) {
  const std::vector<uint64_t> keys = {1};
  Payload p = Encode(APush(keys, std::string(4, 'v')));
  std::vector<uint64_t> scratch;
  EXPECT_THAT(DecodeTableFrame(With<uint32_t>(p.bytes, 0, 0x31425350), true, kMaxName, &scratch)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bad magic")));
  EXPECT_THAT(DecodeTableFrame(With<uint8_t>(p.bytes, 6, 1), true, kMaxName, &scratch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nonzero header padding")));
  // "emb" leaves 5 bytes of padding before the keys.
  EXPECT_THAT(DecodeTableFrame(With<uint8_t>(p.bytes, kTableFrameHeaderBytes + 4, 1), true,
                               kMaxName, &scratch)
                  .status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("nonzero padding")));
  EXPECT_THAT(DecodeTableFrame(p.bytes, true, /*max_name_bytes=*/2, &scratch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("exceeds the limit of 2")));
  // A push's bytes sent as a pull: a pull carries no values nor request id.
  EXPECT_THAT(DecodeTableFrame(p.bytes, /*push=*/false, kMaxName, &scratch).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("a pull carries neither")));
}

TEST(TableFrameTest, PullRepliesRoundTripAndLiesAreDataLoss) {
  std::string reply(kTablePullReplyHeaderBytes, '\0');
  EncodeTablePullReplyHeader(/*content_type=*/7, 8, reply.data());
  reply += "rowbytes";
  auto decoded = DecodeTablePullReply(reply);
  ASSERT_THAT(decoded.status(), IsOk());
  EXPECT_EQ(decoded->content_type, 7u);
  EXPECT_EQ(decoded->values, "rowbytes");
  EXPECT_THAT(DecodeTablePullReply(reply.substr(0, reply.size() - 1)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not match its header")));
  EXPECT_THAT(DecodeTablePullReply(reply.substr(0, 5)).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shorter than its header")));
}

// The header alone, for a reader that puts the rows elsewhere: the same
// checks against the payload's length as the whole reply's.
TEST(TableFrameTest, PullReplyHeaderAloneIsCheckedAgainstThePayloadLength) {
  char header[kTablePullReplyHeaderBytes];
  EncodeTablePullReplyHeader(/*content_type=*/3, 64, header);
  auto type = DecodeTablePullReplyHeader(header, kTablePullReplyHeaderBytes + 64);
  ASSERT_THAT(type.status(), IsOk());
  EXPECT_EQ(*type, 3u);
  EXPECT_THAT(DecodeTablePullReplyHeader(header, kTablePullReplyHeaderBytes + 63).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not match its header")));
  EXPECT_THAT(DecodeTablePullReplyHeader(nullptr, kTablePullReplyHeaderBytes - 1).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("shorter than its header")));
  header[5] = 1;  // the zero bytes after the content type
  EXPECT_THAT(DecodeTablePullReplyHeader(header, kTablePullReplyHeaderBytes + 64).status(),
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("does not match its header")));
}

}  // namespace
}  // namespace pserver
