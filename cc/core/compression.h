// Compression on the wire: float32 values in float16 or bfloat16, and top-k
// with error feedback (ParameterConfig.wire_compression, config.proto). The
// store keeps float32; trainers encode gradients and decode pulled values,
// servers decode gradients and encode pulled values.
//
//   std::string wire(n * 2, '\0');
//   EncodeFloats(v1::FLOAT16, values, n, wire.data());          // float32 -> float16
//   DecodeFloats(v1::FLOAT16, wire.data(), n, values);          // float16 -> float32
//
//   ErrorFeedback feedback(elements);                           // one per parameter
//   SparseGradient sent = feedback.AddAndSelect(grad, offset, n, k);
//
// The scalar conversions (cc/core/half_float.h) are the ones cc/cuda's
// kernels use on the device: exact widening, and narrowing rounded to
// nearest even with overflow to infinity, NaN kept NaN (quiet) and
// subnormals kept. Everything is little-endian, as the rest of the wire.
// Functions are pure and thread-safe; an ErrorFeedback is thread-compatible.
#ifndef PSERVER_CC_CORE_COMPRESSION_H_
#define PSERVER_CC_CORE_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/core/element_type.h"
#include "cc/core/half_float.h"
#include "pserver/v1/config.pb.h"

namespace pserver {

// Whether `type` is a wire form of float32 values: FLOAT32, FLOAT16, BFLOAT16.
bool IsWireFloatType(ElementType type);

// The ElementType values of `config` travel in: FLOAT16, BFLOAT16 or FLOAT32.
ElementType WireValueType(const v1::WireCompression& config);

// Whether `config` compresses anything (a half value type or top-k).
bool Compresses(const v1::WireCompression& config);

// INVALID_ARGUMENT naming `what` and the field for a config that cannot be
// used: a top-k fraction outside [0, 1] or not finite, an unknown value type.
absl::Status ValidateWireCompression(const v1::WireCompression& config, const std::string& what);

// ValidateWireCompression, and INVALID_ARGUMENT "<what>: wire_compression
// needs a float32 <noun>; this one is <type>" for a config that compresses
// values of another type.
absl::Status ValidateWireCompressionFor(const v1::WireCompression& config, ElementType type,
                                        const std::string& what, absl::string_view noun);

// Whether values stored as `stored` may travel as `wire`: FLOAT16 or
// BFLOAT16 for FLOAT32.
bool CanTravelAs(ElementType stored, ElementType wire);

// k for a block of `elements` values: topk_count (at most `elements`) if set,
// else ceil(topk_fraction * elements), at least 1; 0 if top-k is off.
size_t TopKCount(const v1::WireCompression& config, size_t elements);

// n float32 values to `type` (FLOAT32, FLOAT16 or BFLOAT16) at `out`
// (n * ElementSize(type) bytes, any alignment), and back.
void EncodeFloats(ElementType type, const float* in, size_t n, char* out);
void DecodeFloats(ElementType type, const char* in, size_t n, float* out);

// `float32_bytes` (float32 values, any alignment) as `type` values.
std::string NarrowFloats(ElementType type, absl::string_view float32_bytes);

// What a top-k push carries for one block: element indices within the block
// and their values (float32, before any narrowing).
struct SparseGradient {
  std::vector<uint32_t> indices;
  std::vector<float> values;
};

// The error-feedback residual of one float32 parameter on one trainer.
class ErrorFeedback {
 public:
  explicit ErrorFeedback(size_t elements) : residual_(elements, 0.0f) {}

  // residual[offset, offset + n) += grad[0, n); then takes the k largest
  // |residual| of that range (ties: lowest index first), returns them and
  // sets them to 0 in the residual. Requires offset + n <= elements().
  SparseGradient AddAndSelect(const float* grad, size_t offset, size_t n, size_t k);

  size_t elements() const { return residual_.size(); }
  const std::vector<float>& residual() const { return residual_; }

 private:
  std::vector<float> residual_;
};

// A gradient block as it arrived (in `type`, FLOAT32/FLOAT16/BFLOAT16; with
// `indices` for top-k, else dense) widened to `elements` float32 values (a
// top-k one: zero but at its indices, repeated indices summed). Checks
// everything first: INVALID_ARGUMENT naming `what` for an unknown type, a
// content of the wrong length, indices not a multiple of 4 bytes, or an
// index out of range.
absl::StatusOr<std::string> WidenGradient(ElementType type, absl::string_view content,
                                          absl::string_view indices, size_t elements,
                                          const std::string& what);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_COMPRESSION_H_
