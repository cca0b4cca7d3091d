#include "cc/rpc/wire.h"

#include <algorithm>
#include <cmath>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <ostream>
#include <random>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"
#include "cc/core/element_type.h"
#include "cc/core/names.h"
#include "cc/core/gradient_view.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/message.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "gtest/gtest.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// Contents above this many bytes are sent as borrowed slices (wire.cc).
constexpr size_t kInlineLimit = 16 << 10;

// ---- helpers --------------------------------------------------------------------------

// `n` deterministic, seed-dependent bytes (every byte value occurs).
std::string Pattern(size_t n, uint32_t seed) {
  std::string out(n, '\0');
  uint32_t x = seed * 2654435761u + 12345u;
  for (size_t i = 0; i < n; ++i) {
    x = x * 1664525u + 1013904223u;
    out[i] = static_cast<char>(x >> 24);
  }
  return out;
}

v1::BlockRef Block(uint32_t index, uint32_t count, uint64_t offset) {
  v1::BlockRef block;
  block.set_index(index);
  block.set_count(count);
  block.set_offset(offset);
  return block;
}

v1::Gradient Grad(const std::string& name, v1::ElementType type, std::string content,
                  std::optional<v1::BlockRef> block = std::nullopt,
                  std::optional<double> global_norm = std::nullopt) {
  v1::Gradient grad;
  grad.set_name(name);
  grad.set_element_type(type);
  grad.set_content(std::move(content));
  if (block.has_value()) *grad.mutable_block() = *block;
  if (global_norm.has_value()) grad.set_global_norm(*global_norm);
  return grad;
}

v1::ParamRef Ref(const std::string& name, std::optional<v1::BlockRef> block = std::nullopt) {
  v1::ParamRef ref;
  ref.set_name(name);
  if (block.has_value()) *ref.mutable_block() = *block;
  return ref;
}

v1::Parameter Param(const std::string& name, v1::ElementType type, std::vector<int64_t> shape,
                    std::optional<v1::BlockRef> block = std::nullopt) {
  v1::Parameter param;
  param.set_name(name);
  param.set_element_type(type);
  for (int64_t d : shape) param.add_shape(d);
  if (block.has_value()) *param.mutable_block() = *block;
  return param;
}

// Gradients of every kind the codec treats differently: empty, inline (small
// and exactly at the inline limit) and borrowed (large) contents; with and
// without block refs and global norms (including a present norm of 0).
std::vector<v1::Gradient> SampleGradients() {
  std::vector<v1::Gradient> grads;
  grads.push_back(Grad("empty", v1::FLOAT32, ""));
  grads.push_back(Grad("small/w", v1::FLOAT32, Pattern(4 * 10, 1), Block(0, 1, 0), 0.0));
  grads.push_back(Grad("caf\xc3\xa9", v1::FLOAT64, Pattern(8 * 3, 2), std::nullopt, 12.5));
  grads.push_back(Grad("large", v1::FLOAT32, Pattern(4 * 10000, 3), Block(2, 5, 20000), 3.25));
  grads.push_back(Grad("inline-limit", v1::INT64, Pattern(kInlineLimit, 4), Block(1, 2, 2048)));
  grads.push_back(Grad("large2", v1::FLOAT64, Pattern(kInlineLimit + 8, 5), std::nullopt, -1e300));
  grads.push_back(Grad("half", v1::BFLOAT16, Pattern(2 * 7, 6), Block(3, 4, 21)));
  grads.push_back(Grad("", v1::INT32, Pattern(4, 7)));
  grads.push_back(Grad("unspecified", v1::ELEMENT_TYPE_UNSPECIFIED, Pattern(3, 8)));
  // Marked by a client that found a NaN elsewhere in the gradient.
  grads.push_back(Grad("skipped", v1::FLOAT32, Pattern(4 * 5000, 9), Block(1, 3, 5000), 2.0));
  grads.back().set_skip_as_non_finite(true);
  return grads;
}

std::vector<v1::ParamRef> SampleRefs() {
  return {Ref("w", Block(1, 3, 100)), Ref(""), Ref("bias")};
}

std::vector<GradientView> ViewsOf(const std::vector<v1::Gradient>& grads) {
  std::vector<GradientView> views;
  for (const v1::Gradient& g : grads) views.push_back(GradientView::Of(g));
  return views;
}

// The message bytes of `buffer`, in one string.
std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices) {
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  }
  return out;
}

void DeleteChars(void* p) { delete[] static_cast<char*>(p); }

// A slice of its own heap copy of `bytes`: never inlined into, or merged with,
// its neighbours, so slice boundaries stay exactly where the test puts them.
grpc::Slice OwnedSlice(absl::string_view bytes) {
  char* copy = new char[bytes.size() + 1];
  if (!bytes.empty()) std::memcpy(copy, bytes.data(), bytes.size());
  return grpc::Slice(copy, bytes.size(), &DeleteChars);
}

constexpr size_t kWhole = static_cast<size_t>(-1);

// `bytes` cut into slices whose sizes cycle through `sizes` (0 adds an empty
// slice; kWhole takes everything left).
grpc::ByteBuffer Pieces(absl::string_view bytes, const std::vector<size_t>& sizes) {
  std::vector<grpc::Slice> slices;
  size_t at = 0;
  for (size_t i = 0; at < bytes.size(); ++i) {
    const size_t n = std::min(sizes[i % sizes.size()], bytes.size() - at);
    slices.push_back(OwnedSlice(bytes.substr(at, n)));
    at += n;
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

grpc::ByteBuffer OneSlice(absl::string_view bytes) { return Pieces(bytes, {kWhole}); }

::testing::AssertionResult SameBytes(absl::string_view want, absl::string_view got) {
  if (want == got) return ::testing::AssertionSuccess();
  size_t i = 0;
  while (i < want.size() && i < got.size() && want[i] == got[i]) ++i;
  return ::testing::AssertionFailure() << "want " << want.size() << " bytes, got " << got.size()
                                       << "; first difference at offset " << i;
}

::testing::AssertionResult ProtoEq(const google::protobuf::Message& want,
                                   const google::protobuf::Message& got) {
  if (want.SerializeAsString() == got.SerializeAsString()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << "\nwant {" << want.ShortDebugString() << "}\n got {" << got.ShortDebugString() << "}";
}

std::string SegmentsString(const Segments& segments) {
  std::string out(SegmentsSize(segments), '\0');
  CopySegments(segments, out.data());
  return out;
}

// `want` without its content: what a decoder's header should equal.
template <typename Message>
Message Header(Message want) {
  want.clear_content();
  return want;
}

bool Within(absl::string_view inner, absl::string_view outer) {
  const auto begin = reinterpret_cast<uintptr_t>(inner.data());
  const auto outer_begin = reinterpret_cast<uintptr_t>(outer.data());
  return begin >= outer_begin && begin + inner.size() <= outer_begin + outer.size();
}

enum class Where { kSlice, kScratch, kNowhere };

// Where a decoded content lies: inside one of the request's slices, inside one
// of its scratch strings, or neither (a bug).
Where Locate(const PushRequest& request, absl::string_view content) {
  for (const std::string& s : request.scratch) {
    if (Within(content, s)) return Where::kScratch;
  }
  for (const grpc::Slice& s : request.slices) {
    if (Within(content, absl::string_view(reinterpret_cast<const char*>(s.begin()), s.size()))) {
      return Where::kSlice;
    }
  }
  return Where::kNowhere;
}

size_t Alignment(v1::ElementType type) { return std::max<size_t>(1, ElementSize(type)); }

bool Aligned(absl::string_view content, v1::ElementType type) {
  return reinterpret_cast<uintptr_t>(content.data()) % Alignment(type) == 0;
}

// Checks a decoded gradient against the protobuf message it came from.
void ExpectViewMatches(const v1::Gradient& want, const GradientView& got) {
  SCOPED_TRACE("gradient '" + want.name() + "'");
  EXPECT_EQ(got.name, want.name());
  EXPECT_EQ(got.type, want.element_type());
  EXPECT_TRUE(ProtoEq(want.block(), got.block));
  ASSERT_EQ(got.global_norm.has_value(), want.has_global_norm());
  if (want.has_global_norm()) {
    EXPECT_EQ(*got.global_norm, want.global_norm());
  }
  EXPECT_EQ(got.skip_as_non_finite, want.skip_as_non_finite());
  EXPECT_TRUE(SameBytes(want.content(), got.content));
  if (!got.content.empty()) {
    EXPECT_TRUE(Aligned(got.content, got.type))
        << "content at " << static_cast<const void*>(got.content.data()) << " not aligned to "
        << Alignment(got.type);
  }
}

// Checks a gradient protobuf parsed from encoded bytes against the one encoded.
// The encoder always writes a block (possibly empty), so only its value counts.
void ExpectParsedMatches(const v1::Gradient& want, const v1::Gradient& got) {
  SCOPED_TRACE("gradient '" + want.name() + "'");
  EXPECT_EQ(got.name(), want.name());
  EXPECT_EQ(got.element_type(), want.element_type());
  EXPECT_TRUE(ProtoEq(want.block(), got.block()));
  ASSERT_EQ(got.has_global_norm(), want.has_global_norm());
  if (want.has_global_norm()) {
    EXPECT_EQ(got.global_norm(), want.global_norm());
  }
  EXPECT_EQ(got.skip_as_non_finite(), want.skip_as_non_finite());
  EXPECT_TRUE(SameBytes(want.content(), got.content()));
}

// Checks a decoded request against the protobuf message it came from.
void ExpectDecodedMatches(const v1::PushPullRequest& want, const PushRequest& got) {
  ASSERT_EQ(got.headers.size(), static_cast<size_t>(want.gradients_size()));
  ASSERT_EQ(got.grads.size(), static_cast<size_t>(want.gradients_size()));
  for (int i = 0; i < want.gradients_size(); ++i) {
    EXPECT_TRUE(ProtoEq(Header(want.gradients(i)), got.headers[i])) << "gradient " << i;
    ExpectViewMatches(want.gradients(i), got.grads[i]);
    if (!got.grads[i].content.empty()) {
      EXPECT_NE(Locate(got, got.grads[i].content), Where::kNowhere) << "gradient " << i;
    }
  }
  ASSERT_EQ(got.refs.size(), static_cast<size_t>(want.params_size()));
  for (int i = 0; i < want.params_size(); ++i) {
    EXPECT_TRUE(ProtoEq(want.params(i), got.refs[i])) << "ref " << i;
  }
  EXPECT_EQ(got.client_id, want.client_id());
  EXPECT_EQ(got.sequence, want.sequence());
}

// Counts how often a lease's callback ran.
struct Counter {
  int calls = 0;
  std::function<void()> Callback() {
    return [this] { ++calls; };
  }
};

// ---- Segments --------------------------------------------------------------------------

TEST(SegmentsTest, EmptyListHasNoBytes) {
  EXPECT_EQ(SegmentsSize({}), 0u);
  char dest = 'x';
  CopySegments({}, &dest);
  EXPECT_EQ(dest, 'x');
}

TEST(SegmentsTest, SizeAndCopyConcatenateInOrder) {
  const std::string a = "hello", c = ", world";
  const Segments segments = {a, absl::string_view(), "", c, absl::string_view("!", 1)};
  EXPECT_EQ(SegmentsSize(segments), 13u);
  std::string dest(15, '#');
  CopySegments(segments, dest.data() + 1);
  EXPECT_EQ(dest, "#hello, world!#");
}

TEST(SegmentsTest, OnlyEmptySegments) {
  const Segments segments = {absl::string_view(), ""};
  EXPECT_EQ(SegmentsSize(segments), 0u);
  char dest = 'x';
  CopySegments(segments, &dest);
  EXPECT_EQ(dest, 'x');
}

// ---- EncodePushRequest: protobuf reads what it writes -----------------------------------

TEST(EncodePushRequestTest, ParsesAsSendGradsRequest) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), {}, lease);
    const std::string bytes = Flatten(buffer);

    v1::SendGradsRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(bytes));
    ASSERT_EQ(parsed.gradients_size(), static_cast<int>(grads.size()));
    for (size_t i = 0; i < grads.size(); ++i) ExpectParsedMatches(grads[i], parsed.gradients(i));

    // No refs: as a PushPullRequest it has no params either.
    v1::PushPullRequest as_push_pull;
    ASSERT_TRUE(as_push_pull.ParseFromString(bytes));
    EXPECT_EQ(as_push_pull.gradients_size(), static_cast<int>(grads.size()));
    EXPECT_EQ(as_push_pull.params_size(), 0);
    lease->Release();
    EXPECT_EQ(released.calls, 0) << "the buffer still borrows the large contents";
  }
  EXPECT_EQ(released.calls, 1);
}

TEST(EncodePushRequestTest, WithRefsParsesAsPushPullRequest) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  const std::vector<v1::ParamRef> refs = SampleRefs();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), refs, lease);
    v1::PushPullRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
    ASSERT_EQ(parsed.gradients_size(), static_cast<int>(grads.size()));
    for (size_t i = 0; i < grads.size(); ++i) ExpectParsedMatches(grads[i], parsed.gradients(i));
    ASSERT_EQ(parsed.params_size(), static_cast<int>(refs.size()));
    for (size_t i = 0; i < refs.size(); ++i) {
      EXPECT_TRUE(ProtoEq(refs[i], parsed.params(i))) << "ref " << i;
    }
  }
  lease->Release();
  EXPECT_EQ(released.calls, 1);
}

TEST(EncodePushRequestTest, RefsOnly) {
  const std::vector<v1::ParamRef> refs = SampleRefs();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const grpc::ByteBuffer buffer = EncodePushRequest({}, refs, lease);
  lease->Release();
  EXPECT_EQ(released.calls, 1) << "nothing was borrowed";
  v1::PushPullRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.gradients_size(), 0);
  ASSERT_EQ(parsed.params_size(), static_cast<int>(refs.size()));
  for (size_t i = 0; i < refs.size(); ++i) EXPECT_TRUE(ProtoEq(refs[i], parsed.params(i)));
}

TEST(EncodePushRequestTest, RequestIdParsesAndRoundTrips) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  const std::vector<v1::ParamRef> refs = SampleRefs();
  for (const uint64_t client_id : {uint64_t{1}, uint64_t{0x8000000000000001}, ~uint64_t{0}}) {
    for (const uint64_t sequence : {uint64_t{1}, uint64_t{127}, uint64_t{128}, ~uint64_t{0}}) {
      SCOPED_TRACE(absl::StrCat("client ", client_id, " sequence ", sequence));
      Counter released;
      PayloadLease* lease = PayloadLease::Create(released.Callback());
      {
        const grpc::ByteBuffer push =
            EncodePushRequest(ViewsOf(grads), {}, lease, client_id, sequence);
        v1::SendGradsRequest parsed;
        ASSERT_TRUE(parsed.ParseFromString(Flatten(push)));
        EXPECT_EQ(parsed.client_id(), client_id);
        EXPECT_EQ(parsed.sequence(), sequence);
        ASSERT_EQ(parsed.gradients_size(), static_cast<int>(grads.size()));

        const grpc::ByteBuffer push_pull =
            EncodePushRequest(ViewsOf(grads), refs, lease, client_id, sequence);
        v1::PushPullRequest want;
        ASSERT_TRUE(want.ParseFromString(Flatten(push_pull)));
        EXPECT_EQ(want.client_id(), client_id);
        EXPECT_EQ(want.sequence(), sequence);
        PushRequest decoded;
        ASSERT_OK(DecodePushRequest(push_pull, &decoded));
        ExpectDecodedMatches(want, decoded);
      }
      lease->Release();
      EXPECT_EQ(released.calls, 1);
    }
  }
}

TEST(EncodePushRequestTest, ZeroRequestIdIsLeftOut) {
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const grpc::ByteBuffer buffer = EncodePushRequest({}, {}, lease, 0, 0);
  lease->Release();
  EXPECT_EQ(Flatten(buffer), "");
}

TEST(EncodePushRequestTest, EmptyRequestIsEmptyMessage) {
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const grpc::ByteBuffer buffer = EncodePushRequest({}, {}, lease);
  lease->Release();
  EXPECT_EQ(released.calls, 1);
  EXPECT_EQ(Flatten(buffer), "");
  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(buffer, &decoded));
  EXPECT_TRUE(decoded.grads.empty());
  EXPECT_TRUE(decoded.refs.empty());
}

// The sizes around the inline limit and the varint length boundaries all
// produce bytes protobuf reads back exactly.
TEST(EncodePushRequestTest, ContentSizesAroundBoundaries) {
  for (size_t size : {size_t{0}, size_t{1}, size_t{127}, size_t{128}, size_t{16383}, kInlineLimit,
                      kInlineLimit + 1, size_t{(1 << 21) - 1}, size_t{1 << 21}}) {
    SCOPED_TRACE(absl::StrCat("content size ", size));
    const std::vector<v1::Gradient> grads = {Grad("g", v1::INT32, Pattern(size, size))};
    Counter released;
    PayloadLease* lease = PayloadLease::Create(released.Callback());
    {
      const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), {}, lease);
      v1::SendGradsRequest parsed;
      ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
      ASSERT_EQ(parsed.gradients_size(), 1);
      ExpectParsedMatches(grads[0], parsed.gradients(0));
      lease->Release();
    }
    EXPECT_EQ(released.calls, 1);
  }
}

// Large contents are borrowed (later writes to the caller's memory show in the
// message), small ones copied (later writes do not).
TEST(EncodePushRequestTest, LargeContentsBorrowedSmallOnesCopied) {
  std::vector<float> large(3 * kInlineLimit / sizeof(float), 1.0f);
  std::vector<float> small(16, 1.0f);
  GradientView large_view, small_view;
  large_view.name = "large";
  large_view.type = v1::FLOAT32;
  large_view.content =
      absl::string_view(reinterpret_cast<const char*>(large.data()), large.size() * sizeof(float));
  small_view.name = "small";
  small_view.type = v1::FLOAT32;
  small_view.content =
      absl::string_view(reinterpret_cast<const char*>(small.data()), small.size() * sizeof(float));

  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    const grpc::ByteBuffer buffer = EncodePushRequest({small_view, large_view}, {}, lease);

    // Exactly one slice is the caller's large array itself: no copy.
    std::vector<grpc::Slice> slices;
    ASSERT_TRUE(buffer.Dump(&slices).ok());
    int borrowed = 0;
    for (const grpc::Slice& s : slices) {
      if (reinterpret_cast<const char*>(s.begin()) == large_view.content.data()) {
        ++borrowed;
        EXPECT_EQ(s.size(), large_view.content.size());
      }
      EXPECT_FALSE(Within(small_view.content,
                          absl::string_view(reinterpret_cast<const char*>(s.begin()), s.size())))
          << "small contents are copied into the message";
    }
    EXPECT_EQ(borrowed, 1);

    large[7] = 42.0f;
    small[3] = 42.0f;
    v1::SendGradsRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
    ASSERT_EQ(parsed.gradients_size(), 2);
    float got_small, got_large;
    std::memcpy(&got_small, parsed.gradients(0).content().data() + 3 * sizeof(float),
                sizeof(float));
    std::memcpy(&got_large, parsed.gradients(1).content().data() + 7 * sizeof(float),
                sizeof(float));
    EXPECT_EQ(got_small, 1.0f);
    EXPECT_EQ(got_large, 42.0f);
  }
  lease->Release();
  EXPECT_EQ(released.calls, 1);
}

// Encoded and decoded in one process, an aligned large content is never copied.
TEST(EncodePushRequestTest, RoundTripKeepsLargeContentInPlace) {
  std::vector<double> large(kInlineLimit, 0.5);  // 128 KiB, 8-aligned
  GradientView view;
  view.name = "w";
  view.type = v1::FLOAT64;
  view.block = Block(1, 2, 3);
  view.global_norm = 2.0;
  view.content =
      absl::string_view(reinterpret_cast<const char*>(large.data()), large.size() * sizeof(double));
  const std::vector<v1::Gradient> small = {Grad("s", v1::FLOAT32, Pattern(12, 1))};
  std::vector<GradientView> views = ViewsOf(small);
  views.push_back(view);
  views.push_back(GradientView::Of(small[0]));

  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    PushRequest decoded;
    {
      const grpc::ByteBuffer buffer = EncodePushRequest(views, SampleRefs(), lease);
      lease->Release();
      ASSERT_OK(DecodePushRequest(buffer, &decoded));
    }
    EXPECT_EQ(released.calls, 0) << "the decoded request still holds the borrowed slice";
    ASSERT_EQ(decoded.grads.size(), 3u);
    EXPECT_EQ(decoded.grads[1].content.data(), view.content.data());
    EXPECT_EQ(decoded.grads[1].content.size(), view.content.size());
    EXPECT_EQ(decoded.grads[1].name, "w");
    EXPECT_EQ(decoded.grads[1].type, v1::FLOAT64);
    EXPECT_TRUE(ProtoEq(view.block, decoded.grads[1].block));
    EXPECT_EQ(decoded.grads[1].global_norm, std::optional<double>(2.0));
    for (size_t i : {size_t{0}, size_t{2}}) {
      ExpectViewMatches(small[0], decoded.grads[i]);
      EXPECT_NE(Locate(decoded, decoded.grads[i].content), Where::kNowhere);
    }
    ASSERT_EQ(decoded.refs.size(), SampleRefs().size());
    for (size_t i = 0; i < decoded.refs.size(); ++i) {
      EXPECT_TRUE(ProtoEq(SampleRefs()[i], decoded.refs[i]));
    }
  }
  EXPECT_EQ(released.calls, 1);
}

// A message read whole into one buffer (as a bulk channel frame is) decodes
// with every content in place, whatever the names, request ids and sizes put
// before it: each content starts a multiple of 16 bytes into the message.
TEST(EncodePushRequestTest, ContentsAlignedInAWholeMessage) {
  const std::vector<v1::Gradient> sample = SampleGradients();
  for (uint64_t sequence : {uint64_t{0}, uint64_t{1}, uint64_t{127}, uint64_t{128},
                            uint64_t{16384}, uint64_t{1} << 40}) {
    for (size_t name_length = 0; name_length < 20; ++name_length) {
      SCOPED_TRACE(absl::StrCat("sequence ", sequence, ", name length ", name_length));
      std::vector<v1::Gradient> grads = sample;
      for (v1::Gradient& g : grads) g.set_name(std::string(name_length, 'n'));
      Counter released;
      PayloadLease* lease = PayloadLease::Create(released.Callback());
      const std::string bytes =
          Flatten(EncodePushRequest(ViewsOf(grads), SampleRefs(), lease, 7, sequence));
      lease->Release();
      v1::PushPullRequest parsed;
      ASSERT_TRUE(parsed.ParseFromString(bytes)) << "the padding is a field protobuf skips";
      ASSERT_EQ(parsed.gradients_size(), static_cast<int>(grads.size()));
      for (size_t i = 0; i < grads.size(); ++i) ExpectParsedMatches(grads[i], parsed.gradients(i));

      const grpc::ByteBuffer whole = Pieces(bytes, {kWhole});  // one slice, malloc-aligned
      PushRequest decoded;
      ASSERT_OK(DecodePushRequest(whole, &decoded));
      ASSERT_EQ(decoded.grads.size(), grads.size());
      EXPECT_TRUE(decoded.scratch.empty()) << "a content was copied to align it";
      const char* begin = reinterpret_cast<const char*>(decoded.slices.at(0).begin());
      for (size_t i = 0; i < grads.size(); ++i) {
        ExpectViewMatches(grads[i], decoded.grads[i]);
        if (grads[i].content().empty()) continue;
        EXPECT_EQ((decoded.grads[i].content.data() - begin) % 16, 0) << "gradient " << i;
      }
    }
  }
}

// ---- PushFiniteScan: the NaN scan made while a push arrives -------------------------

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(float));
}

// Four gradients; the second holds a NaN in its last value.
std::vector<v1::Gradient> ScanGradients() {
  const std::vector<float> finite(3000, 0.5f);
  std::vector<float> nan = finite;
  nan.back() = std::nanf("");
  std::vector<v1::Gradient> grads;
  grads.push_back(Grad("a", v1::FLOAT32, FloatBytes(finite), Block(0, 3, 0)));
  grads.push_back(Grad("a", v1::FLOAT32, FloatBytes(nan), Block(1, 3, 3000)));
  grads.push_back(Grad("b", v1::INT32, Pattern(400, 1)));
  grads.push_back(Grad("c", v1::FLOAT32, FloatBytes(finite)));
  return grads;
}

TEST(PushFiniteScanTest, ReportsTheFiniteGradientsWhateverPiecesTheyArriveIn) {
  const std::vector<v1::Gradient> grads = ScanGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const std::string bytes =
      Flatten(EncodePushRequest(ViewsOf(grads), SampleRefs(), lease, 7, 3));
  lease->Release();
  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(OneSlice(bytes), &decoded));
  ASSERT_EQ(decoded.grads.size(), 4u);
  ASSERT_TRUE(decoded.scratch.empty());
  const absl::string_view message(reinterpret_cast<const char*>(decoded.slices.at(0).begin()),
                                  decoded.slices.at(0).size());
  for (size_t step : {size_t{1}, size_t{3}, size_t{1000}, size_t{4096}, message.size()}) {
    SCOPED_TRACE(absl::StrCat("pieces of ", step));
    PushFiniteScan scan(message);
    for (size_t n = step; n < message.size() + step; n += step) {
      scan.Advance(std::min(n, message.size()));
      // Nothing is reported before all of a gradient's bytes are in.
      const absl::string_view last = decoded.grads[3].content;
      if (n < static_cast<size_t>(last.data() + last.size() - message.data())) {
        EXPECT_FALSE(scan.Finite(decoded.grads[3]));
      }
    }
    EXPECT_TRUE(scan.Finite(decoded.grads[0]));
    EXPECT_FALSE(scan.Finite(decoded.grads[1])) << "it holds a NaN";
    EXPECT_TRUE(scan.Finite(decoded.grads[2])) << "integers have no NaN";
    EXPECT_TRUE(scan.Finite(decoded.grads[3]));
    EXPECT_EQ(scan.gradients_scanned(), 3u);
    // Only the very bytes scanned, as the type scanned.
    GradientView other_type = decoded.grads[0];
    other_type.type = v1::FLOAT16;
    EXPECT_FALSE(scan.Finite(other_type));
    GradientView shorter = decoded.grads[0];
    shorter.content.remove_suffix(4);
    EXPECT_FALSE(scan.Finite(shorter));
  }
}

TEST(PushFiniteScanTest, ReportsNothingOfACutOrMalformedMessage) {
  const std::vector<v1::Gradient> grads = ScanGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const std::string bytes = Flatten(EncodePushRequest(ViewsOf(grads), {}, lease, 7, 3));
  lease->Release();
  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(OneSlice(bytes), &decoded));
  const absl::string_view message(reinterpret_cast<const char*>(decoded.slices.at(0).begin()),
                                  decoded.slices.at(0).size());
  // The message ends one byte early: its last gradient is never complete.
  PushFiniteScan cut(message.substr(0, message.size() - 1));
  cut.Advance(message.size());  // more than there is: taken as all of it
  EXPECT_TRUE(cut.Finite(decoded.grads[0]));
  EXPECT_FALSE(cut.Finite(decoded.grads[3]));
  // Garbage: an invalid key stops the scan; nothing reported, no crash.
  const std::string garbage(64, '\xff');
  PushFiniteScan bad(garbage);
  bad.Advance(garbage.size());
  EXPECT_EQ(bad.gradients_scanned(), 0u);
  EXPECT_FALSE(bad.Finite(decoded.grads[0]));
}

// ---- decoding protobuf's bytes, cut into slices of every shape ------------------------

struct Split {
  std::string name;
  std::vector<size_t> sizes;
};

void PrintTo(const Split& split, std::ostream* os) { *os << split.name; }

std::string SplitName(const ::testing::TestParamInfo<Split>& info) { return info.param.name; }

class SplitTest : public ::testing::TestWithParam<Split> {
 protected:
  grpc::ByteBuffer Cut(absl::string_view bytes) { return Pieces(bytes, GetParam().sizes); }
  // The largest slice this split makes.
  size_t MaxPiece() const {
    return *std::max_element(GetParam().sizes.begin(), GetParam().sizes.end());
  }
};

INSTANTIATE_TEST_SUITE_P(
    Slicings, SplitTest,
    ::testing::Values(Split{"Whole", {kWhole}}, Split{"Every7Bytes", {7}}, Split{"EveryByte", {1}},
                      Split{"OddSizesWithEmptySlices", {0, 3, 1, 0, 5, 2, 11, 13, 0, 17}},
                      Split{"Every4093Bytes", {4093}}, Split{"Every16385Bytes", {16385}}),
    SplitName);

// Where a content may lie: in scratch when it spans slices; otherwise in a
// slice only if aligned (checked by ExpectViewMatches).
void ExpectContentsPlaced(const PushRequest& decoded, size_t max_piece) {
  for (size_t i = 0; i < decoded.grads.size(); ++i) {
    const absl::string_view content = decoded.grads[i].content;
    if (content.empty()) continue;
    const Where where = Locate(decoded, content);
    EXPECT_NE(where, Where::kNowhere) << "gradient " << i;
    if (content.size() > max_piece) {
      EXPECT_EQ(where, Where::kScratch) << "gradient " << i << " spans slices";
    }
  }
}

TEST_P(SplitTest, DecodesProtobufSendGradsRequest) {
  v1::SendGradsRequest request;
  for (const v1::Gradient& g : SampleGradients()) *request.add_gradients() = g;
  const grpc::ByteBuffer buffer = Cut(request.SerializeAsString());

  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(buffer, &decoded));
  v1::PushPullRequest want;
  *want.mutable_gradients() = request.gradients();
  ExpectDecodedMatches(want, decoded);
  ExpectContentsPlaced(decoded, MaxPiece());
}

TEST_P(SplitTest, DecodesProtobufPushPullRequest) {
  v1::PushPullRequest request;
  for (const v1::Gradient& g : SampleGradients()) *request.add_gradients() = g;
  for (const v1::ParamRef& r : SampleRefs()) *request.add_params() = r;
  // protobuf writes repeated fields field by field; interleave one more ref
  // between gradients by hand, which protobuf also accepts.
  std::string bytes = request.SerializeAsString();
  v1::PushPullRequest extra;
  *extra.add_params() = Ref("late", Block(0, 2, 0));
  *extra.add_gradients() = Grad("late", v1::FLOAT32, Pattern(20000, 9), Block(1, 2, 5000));
  bytes += extra.SerializeAsString();
  *request.add_params() = extra.params(0);
  *request.add_gradients() = extra.gradients(0);
  v1::PushPullRequest check;
  ASSERT_TRUE(check.ParseFromString(bytes));
  ASSERT_TRUE(ProtoEq(request, check));

  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(Cut(bytes), &decoded));
  ExpectDecodedMatches(request, decoded);
  ExpectContentsPlaced(decoded, MaxPiece());
}

TEST_P(SplitTest, DecodesProtobufRequestId) {
  v1::PushPullRequest request;
  for (const v1::Gradient& g : SampleGradients()) *request.add_gradients() = g;
  for (const v1::ParamRef& r : SampleRefs()) *request.add_params() = r;
  request.set_client_id(0x0123456789abcdef);
  request.set_sequence(300);
  // A repeated scalar: the last occurrence wins, in protobuf and here.
  v1::PushPullRequest later;
  later.set_sequence(301);
  const std::string bytes = request.SerializeAsString() + later.SerializeAsString();
  request.set_sequence(301);
  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(Cut(bytes), &decoded));
  ExpectDecodedMatches(request, decoded);
  EXPECT_EQ(decoded.client_id, 0x0123456789abcdefu);
  EXPECT_EQ(decoded.sequence, 301u);
}

TEST_P(SplitTest, DecodesEncodedRequest) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  std::string bytes;
  {
    const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), SampleRefs(), lease);
    bytes = Flatten(buffer);
  }
  lease->Release();
  EXPECT_EQ(released.calls, 1);

  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(Cut(bytes), &decoded));
  ASSERT_EQ(decoded.grads.size(), grads.size());
  for (size_t i = 0; i < grads.size(); ++i) ExpectViewMatches(grads[i], decoded.grads[i]);
  ExpectContentsPlaced(decoded, MaxPiece());
  ASSERT_EQ(decoded.refs.size(), SampleRefs().size());
}

TEST_P(SplitTest, DecodesProtobufGetParamsResponse) {
  v1::GetParamsResponse response;
  *response.add_parameters() = Param("empty", v1::FLOAT32, {0});
  *response.add_parameters() = Param("w", v1::FLOAT32, {4, 5}, Block(0, 1, 0));
  response.mutable_parameters(1)->set_content(Pattern(80, 1));
  *response.add_parameters() = Param("big", v1::FLOAT64, {100, 300}, Block(3, 4, 22500));
  response.mutable_parameters(2)->set_content(Pattern(8 * 7500, 2));
  *response.add_parameters() = Param("", v1::INT64, {}, Block(1, 2, 1));
  response.mutable_parameters(3)->set_content(Pattern(8, 3));
  *response.add_parameters() = Param("limit", v1::INT32, {4096}, std::nullopt);
  response.mutable_parameters(4)->set_content(Pattern(kInlineLimit, 4));

  ParamsResponse decoded;
  ASSERT_OK(DecodeParamsResponse(Cut(response.SerializeAsString()), &decoded));
  ASSERT_EQ(decoded.headers.size(), 5u);
  ASSERT_EQ(decoded.contents.size(), 5u);
  for (int i = 0; i < response.parameters_size(); ++i) {
    EXPECT_TRUE(ProtoEq(Header(response.parameters(i)), decoded.headers[i])) << "block " << i;
    EXPECT_TRUE(SameBytes(response.parameters(i).content(), SegmentsString(decoded.contents[i])))
        << "block " << i;
    EXPECT_EQ(SegmentsSize(decoded.contents[i]), response.parameters(i).content().size());
  }
}

// ---- unknown fields ---------------------------------------------------------------------

std::string Varint(uint64_t v) {
  std::string out;
  while (v >= 0x80) {
    out.push_back(static_cast<char>(v | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
  return out;
}

std::string Key(uint64_t field, int wire_type) { return Varint((field << 3) | wire_type); }

std::string LengthDelimited(uint64_t field, absl::string_view value) {
  return Key(field, 2) + Varint(value.size()) + std::string(value);
}

// One field of each wire type protobuf skips as unknown, numbered from `first`.
std::string UnknownFields(uint64_t first) {
  return Key(first, 0) + Varint(300) + Key(first + 1, 1) + std::string(8, '\x11') +
         Key(first + 2, 5) + std::string(4, '\x22') + LengthDelimited(first + 3, "unknown") +
         Key(536870911, 0) + Varint(1);  // the largest field number
}

TEST_P(SplitTest, ParamsResponseToleratesUnknownFields) {
  v1::Parameter small = Param("w", v1::FLOAT32, {3}, Block(0, 1, 0));
  small.set_content(Pattern(12, 1));
  v1::Parameter large = Param("big", v1::FLOAT32, {20000});
  large.set_content(Pattern(80000, 2));
  const std::string bytes =
      UnknownFields(2) + LengthDelimited(1, small.SerializeAsString() + UnknownFields(1010)) +
      UnknownFields(100) + LengthDelimited(1, UnknownFields(1000) + large.SerializeAsString()) +
      UnknownFields(20);
  // Protobuf itself reads these bytes as the two parameters.
  v1::GetParamsResponse check;
  ASSERT_TRUE(check.ParseFromString(bytes));
  ASSERT_EQ(check.parameters_size(), 2);
  check.DiscardUnknownFields();
  EXPECT_TRUE(ProtoEq(small, check.parameters(0)));
  EXPECT_TRUE(ProtoEq(large, check.parameters(1)));

  ParamsResponse decoded;
  ASSERT_OK(DecodeParamsResponse(Cut(bytes), &decoded));
  ASSERT_EQ(decoded.headers.size(), 2u);
  ASSERT_EQ(decoded.contents.size(), 2u);
  decoded.headers[0].DiscardUnknownFields();
  decoded.headers[1].DiscardUnknownFields();
  EXPECT_TRUE(ProtoEq(Header(small), decoded.headers[0]));
  EXPECT_TRUE(ProtoEq(Header(large), decoded.headers[1]));
  EXPECT_TRUE(SameBytes(small.content(), SegmentsString(decoded.contents[0])));
  EXPECT_TRUE(SameBytes(large.content(), SegmentsString(decoded.contents[1])));
}

TEST_P(SplitTest, PushRequestToleratesUnknownFields) {
  const v1::Gradient small = Grad("w", v1::FLOAT32, Pattern(12, 1), Block(0, 1, 0), 1.5);
  const v1::Gradient large = Grad("big", v1::FLOAT64, Pattern(80000, 2));
  const v1::ParamRef ref = Ref("r", Block(1, 2, 3));
  const std::string bytes =
      UnknownFields(3) + LengthDelimited(1, small.SerializeAsString() + UnknownFields(1010)) +
      UnknownFields(100) + LengthDelimited(2, ref.SerializeAsString()) +
      LengthDelimited(1, UnknownFields(1000) + large.SerializeAsString()) + UnknownFields(20);
  v1::PushPullRequest check;
  ASSERT_TRUE(check.ParseFromString(bytes));
  ASSERT_EQ(check.gradients_size(), 2);

  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(Cut(bytes), &decoded));
  ASSERT_EQ(decoded.grads.size(), 2u);
  ExpectViewMatches(small, decoded.grads[0]);
  ExpectViewMatches(large, decoded.grads[1]);
  decoded.headers[0].DiscardUnknownFields();
  decoded.headers[1].DiscardUnknownFields();
  EXPECT_TRUE(ProtoEq(Header(small), decoded.headers[0]));
  EXPECT_TRUE(ProtoEq(Header(large), decoded.headers[1]));
  ASSERT_EQ(decoded.refs.size(), 1u);
  EXPECT_TRUE(ProtoEq(ref, decoded.refs[0]));
  ExpectContentsPlaced(decoded, MaxPiece());
}

// ---- alignment of contents that arrive in one slice --------------------------------

// A content in one slice is handed out in place when its address suits its
// element type, and copied to (aligned) scratch when it does not.
TEST(DecodePushRequestTest, ContentInOneSliceCopiedOnlyWhenMisaligned) {
  for (v1::ElementType type : {v1::FLOAT64, v1::INT64, v1::FLOAT32, v1::UINT32, v1::BFLOAT16,
                               v1::FLOAT16, v1::ELEMENT_TYPE_UNSPECIFIED}) {
    v1::SendGradsRequest request;
    *request.add_gradients() = Grad("w", type, Pattern(800, 9), Block(0, 1, 0));
    const std::string bytes = request.SerializeAsString();
    const size_t at = bytes.find(request.gradients(0).content());
    ASSERT_NE(at, std::string::npos);
    std::vector<uint64_t> storage(bytes.size() / 8 + 4);  // 8-aligned
    char* base = reinterpret_cast<char*>(storage.data());
    for (size_t shift = 0; shift < 8; ++shift) {
      SCOPED_TRACE(absl::StrCat("type ", v1::ElementType_Name(type), ", shift ", shift));
      const size_t start = 8 + (shift + 8 - at % 8) % 8;  // content at base + 8k + shift
      std::memcpy(base + start, bytes.data(), bytes.size());
      const char* content = base + start + at;
      ASSERT_EQ(reinterpret_cast<uintptr_t>(content) % 8, shift);
      grpc::Slice slice(base + start, bytes.size(), grpc::Slice::STATIC_SLICE);
      const grpc::ByteBuffer buffer(&slice, 1);

      PushRequest decoded;
      ASSERT_OK(DecodePushRequest(buffer, &decoded));
      ASSERT_EQ(decoded.grads.size(), 1u);
      ExpectViewMatches(request.gradients(0), decoded.grads[0]);
      if (shift % Alignment(type) == 0) {
        EXPECT_EQ(decoded.grads[0].content.data(), content) << "aligned: used in place";
        EXPECT_TRUE(decoded.scratch.empty());
      } else {
        EXPECT_EQ(Locate(decoded, decoded.grads[0].content), Where::kScratch);
      }
    }
  }
}

// ---- ParamsResponseBuilder ---------------------------------------------------------

struct BuiltBlock {
  v1::Parameter header;
  std::string content;
};

std::vector<BuiltBlock> SampleBlocks() {
  return {
      {Param("small", v1::FLOAT32, {2, 3}, Block(0, 1, 0)), Pattern(24, 1)},
      {Param("empty", v1::FLOAT64, {0}), ""},
      {Param("large", v1::FLOAT32, {300, 100}, Block(1, 3, 10000)), Pattern(40000, 2)},
      {Param("limit", v1::INT64, {2048}), Pattern(kInlineLimit, 3)},
      {Param("just-over", v1::INT32, {4097}), Pattern(kInlineLimit + 4, 4)},
      {Param("", v1::UINT32, {}), Pattern(4, 5)},
      {Param("large2", v1::UINT64, {1 << 15}, Block(7, 8, 1 << 18)), Pattern(8 << 15, 6)},
  };
}

grpc::ByteBuffer Build(const std::vector<BuiltBlock>& blocks, std::vector<int>* fills = nullptr) {
  ParamsResponseBuilder builder;
  for (size_t i = 0; i < blocks.size(); ++i) {
    builder.Add(blocks[i].header, blocks[i].content.size(), [&](char* dest) {
      if (fills != nullptr) ++(*fills)[i];
      std::memcpy(dest, blocks[i].content.data(), blocks[i].content.size());
    });
  }
  return builder.Finish();
}

TEST(ParamsResponseBuilderTest, ParsesAsGetParamsResponse) {
  const std::vector<BuiltBlock> blocks = SampleBlocks();
  std::vector<int> fills(blocks.size(), 0);
  const grpc::ByteBuffer buffer = Build(blocks, &fills);
  for (size_t i = 0; i < blocks.size(); ++i) EXPECT_EQ(fills[i], 1) << "block " << i;

  v1::GetParamsResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  ASSERT_EQ(parsed.parameters_size(), static_cast<int>(blocks.size()));
  for (size_t i = 0; i < blocks.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("block ", i));
    EXPECT_TRUE(ProtoEq(blocks[i].header, Header(parsed.parameters(i))));
    EXPECT_TRUE(SameBytes(blocks[i].content, parsed.parameters(i).content()));
  }
}

TEST(ParamsResponseBuilderTest, NoBlocksIsEmptyResponse) {
  ParamsResponseBuilder builder;
  const grpc::ByteBuffer buffer = builder.Finish();
  EXPECT_EQ(Flatten(buffer), "");
  ParamsResponse decoded;
  ASSERT_OK(DecodeParamsResponse(buffer, &decoded));
  EXPECT_TRUE(decoded.headers.empty());
  EXPECT_TRUE(decoded.contents.empty());
}

TEST(ParamsResponseBuilderTest, DecodesWhatItBuilds) {
  const std::vector<BuiltBlock> blocks = SampleBlocks();
  const grpc::ByteBuffer buffer = Build(blocks);
  ParamsResponse decoded;
  ASSERT_OK(DecodeParamsResponse(buffer, &decoded));
  ASSERT_EQ(decoded.headers.size(), blocks.size());
  ASSERT_EQ(decoded.contents.size(), blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    SCOPED_TRACE(absl::StrCat("block ", i));
    EXPECT_TRUE(ProtoEq(blocks[i].header, decoded.headers[i]));
    EXPECT_TRUE(SameBytes(blocks[i].content, SegmentsString(decoded.contents[i])));
    if (blocks[i].content.size() > kInlineLimit) {
      // A large block has a slice of its own: it arrives in one piece.
      EXPECT_EQ(decoded.contents[i].size(), 1u);
    }
  }
}

// ---- robustness ---------------------------------------------------------------------

struct BadCase {
  std::string name;
  std::string bytes;
};

std::string Bytes(std::initializer_list<int> values) {
  std::string out;
  for (int v : values) out.push_back(static_cast<char>(v));
  return out;
}

// Bytes that are not a well-formed message of either kind.
std::vector<BadCase> MalformedMessages() {
  const std::string valid = LengthDelimited(1, Grad("w", v1::FLOAT32, "abcd").SerializeAsString());
  return {
      {"TruncatedKey", Bytes({0x80})},
      {"KeyWithoutLength", Bytes({0x0a})},
      {"TruncatedLength", Bytes({0x0a, 0x80})},
      {"LengthPastEnd", Bytes({0x0a, 0x05, 0x0a, 0x01, 'w'})},
      {"LengthOnePastEnd", valid.substr(0, 1) + Varint(valid.size() - 1) + valid.substr(2)},
      {"HugeLength", Key(1, 2) + std::string(9, '\xff') + Bytes({0x01}) + "abc"},
      {"ElevenByteKey", Bytes({0x8a, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x80, 0x00})},
      {"ElevenByteVarintValue", Key(3, 0) + std::string(10, '\xff') + Bytes({0x01})},
      {"ElevenByteLength", Key(1, 2) + std::string(10, '\x80') + Bytes({0x00})},
      {"ElevenByteVarintInside",
       LengthDelimited(1, Key(2, 0) + std::string(10, '\x80') + Bytes({0x00}))},
      {"StartGroup", Bytes({0x0b, 0x0c})},
      {"EndGroup", Bytes({0x0c})},
      {"GroupOfUnknownField", Key(7, 3) + Key(7, 4)},
      {"GroupAfterValidField", valid + Key(9, 3) + Key(9, 4)},
      {"GroupInside", LengthDelimited(1, Key(5, 3) + Key(5, 4))},
      {"WireType6", Bytes({0x0e})},
      {"WireType7", Bytes({0x0f, 0x00})},
      {"WireType6Inside", LengthDelimited(1, Bytes({0x16, 0x00}))},
      {"FieldZeroVarint", Bytes({0x00, 0x00})},
      {"FieldZeroLengthDelimited", Bytes({0x02, 0x00})},
      {"FieldZeroFixed32", Bytes({0x05, 1, 2, 3, 4})},
      {"FieldZeroAfterValidField", valid + Bytes({0x02, 0x01, 'x'})},
      {"FieldZeroInside", LengthDelimited(1, Bytes({0x00, 0x00}))},
      // A key past 32 bits whose low bits read as field 1: protobuf refuses it.
      {"KeyOver32BitsAliasingField1", Varint((((uint64_t{1} << 32) | 1) << 3) | 2) + Varint(0)},
      {"TruncatedFixed64", Bytes({0x09, 1, 2, 3})},
      {"TruncatedFixed32", Bytes({0x0d, 1})},
      {"TruncatedInside", LengthDelimited(1, Bytes({0x1a, 0x05, 'a'}))},
      {"InvalidUtf8Name", LengthDelimited(1, LengthDelimited(1, "\xff\xfe"))},
      {"Garbage", Bytes({0xde, 0xad, 0xbe, 0xef})},
  };
}

void ExpectPushRejected(absl::string_view bytes) {
  for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{{kWhole}, {1}, {2, 0}}) {
    PushRequest decoded;
    EXPECT_THAT(DecodePushRequest(Pieces(bytes, sizes), &decoded),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("malformed")));
  }
}

// ---- ReadParamsResponse --------------------------------------------------------------

// What ReadParamsResponse made of `bytes`, read from a string.
struct Streamed {
  absl::Status io;      // what it returned
  absl::Status blocks;  // what it said of the blocks
  size_t consumed = 0;  // bytes it read
  std::vector<v1::Parameter> headers;
  std::vector<std::string> contents;
  std::vector<bool> in_place;  // the content was where `where` said
  int asked = 0;               // calls of `where`
  bool outside = false;        // a byte around the memory `where` gave changed
  ParamsReadStats stats;
};

// Every block `offer` accepts gets memory of its size (between guard
// bytes); `fail_place_at`: the block whose placing fails (-1: none).
Streamed StreamDecode(const std::string& bytes,
                      const std::function<bool(const v1::Parameter&)>& offer = nullptr,
                      int fail_place_at = -1) {
  constexpr size_t kGuard = 64;
  Streamed out;
  std::vector<std::unique_ptr<std::string>> places;
  auto read = [&](char* dest, size_t n) {
    if (n > bytes.size() - out.consumed) return absl::UnavailableError("read past the message");
    std::memcpy(dest, bytes.data() + out.consumed, n);
    out.consumed += n;
    return absl::OkStatus();
  };
  auto where = [&](const v1::Parameter& header, uint64_t size) -> char* {
    ++out.asked;
    if ((offer && !offer(header)) || size > bytes.size()) return nullptr;
    places.push_back(std::make_unique<std::string>(size + 2 * kGuard, '#'));
    return places.back()->data() + kGuard;
  };
  auto place = [&](const v1::Parameter& header, const Segments& content) {
    if (static_cast<int>(out.headers.size()) == fail_place_at) {
      return absl::DataLossError("the test refuses this block");
    }
    out.headers.push_back(header);
    out.contents.push_back(SegmentsString(content));
    out.in_place.push_back(content.size() == 1 && !places.empty() &&
                           content[0].data() == places.back()->data() + kGuard);
    return absl::OkStatus();
  };
  out.io = ReadParamsResponse(bytes.size(), read, where, place, &out.blocks, &out.stats);
  for (const auto& p : places) {
    const std::string guard(kGuard, '#');
    if (p->compare(0, kGuard, guard) != 0 || p->compare(p->size() - kGuard, kGuard, guard) != 0) {
      out.outside = true;
    }
  }
  return out;
}

// ReadParamsResponse reads `bytes` whole, writes nothing outside the memory
// it was given, and agrees with DecodeParamsResponse (`want`, `status`).
void ExpectStreamedAgrees(const std::string& bytes, const absl::Status& status,
                          const ParamsResponse& want) {
  const Streamed streamed = StreamDecode(bytes);
  ASSERT_OK(streamed.io);
  EXPECT_EQ(streamed.consumed, bytes.size());
  EXPECT_FALSE(streamed.outside);
  EXPECT_EQ(streamed.blocks.code(), status.code()) << streamed.blocks;
  if (!status.ok() || !streamed.blocks.ok()) return;
  ASSERT_EQ(streamed.headers.size(), want.headers.size());
  for (size_t i = 0; i < want.headers.size(); ++i) {
    v1::Parameter wanted = want.headers[i], got = streamed.headers[i];
    wanted.DiscardUnknownFields();
    got.DiscardUnknownFields();
    EXPECT_TRUE(ProtoEq(wanted, got));
    EXPECT_TRUE(SameBytes(SegmentsString(want.contents[i]), streamed.contents[i]));
  }
}

void ExpectParamsRejected(absl::string_view bytes) {
  for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{{kWhole}, {1}, {2, 0}}) {
    ParamsResponse decoded;
    EXPECT_THAT(DecodeParamsResponse(Pieces(bytes, sizes), &decoded),
                StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  }
  const Streamed streamed = StreamDecode(std::string(bytes));
  ASSERT_OK(streamed.io);
  EXPECT_EQ(streamed.consumed, bytes.size());
  EXPECT_FALSE(streamed.outside);
  EXPECT_THAT(streamed.blocks, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
}

TEST(ReadParamsResponseTest, ContentGoesWhereItIsOfferedAndTheRestThroughABuffer) {
  const std::vector<BuiltBlock> blocks = SampleBlocks();
  const std::string bytes = Flatten(Build(blocks)) + LengthDelimited(9, "unknown field");
  // Memory for every block but "large2" (its content goes to a buffer).
  const Streamed streamed =
      StreamDecode(bytes, [](const v1::Parameter& header) { return header.name() != "large2"; });
  ASSERT_OK(streamed.io);
  ASSERT_OK(streamed.blocks);
  EXPECT_EQ(streamed.consumed, bytes.size());
  EXPECT_FALSE(streamed.outside);
  ASSERT_EQ(streamed.headers.size(), blocks.size());
  uint64_t in_place = 0, buffered = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    SCOPED_TRACE(blocks[i].header.name());
    EXPECT_TRUE(ProtoEq(blocks[i].header, streamed.headers[i]));
    EXPECT_TRUE(SameBytes(blocks[i].content, streamed.contents[i]));
    const bool offered = blocks[i].header.name() != "large2" && !blocks[i].content.empty();
    EXPECT_EQ(streamed.in_place[i], offered);
    (offered ? in_place : buffered) += blocks[i].content.size();
  }
  EXPECT_EQ(streamed.stats.bytes_in_place, in_place);
  EXPECT_EQ(streamed.stats.bytes_buffered, buffered);
  EXPECT_EQ(streamed.asked, static_cast<int>(blocks.size()) - 1);  // not for the empty block
}

TEST(ReadParamsResponseTest, AContentThatIsNotTheBlocksLastFieldIsNotOffered) {
  // Content first, then the header's fields: the header is not complete
  // when the content arrives, so it goes to a buffer; placed as protobuf reads it.
  const v1::Parameter header = Param("w", v1::FLOAT32, {4}, Block(0, 1, 0));
  const std::string content = Pattern(16, 1);
  const std::string bytes =
      LengthDelimited(1, LengthDelimited(4, content) + header.SerializeAsString());
  const Streamed streamed = StreamDecode(bytes);
  ASSERT_OK(streamed.blocks);
  EXPECT_EQ(streamed.asked, 0);
  ASSERT_EQ(streamed.headers.size(), 1u);
  EXPECT_TRUE(ProtoEq(header, streamed.headers[0]));
  EXPECT_EQ(streamed.contents[0], content);
  EXPECT_EQ(streamed.stats.bytes_buffered, content.size());
}

TEST(ReadParamsResponseTest, APlaceErrorEndsTheBlocksAndTheRestIsReadAndDropped) {
  const std::vector<BuiltBlock> blocks = SampleBlocks();
  const std::string bytes = Flatten(Build(blocks));
  const Streamed streamed = StreamDecode(bytes, nullptr, /*fail_place_at=*/2);
  ASSERT_OK(streamed.io);
  EXPECT_THAT(streamed.blocks, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("refuses")));
  EXPECT_EQ(streamed.headers.size(), 2u);
  EXPECT_EQ(streamed.asked, 2);  // nothing asked after the error (block 1 is empty)
  EXPECT_EQ(streamed.consumed, bytes.size());
}

TEST(ReadParamsResponseTest, AContentLengthPastTheBlockIsMalformedAndWritesNothing) {
  // A block claiming 1000 bytes of content in a message of 20: DATA_LOSS,
  // no memory asked for, every byte read.
  const std::string bytes =
      LengthDelimited(1, LengthDelimited(1, "w") + Key(4, 2) + Varint(1000) + "abcd");
  const Streamed streamed = StreamDecode(bytes);
  ASSERT_OK(streamed.io);
  EXPECT_THAT(streamed.blocks, StatusIs(absl::StatusCode::kDataLoss, HasSubstr("malformed")));
  EXPECT_EQ(streamed.asked, 0);
  EXPECT_EQ(streamed.consumed, bytes.size());
}

TEST(ReadParamsResponseTest, AReadErrorIsReturned) {
  const std::string bytes = Flatten(Build(SampleBlocks()));
  absl::Status blocks;
  ParamsReadStats stats;
  size_t consumed = 0;
  const absl::Status io = ReadParamsResponse(
      bytes.size(),
      [&](char* dest, size_t n) {
        if (consumed + n > 1000) return absl::UnavailableError("connection lost");
        std::memcpy(dest, bytes.data() + consumed, n);
        consumed += n;
        return absl::OkStatus();
      },
      [](const v1::Parameter&, uint64_t) -> char* { return nullptr; },
      [](const v1::Parameter&, const Segments&) { return absl::OkStatus(); }, &blocks, &stats);
  EXPECT_THAT(io, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("connection lost")));
}

TEST(DecodePushRequestTest, RequestIdWithWrongWireTypeIsAnUnknownField) {
  // Field 3 as a varint and field 4 as fixed64: protobuf keeps both as
  // unknown fields, so neither is the request id.
  const std::string bytes = Bytes({0x18, 0x05, 0x21, 1, 0, 0, 0, 0, 0, 0, 0});
  v1::PushPullRequest check;
  ASSERT_TRUE(check.ParseFromString(bytes));
  EXPECT_EQ(check.client_id(), 0u);
  EXPECT_EQ(check.sequence(), 0u);
  PushRequest decoded;
  ASSERT_OK(DecodePushRequest(OneSlice(bytes), &decoded));
  EXPECT_EQ(decoded.client_id, 0u);
  EXPECT_EQ(decoded.sequence, 0u);
}

TEST(DecodeRobustnessTest, MalformedPushRequestIsInvalidArgument) {
  for (const BadCase& c : MalformedMessages()) {
    SCOPED_TRACE(c.name);
    ExpectPushRejected(c.bytes);
  }
}

TEST(DecodeRobustnessTest, MalformedParamsResponseIsDataLoss) {
  for (const BadCase& c : MalformedMessages()) {
    SCOPED_TRACE(c.name);
    ExpectParamsRejected(c.bytes);
  }
}

TEST(DecodeRobustnessTest, MalformedPartsOnlyOneMessageHas) {
  // PushPullRequest.params (field 2) must be a ParamRef.
  ExpectPushRejected(LengthDelimited(2, Bytes({0x0a, 0x05})));
  // A key past 32 bits whose low bits read as the content field.
  ExpectPushRejected(LengthDelimited(1, Varint((((uint64_t{1} << 32) | 3) << 3) | 2) + "\x01x"));
  ExpectParamsRejected(LengthDelimited(1, Varint((((uint64_t{1} << 32) | 4) << 3) | 2) + "\x01x"));
  // A packed shape (Parameter field 3) whose last varint is cut.
  ExpectParamsRejected(LengthDelimited(1, LengthDelimited(3, Bytes({0x01, 0x80}))));
}

TEST(DecodeRobustnessTest, NamesThatAreNotUtf8AreMalformedAndSayWhere) {
  // Names are `bytes` on the wire, so protobuf takes (and no longer logs)
  // them; the decoders refuse what is not UTF-8, naming the byte.
  const std::string message = LengthDelimited(1, LengthDelimited(1, "ok\xc0\xaf"));
  constexpr char kWhy[] =
      "parameter name \"ok\\300\\257\": name is not valid UTF-8 (byte 0xc0 "
      "at offset 2)";
  PushRequest push;
  EXPECT_THAT(DecodePushRequest(Pieces(message, {kWhole}), &push),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(StartsWith("malformed push request: "), HasSubstr(kWhy))));
  ParamsResponse params;
  EXPECT_THAT(DecodeParamsResponse(Pieces(message, {kWhole}), &params),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(StartsWith("malformed response: "), HasSubstr(kWhy))));
  // PushPullRequest.params (field 2) names parameters too.
  PushRequest refs;
  EXPECT_THAT(
      DecodePushRequest(Pieces(LengthDelimited(2, LengthDelimited(1, "\xff")), {kWhole}), &refs),
      StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not valid UTF-8")));
}

TEST(DecodeRobustnessTest, NamesKeepTheirLength) {
  // "a\0b" arrives whole, so the store can refuse it; it never reads as "a".
  const std::string nul("a\0b", 3);
  PushRequest push;
  ASSERT_OK(
      DecodePushRequest(Pieces(LengthDelimited(1, LengthDelimited(1, nul)), {kWhole}), &push));
  ASSERT_EQ(push.grads.size(), 1u);
  EXPECT_EQ(push.grads[0].name, nul);
}

// Where each top-level field of `bytes` ends (all are length-delimited with a
// one-byte key, as the encoders write them), and 0.
std::vector<size_t> FieldEnds(const std::string& bytes) {
  std::vector<size_t> ends = {0};
  size_t at = 0;
  while (at < bytes.size()) {
    ++at;  // key
    uint64_t length = 0;
    for (int shift = 0;; shift += 7) {
      const uint8_t b = static_cast<uint8_t>(bytes[at++]);
      length |= static_cast<uint64_t>(b & 0x7f) << shift;
      if ((b & 0x80) == 0) break;
    }
    at += length;
    ends.push_back(at);
  }
  EXPECT_EQ(at, bytes.size());
  return ends;
}

TEST(DecodeRobustnessTest, EveryTruncatedPushRequestIsRejected) {
  const std::vector<v1::Gradient> small = {
      Grad("a", v1::FLOAT32, Pattern(8, 1), Block(1, 2, 3), 0.5),
      Grad("bb", v1::INT64, Pattern(16, 2)), Grad("", v1::FLOAT32, "")};
  const std::vector<v1::Gradient> large = {Grad("a", v1::FLOAT32, Pattern(8, 1)),
                                           Grad("big", v1::FLOAT32, Pattern(40000, 3))};
  for (const auto& [grads, stride] :
       {std::make_pair(small, size_t{1}), std::make_pair(large, size_t{397})}) {
    Counter released;
    PayloadLease* lease = PayloadLease::Create(released.Callback());
    std::string bytes;
    {
      const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), SampleRefs(), lease);
      bytes = Flatten(buffer);
    }
    lease->Release();
    const std::vector<size_t> ends = FieldEnds(bytes);
    ASSERT_EQ(ends.size(), grads.size() + SampleRefs().size() + 1);
    std::vector<size_t> lengths;
    for (size_t n = 0; n <= bytes.size(); n += stride) lengths.push_back(n);
    lengths.insert(lengths.end(), ends.begin(), ends.end());
    for (size_t e : ends) {
      if (e > 0) lengths.push_back(e - 1);
      lengths.push_back(e + 1);
    }
    for (size_t n : lengths) {
      if (n > bytes.size()) continue;
      SCOPED_TRACE(absl::StrCat("prefix of ", n, " of ", bytes.size(), " bytes"));
      const int complete = static_cast<int>(std::find(ends.begin(), ends.end(), n) - ends.begin());
      for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{{kWhole}, {5}}) {
        PushRequest decoded;
        const absl::Status status = DecodePushRequest(Pieces(bytes.substr(0, n), sizes), &decoded);
        if (complete < static_cast<int>(ends.size())) {
          // Whole fields only: a shorter but well-formed request.
          ASSERT_OK(status);
          const size_t fields = complete;
          EXPECT_EQ(decoded.grads.size(), std::min(fields, grads.size()));
          EXPECT_EQ(decoded.refs.size(), fields - std::min(fields, grads.size()));
        } else {
          EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kInvalidArgument));
        }
      }
    }
  }
}

TEST(DecodeRobustnessTest, EveryTruncatedParamsResponseIsRejected) {
  std::vector<BuiltBlock> blocks = {
      {Param("a", v1::FLOAT32, {2}, Block(0, 1, 0)), Pattern(8, 1)},
      {Param("", v1::INT64, {}), Pattern(8, 2)},
      {Param("e", v1::FLOAT64, {0}), ""},
  };
  const std::string bytes = Flatten(Build(blocks));
  const std::vector<size_t> ends = FieldEnds(bytes);
  ASSERT_EQ(ends.size(), blocks.size() + 1);
  for (size_t n = 0; n <= bytes.size(); ++n) {
    SCOPED_TRACE(absl::StrCat("prefix of ", n, " of ", bytes.size(), " bytes"));
    const auto it = std::find(ends.begin(), ends.end(), n);
    for (const std::vector<size_t>& sizes : std::vector<std::vector<size_t>>{{kWhole}, {3}}) {
      ParamsResponse decoded;
      const absl::Status status = DecodeParamsResponse(Pieces(bytes.substr(0, n), sizes), &decoded);
      if (it != ends.end()) {
        ASSERT_OK(status);
        EXPECT_EQ(decoded.headers.size(), static_cast<size_t>(it - ends.begin()));
      } else {
        EXPECT_THAT(status, StatusCodeIs(absl::StatusCode::kDataLoss));
      }
      ExpectStreamedAgrees(bytes.substr(0, n), status, decoded);
    }
  }
}

// Decodes `buffer` both ways. Any result must be the right error or agree with
// protobuf's own reading of the same bytes.
void DecodeAndCheck(const std::string& bytes, const grpc::ByteBuffer& buffer) {
  PushRequest push;
  const absl::Status push_status = DecodePushRequest(buffer, &push);
  if (!push_status.ok()) {
    EXPECT_THAT(push_status, StatusCodeIs(absl::StatusCode::kInvalidArgument));
  } else {
    ASSERT_EQ(push.grads.size(), push.headers.size());
    for (size_t i = 0; i < push.grads.size(); ++i) {
      const GradientView& view = push.grads[i];
      EXPECT_EQ(view.name, push.headers[i].name());
      EXPECT_EQ(view.type, push.headers[i].element_type());
      EXPECT_TRUE(push.headers[i].content().empty());
      if (!view.content.empty()) {
        EXPECT_TRUE(Aligned(view.content, view.type));
        EXPECT_NE(Locate(push, view.content), Where::kNowhere);
      }
    }
    v1::PushPullRequest want;
    ASSERT_TRUE(want.ParseFromString(bytes)) << "decoded bytes protobuf rejects";
    want.DiscardUnknownFields();
    for (v1::Gradient& header : push.headers) header.DiscardUnknownFields();
    for (v1::ParamRef& ref : push.refs) ref.DiscardUnknownFields();
    for (GradientView& view : push.grads) view.block.DiscardUnknownFields();
    ExpectDecodedMatches(want, push);
  }

  ParamsResponse params;
  const absl::Status params_status = DecodeParamsResponse(buffer, &params);
  if (!params_status.ok()) {
    EXPECT_THAT(params_status, StatusCodeIs(absl::StatusCode::kDataLoss));
  } else {
    ASSERT_EQ(params.headers.size(), params.contents.size());
    v1::GetParamsResponse want;
    ASSERT_TRUE(want.ParseFromString(bytes)) << "decoded bytes protobuf rejects";
    want.DiscardUnknownFields();
    ASSERT_EQ(params.headers.size(), static_cast<size_t>(want.parameters_size()));
    for (size_t i = 0; i < params.headers.size(); ++i) {
      EXPECT_TRUE(params.headers[i].content().empty());
      params.headers[i].DiscardUnknownFields();
      EXPECT_TRUE(ProtoEq(Header(want.parameters(i)), params.headers[i]));
      EXPECT_TRUE(SameBytes(want.parameters(i).content(), SegmentsString(params.contents[i])));
    }
  }
  ExpectStreamedAgrees(bytes, params_status, params);
}

TEST(DecodeRobustnessTest, RandomMutationsNeverCrash) {
  std::vector<std::string> seeds;
  {
    const std::vector<v1::Gradient> grads = {
        Grad("a", v1::FLOAT32, Pattern(16, 1), Block(1, 2, 3), 0.5),
        Grad("bb", v1::FLOAT64, Pattern(40, 2)), Grad("", v1::FLOAT32, ""),
        Grad("c", v1::BFLOAT16, Pattern(300, 3), std::nullopt, 2.0)};
    Counter released;
    PayloadLease* lease = PayloadLease::Create(released.Callback());
    seeds.push_back(Flatten(EncodePushRequest(ViewsOf(grads), SampleRefs(), lease)));
    lease->Release();
    ASSERT_EQ(released.calls, 1);
    seeds.push_back(
        Flatten(Build({{Param("w", v1::FLOAT32, {2, 2}, Block(0, 2, 0)), Pattern(16, 4)},
                       {Param("x", v1::INT64, {40}), Pattern(320, 5)},
                       {Param("", v1::FLOAT64, {}), ""}})));
  }
  const std::string interesting =
      Bytes({0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x0a, 0x0b, 0x12, 0x1a, 0x22, 0x7f, 0x80, 0xff});
  std::mt19937 rng(20240601);
  auto uniform = [&](size_t n) { return std::uniform_int_distribution<size_t>(0, n - 1)(rng); };
  int ok_push = 0;
  for (int iteration = 0; iteration < 2000; ++iteration) {
    std::string bytes = seeds[iteration % seeds.size()];
    const int mutations = 1 + static_cast<int>(uniform(4));
    for (int m = 0; m < mutations; ++m) {
      const size_t at = bytes.empty() ? 0 : uniform(bytes.size());
      switch (uniform(7)) {
        case 0:
          if (!bytes.empty()) bytes[at] ^= static_cast<char>(1 << uniform(8));
          break;
        case 1:
          if (!bytes.empty()) bytes[at] = static_cast<char>(uniform(256));
          break;
        case 2:
          if (!bytes.empty()) bytes[at] = interesting[uniform(interesting.size())];
          break;
        case 3:
          bytes.insert(at, 1, static_cast<char>(uniform(256)));
          break;
        case 4:
          if (!bytes.empty()) bytes.erase(at, 1 + uniform(8));
          break;
        case 5:
          bytes.resize(at);
          break;
        case 6:
          if (!bytes.empty()) {
            const std::string piece = bytes.substr(uniform(bytes.size()), 1 + uniform(16));
            bytes.insert(at, piece);
          }
          break;
      }
    }
    std::vector<size_t> sizes;
    if (uniform(4) == 0) {
      sizes = {kWhole};
    } else {
      for (int i = 0; i < 5; ++i) sizes.push_back(uniform(12));
      sizes.push_back(1 + uniform(12));
    }
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    DecodeAndCheck(bytes, Pieces(bytes, sizes));
    PushRequest probe;
    if (DecodePushRequest(OneSlice(bytes), &probe).ok()) ++ok_push;
    if (::testing::Test::HasFailure()) break;
  }
  // The loop exercised both outcomes.
  EXPECT_GT(ok_push, 0);
  EXPECT_LT(ok_push, 2000);
}

TEST(DecodeRobustnessTest, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  for (int iteration = 0; iteration < 1000; ++iteration) {
    std::string bytes(std::uniform_int_distribution<size_t>(0, 48)(rng), '\0');
    for (char& c : bytes) c = static_cast<char>(std::uniform_int_distribution<int>(0, 255)(rng));
    SCOPED_TRACE(absl::StrCat("iteration ", iteration));
    DecodeAndCheck(bytes, Pieces(bytes, {3, 1, 0, 4}));
    if (::testing::Test::HasFailure()) break;
  }
}

// ---- PayloadLease -----------------------------------------------------------------

TEST(PayloadLeaseTest, ReleaseWithNothingBorrowedFiresAtOnce) {
  Counter released;
  PayloadLease::Create(released.Callback())->Release();
  EXPECT_EQ(released.calls, 1);
}

TEST(PayloadLeaseTest, BorrowedSlicePointsAtCallersMemory) {
  const std::string bytes = Pattern(100, 1);
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    const grpc::Slice slice = lease->Borrow(bytes);
    EXPECT_EQ(reinterpret_cast<const char*>(slice.begin()), bytes.data());
    EXPECT_EQ(slice.size(), bytes.size());
  }
  EXPECT_EQ(released.calls, 0);
  lease->Release();
  EXPECT_EQ(released.calls, 1);
}

TEST(PayloadLeaseTest, ReleaseFirstThenSlices) {
  const std::string a = Pattern(10, 1), b = Pattern(20, 2);
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  std::optional<grpc::Slice> slice_a(lease->Borrow(a));
  std::optional<grpc::Slice> slice_b(lease->Borrow(b));
  std::optional<grpc::Slice> copy_of_a(*slice_a);  // another reference, same slice
  lease->Release();
  EXPECT_EQ(released.calls, 0);
  slice_a.reset();
  EXPECT_EQ(released.calls, 0);
  slice_b.reset();
  EXPECT_EQ(released.calls, 0);
  copy_of_a.reset();
  EXPECT_EQ(released.calls, 1);
}

TEST(PayloadLeaseTest, EncodedBufferDestroyedThenRelease) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  {
    const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), SampleRefs(), lease);
    const grpc::ByteBuffer copy = buffer;  // shares the slices
  }
  EXPECT_EQ(released.calls, 0) << "the owner has not released yet";
  lease->Release();
  EXPECT_EQ(released.calls, 1);
}

TEST(PayloadLeaseTest, ReleaseThenEncodedBufferDestroyed) {
  const std::vector<v1::Gradient> grads = SampleGradients();
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  std::optional<grpc::ByteBuffer> buffer(EncodePushRequest(ViewsOf(grads), {}, lease));
  std::optional<grpc::ByteBuffer> copy(*buffer);
  std::vector<grpc::Slice> dumped;
  ASSERT_TRUE(buffer->Dump(&dumped).ok());
  lease->Release();
  EXPECT_EQ(released.calls, 0);
  buffer.reset();
  EXPECT_EQ(released.calls, 0) << "a copy of the buffer still holds the slices";
  copy.reset();
  EXPECT_EQ(released.calls, 0) << "slices dumped from the buffer are still alive";
  dumped.clear();
  EXPECT_EQ(released.calls, 1);
}

TEST(PayloadLeaseTest, SmallContentsOnlyBorrowNothing) {
  const std::vector<v1::Gradient> grads = {Grad("a", v1::FLOAT32, Pattern(kInlineLimit, 1)),
                                           Grad("b", v1::FLOAT32, Pattern(8, 2))};
  Counter released;
  PayloadLease* lease = PayloadLease::Create(released.Callback());
  const grpc::ByteBuffer buffer = EncodePushRequest(ViewsOf(grads), {}, lease);
  lease->Release();
  EXPECT_EQ(released.calls, 1) << "inline contents hold no reference";
  v1::SendGradsRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.gradients_size(), 2);
}

// Release and the last slice's destruction race from two threads; the
// callback still runs exactly once.
TEST(PayloadLeaseTest, ConcurrentReleaseAndUnrefFireOnce) {
  const std::string bytes = Pattern(64, 3);
  for (int i = 0; i < 200; ++i) {
    std::atomic<int> calls{0};
    PayloadLease* lease = PayloadLease::Create([&calls] { calls.fetch_add(1); });
    auto slice = std::make_unique<grpc::Slice>(lease->Borrow(bytes));
    std::thread releaser([lease] { lease->Release(); });
    std::thread dropper([&slice] { slice.reset(); });
    releaser.join();
    dropper.join();
    ASSERT_EQ(calls.load(), 1) << "round " << i;
  }
}

}  // namespace
}  // namespace pserver
