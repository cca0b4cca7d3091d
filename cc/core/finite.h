// Finding NaN and infinity in tensors of floating values, before they reach a
// parameter (a NaN gradient, once applied, makes the parameter NaN for good).
//
//   if (std::optional<NonFinite> bad = FindNonFinite(v1::FLOAT32, bytes)) {
//     ... bad->index, bad->kind ("NaN", "inf", "-inf") ...
//   }
//
// The scan looks at the exponent bits of each value, in chunks whose test is
// branch-free (vectorized), so it reads the bytes at memory speed. It works on
// the host bytes a gradient arrives in, so one check serves every storage
// (host or GPU). Pure functions, thread-safe.
#ifndef PSERVER_CC_CORE_FINITE_H_
#define PSERVER_CC_CORE_FINITE_H_

#include <cstddef>
#include <optional>

#include "absl/strings/string_view.h"
#include "cc/core/element_type.h"

namespace pserver {

struct NonFinite {
  size_t index = 0;          // of the first non-finite value
  const char* kind = "NaN";  // "NaN", "inf" or "-inf"
};

// The first NaN or infinity among the values of `bytes` read as `type`
// (float32, float64, float16 or bfloat16; little-endian, any alignment).
// Nothing for integer types, which have none, and for other types.
std::optional<NonFinite> FindNonFinite(ElementType type, absl::string_view bytes);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_FINITE_H_
