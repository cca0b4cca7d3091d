#include "cc/core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/core/status_macros.h"

namespace pserver {

absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t dim : shape) {
    if (dim < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " has a negative dimension"));
    }
    if (dim != 0 && n > std::numeric_limits<int64_t>::max() / dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape ", ShapeString(shape), " is too large"));
    }
    n *= dim;
  }
  return n;
}

size_t SegmentsSize(const Segments& segments) {
  size_t n = 0;
  for (absl::string_view s : segments) n += s.size();
  return n;
}

void CopySegments(const Segments& segments, char* dest) {
  for (absl::string_view s : segments) {
    if (!s.empty()) std::memcpy(dest, s.data(), s.size());
    dest += s.size();
  }
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<Tensor> Tensor::Create(ElementType type, Shape shape, std::string bytes) {
  PS_RETURN_IF_ERROR(ValidateStorableType(type, "tensor"));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  // The element count fits in int64 but its byte count may not fit in size_t.
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / ElementSize(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", ElementTypeName(type), ShapeString(shape), " is too large"));
  }
  size_t want = static_cast<size_t>(n) * ElementSize(type);
  if (bytes.size() != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", ElementTypeName(type),
                                                   ShapeString(shape), " needs ", want,
                                                   " bytes, got ", bytes.size()));
  }
  Tensor t;
  t.type_ = type;
  t.shape_ = std::move(shape);
  t.bytes_ = std::move(bytes);
  return t;
}

absl::StatusOr<Tensor> Tensor::Zeros(ElementType type, Shape shape) {
  PS_RETURN_IF_ERROR(ValidateStorableType(type, "tensor"));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  return Create(type, std::move(shape),
                std::string(static_cast<size_t>(n) * ElementSize(type), '\0'));
}

std::string Tensor::DebugString() const {
  return absl::StrCat(ElementTypeName(type_), ShapeString(shape_));
}

namespace {

template <typename T>
double SumOfSquares(absl::string_view bytes) {
  const T* v = reinterpret_cast<const T*>(bytes.data());
  const size_t n = bytes.size() / sizeof(T);
  // Eight independent sums: one serial sum is bound by the add latency.
  constexpr size_t kLanes = 8;
  double lanes[kLanes] = {};
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) {
      lanes[k] += static_cast<double>(v[i + k]) * static_cast<double>(v[i + k]);
    }
  }
  double sum = 0;
  for (; i < n; ++i) sum += static_cast<double>(v[i]) * static_cast<double>(v[i]);
  for (double lane : lanes) sum += lane;
  return sum;
}

}  // namespace

double L2Norm(ElementType type, absl::string_view bytes) {
  double sum = 0;
  DispatchFloating(type,
                   [&](auto tag) { sum = SumOfSquares<typename decltype(tag)::type>(bytes); });
  return std::sqrt(sum);
}

}  // namespace pserver
