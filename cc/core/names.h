// Names of parameters and tables: what a server accepts, in one place, so
// every path (InitParam, GetParam, SendGrad, CreateTable) refuses the same
// names with the same words.
//
//   PS_RETURN_IF_ERROR(ValidateName("parameter", param.name()));
//   PS_RETURN_IF_ERROR(ValidateName("table", request.name()));
//
// A name is a non-empty string of at most kMaxNameBytes bytes of valid UTF-8
// without NUL, so it means the same thing in C, Python and Go, and nothing can
// alias a shorter name by truncation ("a\0b" is not "a").
//
// Pure functions, thread-safe.
#ifndef PSERVER_CC_CORE_NAMES_H_
#define PSERVER_CC_CORE_NAMES_H_

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"

namespace pserver {

// The longest parameter or table name a server accepts, in bytes (of UTF-8).
inline constexpr size_t kMaxNameBytes = 1024;

// OK if `name` may name a `kind` ("parameter", "table"); otherwise
// INVALID_ARGUMENT `<kind> name "<name, escaped>": <why>`, e.g.
// `parameter name "a\000b": name holds a NUL byte at offset 1`.
absl::Status ValidateName(absl::string_view kind, absl::string_view name);

// The offset of the first byte of `bytes` that does not begin or continue a
// well-formed UTF-8 sequence (no overlong forms, no surrogates, nothing above
// U+10FFFF), or bytes.size() if all of it is valid.
size_t FirstInvalidUtf8(absl::string_view bytes);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_NAMES_H_
