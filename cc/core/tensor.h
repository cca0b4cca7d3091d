// Tensor: an element type, a shape and the bytes of its elements (row-major,
// little-endian), the unit the client hands to and gets from the servers.
//
//   Tensor w = Tensor::FromValues<float>({2, 3}, {1, 2, 3, 4, 5, 6});
//   absl::Span<const float> v = w.values<float>();   // 6 floats
//   std::string bytes = std::move(w).ReleaseBytes();  // no copy
//
// The bytes live in a std::string so they move into and out of protobuf
// `bytes` fields without a copy. A Tensor is a value type; it is not safe to
// mutate one from several threads.
#ifndef PSERVER_CC_CORE_TENSOR_H_
#define PSERVER_CC_CORE_TENSOR_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "cc/core/element_type.h"

namespace pserver {

using Shape = std::vector<int64_t>;

// Bytes that may lie in several pieces (as they arrive from the network),
// borrowed from whoever owns them.
using Segments = std::vector<absl::string_view>;

size_t SegmentsSize(const Segments& segments);
// Copies the segments, in order, to `dest` (SegmentsSize bytes).
void CopySegments(const Segments& segments, char* dest);

// Product of the dimensions (1 for a scalar shape {}); INVALID_ARGUMENT for a
// negative dimension or an overflowing product.
absl::StatusOr<int64_t> NumElements(absl::Span<const int64_t> shape);

// "[2, 3]"
std::string ShapeString(absl::Span<const int64_t> shape);

// The L2 norm of `bytes` read as values of a floating `type` (0 for other
// types), summed in double over eight lanes in a fixed order: every caller
// (the client's host and device pushes) gets the same bits for the same
// values, so split gradients clip alike.
double L2Norm(ElementType type, absl::string_view bytes);

class Tensor {
 public:
  Tensor() = default;

  // Checks that `bytes` holds exactly the elements `shape` asks for.
  static absl::StatusOr<Tensor> Create(ElementType type, Shape shape, std::string bytes);

  static absl::StatusOr<Tensor> Zeros(ElementType type, Shape shape);

  // `values` must hold NumElements(shape) values; if it does not, the tensor
  // takes the shape {values.size()} instead.
  template <typename T>
  static Tensor FromValues(Shape shape, absl::Span<const T> values) {
    Tensor t;
    t.type_ = kElementTypeOf<T>;
    auto n = NumElements(shape);
    if (!n.ok() || static_cast<size_t>(*n) != values.size()) {
      shape = {static_cast<int64_t>(values.size())};
    }
    t.shape_ = std::move(shape);
    t.bytes_.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
    return t;
  }
  template <typename T>
  static Tensor FromValues(Shape shape, std::initializer_list<T> values) {
    return FromValues<T>(std::move(shape), absl::Span<const T>(values.begin(), values.size()));
  }
  template <typename T>
  static Tensor FromValues(Shape shape, const std::vector<T>& values) {
    return FromValues<T>(std::move(shape), absl::Span<const T>(values));
  }

  ElementType type() const { return type_; }
  const Shape& shape() const { return shape_; }
  int64_t num_elements() const {
    size_t size = ElementSize(type_);
    return size == 0 ? 0 : static_cast<int64_t>(bytes_.size() / size);
  }
  size_t byte_size() const { return bytes_.size(); }
  const std::string& bytes() const { return bytes_; }
  char* mutable_data() { return bytes_.data(); }
  std::string&& ReleaseBytes() && { return std::move(bytes_); }

  // The elements as T; an empty span if T is not the tensor's type.
  template <typename T>
  absl::Span<const T> values() const {
    if (kElementTypeOf<T> != type_) return {};
    return absl::Span<const T>(reinterpret_cast<const T*>(bytes_.data()),
                               bytes_.size() / sizeof(T));
  }
  template <typename T>
  absl::Span<T> mutable_values() {
    if (kElementTypeOf<T> != type_) return {};
    return absl::Span<T>(reinterpret_cast<T*>(bytes_.data()), bytes_.size() / sizeof(T));
  }
  template <typename T>
  std::vector<T> ToVector() const {
    absl::Span<const T> v = values<T>();
    return std::vector<T>(v.begin(), v.end());
  }

  std::string DebugString() const;  // "float32[2, 3]"

 private:
  ElementType type_ = v1::ELEMENT_TYPE_UNSPECIFIED;
  Shape shape_;
  std::string bytes_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TENSOR_H_
