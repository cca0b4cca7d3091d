#include "cc/core/tensor.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

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

absl::StatusOr<Tensor> Tensor::Checked(ElementType type, Shape shape, size_t size) {
  PS_RETURN_IF_ERROR(ValidateStorableType(type, "tensor"));
  PS_ASSIGN_OR_RETURN(int64_t n, NumElements(shape));
  // The element count fits in int64 but its byte count may not fit in size_t.
  if (static_cast<uint64_t>(n) > std::numeric_limits<size_t>::max() / ElementSize(type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", ElementTypeName(type), ShapeString(shape), " is too large"));
  }
  size_t want = static_cast<size_t>(n) * ElementSize(type);
  if (size != want) {
    return absl::InvalidArgumentError(absl::StrCat("tensor ", ElementTypeName(type),
                                                   ShapeString(shape), " needs ", want,
                                                   " bytes, got ", size));
  }
  Tensor t;
  t.type_ = type;
  t.shape_ = std::move(shape);
  return t;
}

absl::StatusOr<Tensor> Tensor::Create(ElementType type, Shape shape, std::string bytes) {
  PS_ASSIGN_OR_RETURN(Tensor t, Checked(type, std::move(shape), bytes.size()));
  t.bytes_ = std::move(bytes);
  return t;
}

absl::StatusOr<Tensor> Tensor::View(ElementType type, Shape shape, const void* data, size_t size) {
  if (data == nullptr && size != 0) return absl::InvalidArgumentError("tensor data is NULL");
  PS_ASSIGN_OR_RETURN(Tensor t, Checked(type, std::move(shape), size));
  if (size != 0) {
    t.view_ = static_cast<const char*>(data);
    t.view_size_ = size;
  }
  return t;
}

absl::StatusOr<Tensor> Tensor::MutableView(ElementType type, Shape shape, void* data, size_t size) {
  PS_ASSIGN_OR_RETURN(Tensor t, View(type, std::move(shape), data, size));
  t.view_writable_ = t.view_ != nullptr;
  return t;
}

Tensor::Tensor(const Tensor& other)
    : type_(other.type_), shape_(other.shape_), bytes_(other.bytes()) {}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : type_(other.type_),
      shape_(std::move(other.shape_)),
      bytes_(std::move(other.bytes_)),
      view_(std::exchange(other.view_, nullptr)),
      view_size_(std::exchange(other.view_size_, 0)),
      view_writable_(std::exchange(other.view_writable_, false)) {}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this != &other) {
    type_ = other.type_;
    shape_ = std::move(other.shape_);
    bytes_ = std::move(other.bytes_);
    view_ = std::exchange(other.view_, nullptr);
    view_size_ = std::exchange(other.view_size_, 0);
    view_writable_ = std::exchange(other.view_writable_, false);
  }
  return *this;
}

char* Tensor::mutable_data() {
  if (view_ != nullptr && view_writable_) return const_cast<char*>(view_);
  Own();
  return bytes_.data();
}

void Tensor::Own() {
  if (view_ == nullptr) return;
  bytes_.assign(view_, view_size_);
  view_ = nullptr;
  view_size_ = 0;
  view_writable_ = false;
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
