#include "cc/core/tensor.h"

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cc/core/element_type.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusIs;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

// ---- NumElements / ShapeString ---------------------------------------------

TEST(NumElementsTest, ScalarShapeHasOneElement) {
  ASSERT_OK_AND_ASSIGN(int64_t n, NumElements({}));
  EXPECT_EQ(n, 1);
}

TEST(NumElementsTest, MultipliesDimensions) {
  ASSERT_OK_AND_ASSIGN(int64_t n, NumElements({2, 3, 4}));
  EXPECT_EQ(n, 24);
}

TEST(NumElementsTest, ZeroDimensionGivesZeroElements) {
  ASSERT_OK_AND_ASSIGN(int64_t a, NumElements({0}));
  EXPECT_EQ(a, 0);
  ASSERT_OK_AND_ASSIGN(int64_t b, NumElements({5, 0, 7}));
  EXPECT_EQ(b, 0);
  // A zero before a huge dimension must not be mistaken for an overflow.
  ASSERT_OK_AND_ASSIGN(int64_t c, NumElements({0, kInt64Max, kInt64Max}));
  EXPECT_EQ(c, 0);
}

TEST(NumElementsTest, NegativeDimensionIsInvalid) {
  EXPECT_THAT(NumElements({2, -1, 3}),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("shape [2, -1, 3] has a negative dimension")));
  // Also after a zero dimension.
  EXPECT_THAT(NumElements({0, -4}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(NumElementsTest, OverflowIsInvalid) {
  // 2^32 * 2^32 = 2^64 does not fit in int64.
  const int64_t two_32 = int64_t{1} << 32;
  EXPECT_THAT(NumElements({two_32, two_32}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  EXPECT_THAT(NumElements({kInt64Max, 2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  // The largest product that fits is fine.
  ASSERT_OK_AND_ASSIGN(int64_t n, NumElements({kInt64Max, 1}));
  EXPECT_EQ(n, kInt64Max);
}

TEST(ShapeStringTest, FormatsDimensions) {
  EXPECT_EQ(ShapeString({}), "[]");
  EXPECT_EQ(ShapeString({7}), "[7]");
  EXPECT_EQ(ShapeString({2, 3}), "[2, 3]");
  EXPECT_EQ(ShapeString({1, -2, 0}), "[1, -2, 0]");
}

// ---- Tensor -----------------------------------------------------------------

TEST(TensorTest, DefaultIsEmptyAndUnspecified) {
  Tensor t;
  EXPECT_EQ(t.type(), v1::ELEMENT_TYPE_UNSPECIFIED);
  EXPECT_THAT(t.shape(), IsEmpty());
  EXPECT_EQ(t.num_elements(), 0);
  EXPECT_EQ(t.byte_size(), 0u);
}

TEST(TensorTest, CreateKeepsTypeShapeAndBytes) {
  std::vector<int32_t> values = {1, -2, 3, -4, 5, -6};
  std::string bytes(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t));
  ASSERT_OK_AND_ASSIGN(Tensor t, Tensor::Create(v1::INT32, {2, 3}, bytes));
  EXPECT_EQ(t.type(), v1::INT32);
  EXPECT_THAT(t.shape(), ElementsAre(2, 3));
  EXPECT_EQ(t.num_elements(), 6);
  EXPECT_EQ(t.byte_size(), 24u);
  EXPECT_EQ(t.bytes(), bytes);
  EXPECT_THAT(t.values<int32_t>(), ElementsAre(1, -2, 3, -4, 5, -6));
  EXPECT_EQ(t.DebugString(), "int32[2, 3]");
}

TEST(TensorTest, CreateScalar) {
  double v = 2.5;
  ASSERT_OK_AND_ASSIGN(
      Tensor t, Tensor::Create(v1::FLOAT64, {}, std::string(reinterpret_cast<char*>(&v), 8)));
  EXPECT_EQ(t.num_elements(), 1);
  EXPECT_THAT(t.values<double>(), ElementsAre(2.5));
  EXPECT_EQ(t.DebugString(), "float64[]");
}

TEST(TensorTest, CreateSizeMismatchNamesTypeShapeAndSizes) {
  // float32[2, 3] needs 6 * 4 = 24 bytes.
  EXPECT_THAT(Tensor::Create(v1::FLOAT32, {2, 3}, std::string(20, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor float32[2, 3] needs 24 bytes, got 20")));
  EXPECT_THAT(Tensor::Create(v1::UINT64, {2}, std::string(24, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("tensor uint64[2] needs 16 bytes, got 24")));
}

TEST(TensorTest, CreateRejectsBadShapeAndType) {
  EXPECT_THAT(Tensor::Create(v1::FLOAT32, {-1}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
  EXPECT_THAT(Tensor::Create(v1::FLOAT16, {1}, std::string(2, '\0')),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("element type float16 cannot be stored")));
  EXPECT_THAT(Tensor::Create(v1::ELEMENT_TYPE_UNSPECIFIED, {}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unspecified")));
}

TEST(TensorTest, CreateRejectsByteCountOverflow) {
  // 2^61 float64 elements fit in int64, but 2^61 * 8 bytes = 2^64 wraps to 0
  // in size_t: an empty string must not pass for that tensor.
  const int64_t n = int64_t{1} << 61;
  EXPECT_THAT(Tensor::Create(v1::FLOAT64, {n}, ""),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
  EXPECT_THAT(Tensor::Zeros(v1::FLOAT64, {n}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("too large")));
}

TEST(TensorTest, ZerosHasZeroBytesOfTheRightSize) {
  ASSERT_OK_AND_ASSIGN(Tensor f, Tensor::Zeros(v1::FLOAT32, {3, 2}));
  EXPECT_EQ(f.type(), v1::FLOAT32);
  EXPECT_THAT(f.shape(), ElementsAre(3, 2));
  EXPECT_EQ(f.byte_size(), 24u);
  EXPECT_THAT(f.values<float>(), ElementsAre(0, 0, 0, 0, 0, 0));

  ASSERT_OK_AND_ASSIGN(Tensor u, Tensor::Zeros(v1::UINT64, {2}));
  EXPECT_EQ(u.byte_size(), 16u);
  EXPECT_THAT(u.values<uint64_t>(), ElementsAre(0u, 0u));

  ASSERT_OK_AND_ASSIGN(Tensor empty, Tensor::Zeros(v1::INT64, {4, 0}));
  EXPECT_EQ(empty.byte_size(), 0u);
  EXPECT_EQ(empty.num_elements(), 0);
}

TEST(TensorTest, ZerosRejectsBadTypeAndShape) {
  EXPECT_THAT(Tensor::Zeros(v1::BFLOAT16, {2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16")));
  EXPECT_THAT(Tensor::Zeros(v1::FLOAT32, {3, -2}),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(TensorTest, FromValuesKeepsShapeWhenCountsMatch) {
  Tensor w = Tensor::FromValues<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  EXPECT_EQ(w.type(), v1::FLOAT32);
  EXPECT_THAT(w.shape(), ElementsAre(2, 3));
  EXPECT_EQ(w.num_elements(), 6);
  EXPECT_EQ(w.byte_size(), 24u);
  EXPECT_THAT(w.values<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
  EXPECT_THAT(w.ToVector<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(TensorTest, FromValuesFallsBackToFlatShape) {
  std::vector<int64_t> values = {10, 20, 30, 40, 50};
  Tensor t = Tensor::FromValues<int64_t>({2, 3}, values);  // needs 6 values
  EXPECT_EQ(t.type(), v1::INT64);
  EXPECT_THAT(t.shape(), ElementsAre(5));
  EXPECT_THAT(t.values<int64_t>(), ElementsAre(10, 20, 30, 40, 50));

  Tensor bad_shape = Tensor::FromValues<double>({-1}, {1.5, 2.5});
  EXPECT_THAT(bad_shape.shape(), ElementsAre(2));
}

TEST(TensorTest, FromValuesEveryStorableType) {
  EXPECT_EQ(Tensor::FromValues<int32_t>({1}, {-7}).type(), v1::INT32);
  EXPECT_EQ(Tensor::FromValues<uint32_t>({1}, {7u}).type(), v1::UINT32);
  EXPECT_EQ(Tensor::FromValues<int64_t>({1}, {-7}).type(), v1::INT64);
  EXPECT_EQ(Tensor::FromValues<uint64_t>({1}, {7u}).type(), v1::UINT64);
  EXPECT_EQ(Tensor::FromValues<float>({1}, {7.f}).type(), v1::FLOAT32);
  EXPECT_EQ(Tensor::FromValues<double>({1}, {7.0}).type(), v1::FLOAT64);
}

TEST(TensorTest, ValuesOfWrongTypeIsEmpty) {
  Tensor t = Tensor::FromValues<float>({2}, {1.f, 2.f});
  EXPECT_THAT(t.values<float>(), ElementsAre(1.f, 2.f));
  // Same width, different type.
  EXPECT_THAT(t.values<int32_t>(), IsEmpty());
  EXPECT_THAT(t.values<uint32_t>(), IsEmpty());
  EXPECT_THAT(t.values<double>(), IsEmpty());
  EXPECT_THAT(t.mutable_values<int32_t>(), IsEmpty());
  EXPECT_THAT(t.ToVector<double>(), IsEmpty());
}

TEST(TensorTest, MutableValuesWritesThrough) {
  Tensor t = Tensor::FromValues<int32_t>({3}, {1, 2, 3});
  absl::Span<int32_t> v = t.mutable_values<int32_t>();
  ASSERT_EQ(v.size(), 3u);
  v[1] = 42;
  EXPECT_THAT(t.values<int32_t>(), ElementsAre(1, 42, 3));
}

TEST(TensorTest, ReleaseBytesMovesTheContentOut) {
  Tensor t = Tensor::FromValues<uint32_t>({2}, {0x04030201u, 0x08070605u});
  std::string bytes = std::move(t).ReleaseBytes();
  // Little-endian element bytes, in order.
  EXPECT_EQ(bytes, std::string("\x01\x02\x03\x04\x05\x06\x07\x08", 8));
  static_assert(std::is_same_v<decltype(std::move(t).ReleaseBytes()), std::string&&>);
}

// ---- element_type.h -----------------------------------------------------------

// ---- views -------------------------------------------------------------------

TEST(TensorViewTest, ViewBorrowsTheCallersBytes) {
  const float values[] = {1, 2, 3, 4, 5, 6};
  absl::StatusOr<Tensor> t = Tensor::View(v1::FLOAT32, {2, 3}, values, sizeof values);
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_TRUE(t->is_view());
  EXPECT_EQ(t->data(), reinterpret_cast<const char*>(values));
  EXPECT_EQ(t->bytes().data(), reinterpret_cast<const char*>(values));
  EXPECT_EQ(t->byte_size(), sizeof values);
  EXPECT_EQ(t->num_elements(), 6);
  EXPECT_THAT(t->ToVector<float>(), ElementsAre(1, 2, 3, 4, 5, 6));
}

TEST(TensorViewTest, ViewIsCheckedLikeCreate) {
  const float values[] = {1, 2, 3};
  EXPECT_THAT(Tensor::View(v1::FLOAT32, {2, 3}, values, sizeof values).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("needs 24 bytes, got 12")));
  EXPECT_THAT(Tensor::View(v1::FLOAT32, {3}, nullptr, 12).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("NULL")));
  EXPECT_THAT(Tensor::MutableView(v1::FLOAT32, {-1}, nullptr, 0).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("negative")));
}

TEST(TensorViewTest, MutableViewWritesInPlace) {
  float buffer[4] = {};
  absl::StatusOr<Tensor> t = Tensor::MutableView(v1::FLOAT32, {4}, buffer, sizeof buffer);
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_EQ(t->mutable_data(), reinterpret_cast<char*>(buffer));
  t->mutable_values<float>()[2] = 7;
  EXPECT_EQ(buffer[2], 7);
  EXPECT_TRUE(t->is_view());
}

TEST(TensorViewTest, WritingAReadOnlyViewCopiesFirst) {
  const float values[] = {1, 2};
  absl::StatusOr<Tensor> t = Tensor::View(v1::FLOAT32, {2}, values, sizeof values);
  ASSERT_THAT(t.status(), IsOk());
  char* data = t->mutable_data();
  EXPECT_NE(data, reinterpret_cast<const char*>(values));
  EXPECT_FALSE(t->is_view());
  t->mutable_values<float>()[0] = 9;
  EXPECT_EQ(values[0], 1);
  EXPECT_THAT(t->ToVector<float>(), ElementsAre(9, 2));
}

TEST(TensorViewTest, CopyOfAViewOwnsItsBytes) {
  float buffer[2] = {1, 2};
  absl::StatusOr<Tensor> view = Tensor::MutableView(v1::FLOAT32, {2}, buffer, sizeof buffer);
  ASSERT_THAT(view.status(), IsOk());
  Tensor copy = *view;
  EXPECT_FALSE(copy.is_view());
  EXPECT_NE(copy.data(), reinterpret_cast<const char*>(buffer));
  EXPECT_EQ(copy.shape(), Shape{2});
  buffer[0] = 5;
  EXPECT_THAT(copy.ToVector<float>(), ElementsAre(1, 2));
  Tensor assigned;
  assigned = *view;
  EXPECT_FALSE(assigned.is_view());
  EXPECT_THAT(assigned.ToVector<float>(), ElementsAre(5, 2));
}

TEST(TensorViewTest, MoveKeepsTheBorrowAndEmptiesTheSource) {
  float buffer[2] = {1, 2};
  absl::StatusOr<Tensor> view = Tensor::MutableView(v1::FLOAT32, {2}, buffer, sizeof buffer);
  ASSERT_THAT(view.status(), IsOk());
  Tensor moved = std::move(*view);
  EXPECT_TRUE(moved.is_view());
  EXPECT_EQ(moved.mutable_data(), reinterpret_cast<char*>(buffer));
  EXPECT_FALSE(view->is_view());
  EXPECT_EQ(view->byte_size(), 0u);
  Tensor assigned;
  assigned = std::move(moved);
  EXPECT_EQ(assigned.data(), reinterpret_cast<const char*>(buffer));
}

TEST(TensorViewTest, ReleaseBytesOfAViewCopiesThem) {
  const int32_t values[] = {3, 4};
  absl::StatusOr<Tensor> t = Tensor::View(v1::INT32, {2}, values, sizeof values);
  ASSERT_THAT(t.status(), IsOk());
  std::string bytes = std::move(*t).ReleaseBytes();
  EXPECT_EQ(bytes, std::string(reinterpret_cast<const char*>(values), sizeof values));
}

TEST(TensorViewTest, EmptyViewOwnsNothing) {
  absl::StatusOr<Tensor> t = Tensor::View(v1::FLOAT32, {0}, nullptr, 0);
  ASSERT_THAT(t.status(), IsOk());
  EXPECT_FALSE(t->is_view());
  EXPECT_EQ(t->byte_size(), 0u);
}

TEST(ElementTypeTest, ElementSize) {
  EXPECT_EQ(ElementSize(v1::INT32), 4u);
  EXPECT_EQ(ElementSize(v1::UINT32), 4u);
  EXPECT_EQ(ElementSize(v1::FLOAT32), 4u);
  EXPECT_EQ(ElementSize(v1::INT64), 8u);
  EXPECT_EQ(ElementSize(v1::UINT64), 8u);
  EXPECT_EQ(ElementSize(v1::FLOAT64), 8u);
  EXPECT_EQ(ElementSize(v1::FLOAT16), 2u);
  EXPECT_EQ(ElementSize(v1::BFLOAT16), 2u);
  EXPECT_EQ(ElementSize(v1::ELEMENT_TYPE_UNSPECIFIED), 0u);
  EXPECT_EQ(ElementSize(static_cast<ElementType>(99)), 0u);
}

TEST(ElementTypeTest, ElementTypeName) {
  EXPECT_EQ(ElementTypeName(v1::INT32), "int32");
  EXPECT_EQ(ElementTypeName(v1::UINT32), "uint32");
  EXPECT_EQ(ElementTypeName(v1::INT64), "int64");
  EXPECT_EQ(ElementTypeName(v1::UINT64), "uint64");
  EXPECT_EQ(ElementTypeName(v1::FLOAT32), "float32");
  EXPECT_EQ(ElementTypeName(v1::FLOAT64), "float64");
  EXPECT_EQ(ElementTypeName(v1::FLOAT16), "float16");
  EXPECT_EQ(ElementTypeName(v1::BFLOAT16), "bfloat16");
  EXPECT_EQ(ElementTypeName(v1::ELEMENT_TYPE_UNSPECIFIED), "unspecified");
  EXPECT_EQ(ElementTypeName(static_cast<ElementType>(99)), "unknown(99)");
}

TEST(ElementTypeTest, FloatingPointAndInteger) {
  EXPECT_TRUE(IsFloatingPoint(v1::FLOAT32));
  EXPECT_TRUE(IsFloatingPoint(v1::FLOAT64));
  EXPECT_FALSE(IsFloatingPoint(v1::FLOAT16));  // transport-only
  EXPECT_FALSE(IsFloatingPoint(v1::INT32));
  EXPECT_TRUE(IsInteger(v1::INT32));
  EXPECT_TRUE(IsInteger(v1::UINT32));
  EXPECT_TRUE(IsInteger(v1::INT64));
  EXPECT_TRUE(IsInteger(v1::UINT64));
  EXPECT_FALSE(IsInteger(v1::FLOAT64));
  EXPECT_FALSE(IsInteger(v1::ELEMENT_TYPE_UNSPECIFIED));
}

TEST(ElementTypeTest, ValidateStorableTypeAcceptsTheSixStoredTypes) {
  for (ElementType type :
       {v1::INT32, v1::UINT32, v1::INT64, v1::UINT64, v1::FLOAT32, v1::FLOAT64}) {
    EXPECT_THAT(ValidateStorableType(type, "parameter 'w'"), IsOk()) << ElementTypeName(type);
  }
}

TEST(ElementTypeTest, ValidateStorableTypeRejectsOthersNamingWhat) {
  EXPECT_THAT(ValidateStorableType(v1::FLOAT16, "parameter 'w'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("parameter 'w': element type float16 cannot be stored")));
  EXPECT_THAT(ValidateStorableType(v1::ELEMENT_TYPE_UNSPECIFIED, "gradient 'g'"),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient 'g': element type unspecified cannot be stored")));
  EXPECT_THAT(ValidateStorableType(v1::BFLOAT16, "x"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("bfloat16")));
}

TEST(ElementTypeTest, ElementTypeOf) {
  static_assert(kElementTypeOf<int32_t> == v1::INT32);
  static_assert(kElementTypeOf<uint32_t> == v1::UINT32);
  static_assert(kElementTypeOf<int64_t> == v1::INT64);
  static_assert(kElementTypeOf<uint64_t> == v1::UINT64);
  static_assert(kElementTypeOf<float> == v1::FLOAT32);
  static_assert(kElementTypeOf<double> == v1::FLOAT64);
  static_assert(kElementTypeOf<int16_t> == v1::ELEMENT_TYPE_UNSPECIFIED);
  static_assert(kElementTypeOf<char> == v1::ELEMENT_TYPE_UNSPECIFIED);
  SUCCEED();
}

// Calls DispatchStorable and reports the type it dispatched to (or
// ELEMENT_TYPE_UNSPECIFIED with the call count when it dispatched nothing).
struct DispatchResult {
  bool dispatched = false;
  int calls = 0;
  ElementType seen = v1::ELEMENT_TYPE_UNSPECIFIED;
  size_t size = 0;
};

DispatchResult Dispatch(ElementType type) {
  DispatchResult r;
  r.dispatched = DispatchStorable(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    ++r.calls;
    r.seen = kElementTypeOf<T>;
    r.size = sizeof(T);
  });
  return r;
}

TEST(ElementTypeTest, DispatchStorableCallsWithTheMatchingType) {
  for (ElementType type :
       {v1::INT32, v1::UINT32, v1::INT64, v1::UINT64, v1::FLOAT32, v1::FLOAT64}) {
    DispatchResult r = Dispatch(type);
    EXPECT_TRUE(r.dispatched) << ElementTypeName(type);
    EXPECT_EQ(r.calls, 1) << ElementTypeName(type);
    EXPECT_EQ(r.seen, type) << ElementTypeName(type);
    EXPECT_EQ(r.size, ElementSize(type)) << ElementTypeName(type);
  }
}

TEST(ElementTypeTest, DispatchStorableRefusesOtherTypes) {
  for (ElementType type :
       {v1::ELEMENT_TYPE_UNSPECIFIED, v1::FLOAT16, v1::BFLOAT16, static_cast<ElementType>(99)}) {
    DispatchResult r = Dispatch(type);
    EXPECT_FALSE(r.dispatched) << ElementTypeName(type);
    EXPECT_EQ(r.calls, 0) << ElementTypeName(type);
  }
}

TEST(ElementTypeTest, DispatchFloatingOnlyFloats) {
  int calls = 0;
  EXPECT_TRUE(DispatchFloating(v1::FLOAT32, [&](auto tag) {
    static_assert(std::is_floating_point_v<typename decltype(tag)::type>);
    ++calls;
  }));
  EXPECT_TRUE(DispatchFloating(v1::FLOAT64, [&](auto) { ++calls; }));
  EXPECT_FALSE(DispatchFloating(v1::INT32, [&](auto) { ++calls; }));
  EXPECT_FALSE(DispatchFloating(v1::FLOAT16, [&](auto) { ++calls; }));
  EXPECT_EQ(calls, 2);
}

TEST(L2NormTest, SumsSquaresOfFloatingValuesOnly) {
  const std::vector<float> f = {3, 4};
  EXPECT_DOUBLE_EQ(L2Norm(v1::FLOAT32, absl::string_view(reinterpret_cast<const char*>(f.data()),
                                                         f.size() * sizeof(float))),
                   5.0);
  std::vector<double> d(20, 0.5);  // more than the eight lanes
  EXPECT_DOUBLE_EQ(L2Norm(v1::FLOAT64, absl::string_view(reinterpret_cast<const char*>(d.data()),
                                                         d.size() * sizeof(double))),
                   std::sqrt(5.0));
  const std::vector<int32_t> i = {3, 4};
  EXPECT_EQ(L2Norm(v1::INT32, absl::string_view(reinterpret_cast<const char*>(i.data()),
                                                i.size() * sizeof(int32_t))),
            0.0);
}

}  // namespace
}  // namespace pserver
