// RowInitializer: the deterministic values a new row of a sparse table gets.
// Value (key, column) depends only on (seed, key, column), never on the
// server, the order of creation or the time, so every server creates the same
// row and a row that was evicted comes back with the same initial value.
//
//   PS_ASSIGN_OR_RETURN(RowInitializer init,
//                       RowInitializer::Create(config.initializer(), "table 'emb'"));
//   std::vector<float> row(dim);
//   init.Fill(key, absl::MakeSpan(row));
//
// Kinds (proto/pserver/v1/table.proto): zeros (the default), uniform in
// [low, high), normal(mean, stddev). Uniform numbers come from a splitmix64
// hash of (seed, key, column); normal ones from two such uniforms by
// Box-Muller. Values are computed in double and rounded to the row's type
// (a uniform value that rounds up to `high` is replaced by the largest value
// below it, so the range stays half-open).
//
// Thread-safe: immutable after Create.
#ifndef PSERVER_CC_CORE_ROW_INITIALIZER_H_
#define PSERVER_CC_CORE_ROW_INITIALIZER_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "pserver/v1/table.pb.h"

namespace pserver {

// The splitmix64 finalizer: a bijective, well-mixing hash of 64 bits
// (inline: sparse tables hash every key with it).
inline uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// A uniform double in [0, 1) that depends only on (seed, key, stream).
double HashUniform(uint64_t seed, uint64_t key, uint64_t stream);

class RowInitializer {
 public:
  enum class Kind { kZeros, kUniform, kNormal };

  // INVALID_ARGUMENT naming the field, prefixed with `what` (e.g.
  // "table 'emb'"), for non-finite values, uniform low >= high or a negative
  // normal stddev.
  static absl::StatusOr<RowInitializer> Create(const v1::RowInitializer& config,
                                               absl::string_view what);

  // The value of (key, column), in double.
  double Value(uint64_t key, uint64_t column) const;

  // Writes columns 0 .. out.size()-1 of row `key`. T is float or double.
  template <typename T>
  void Fill(uint64_t key, absl::Span<T> out) const;

  Kind kind() const { return kind_; }

 private:
  RowInitializer() = default;

  Kind kind_ = Kind::kZeros;
  uint64_t seed_ = 0;
  double a_ = 0;  // uniform low / normal mean
  double b_ = 0;  // uniform high / normal stddev
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_ROW_INITIALIZER_H_
