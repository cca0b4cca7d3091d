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
//
// Views: Tensor::View and Tensor::MutableView borrow a caller's memory
// instead of owning it, so a buffer from C, Python or Go is sent or filled in
// place (the C ABI's batches). The memory must outlive the view.
//
//   PS_ASSIGN_OR_RETURN(Tensor out, Tensor::MutableView(v1::FLOAT32, {2, 3}, buf, 24));
//   PS_RETURN_IF_ERROR(client->GetParamsInto({"w"}, absl::MakeSpan(&out, 1)));  // fills buf
//
// A view of const memory (View) is read only: mutable_data() first copies
// its bytes into the tensor, which then owns them. Copying any view gives an
// owning tensor with the same bytes; moving a view moves the borrow.
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
  // Copies own their bytes, also when `other` is a view.
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  // Moves keep a view a view (as the defaults would: `other` is left
  // moved-from, and no longer borrows).
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;
  ~Tensor() = default;

  // A read-only view of `size` bytes at `data` (NULL only when size is 0),
  // checked like Create.
  static absl::StatusOr<Tensor> View(ElementType type, Shape shape, const void* data, size_t size);
  // A view whose elements are written in place through mutable_data().
  static absl::StatusOr<Tensor> MutableView(ElementType type, Shape shape, void* data, size_t size);

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
    return size == 0 ? 0 : static_cast<int64_t>(byte_size() / size);
  }
  size_t byte_size() const { return view_ != nullptr ? view_size_ : bytes_.size(); }
  // The elements' bytes: the tensor's own, or the memory it views.
  absl::string_view bytes() const { return absl::string_view(data(), byte_size()); }
  const char* data() const { return view_ != nullptr ? view_ : bytes_.data(); }
  // Writable bytes: a mutable view's memory; a read-only view is first
  // copied into the tensor (which then owns its bytes).
  char* mutable_data();
  // True while the tensor borrows its bytes (View, MutableView).
  bool is_view() const { return view_ != nullptr; }
  // The bytes, moved out (copied out of a view first).
  std::string&& ReleaseBytes() && {
    Own();
    return std::move(bytes_);
  }

  // The elements as T; an empty span if T is not the tensor's type.
  template <typename T>
  absl::Span<const T> values() const {
    if (kElementTypeOf<T> != type_) return {};
    return absl::Span<const T>(reinterpret_cast<const T*>(data()), byte_size() / sizeof(T));
  }
  template <typename T>
  absl::Span<T> mutable_values() {
    if (kElementTypeOf<T> != type_) return {};
    return absl::Span<T>(reinterpret_cast<T*>(mutable_data()), byte_size() / sizeof(T));
  }
  template <typename T>
  std::vector<T> ToVector() const {
    absl::Span<const T> v = values<T>();
    return std::vector<T>(v.begin(), v.end());
  }

  std::string DebugString() const;  // "float32[2, 3]"

 private:
  // Checks type, shape and size as Create does; the tensor is left empty.
  static absl::StatusOr<Tensor> Checked(ElementType type, Shape shape, size_t size);
  // A view's bytes copied into bytes_; the tensor no longer borrows.
  void Own();

  ElementType type_ = v1::ELEMENT_TYPE_UNSPECIFIED;
  Shape shape_;
  std::string bytes_;           // owned bytes; empty while viewing
  const char* view_ = nullptr;  // set for a view: the borrowed bytes
  size_t view_size_ = 0;
  bool view_writable_ = false;  // MutableView
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TENSOR_H_
