// A sparse table's values on the wire (TableConfig.wire_compression): a
// trainer may push gradient rows and ask for pulled rows in float16 or
// bfloat16 (TablePushRequest.value_type, TablePullRequest.wire_type); the
// table keeps float32. Used by Tables on every push and read.
#ifndef PSERVER_CC_CORE_TABLE_WIRE_H_
#define PSERVER_CC_CORE_TABLE_WIRE_H_

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "cc/core/sparse_table.h"
#include "pserver/v1/service.pb.h"

namespace pserver {

// The values of a push of `keys` rows that came in `value_type` (a half
// type), widened to the table's float32; nullopt when they came as stored.
// INVALID_ARGUMENT naming the table for a type the table cannot take or
// values of the wrong length, before anything is applied.
absl::StatusOr<std::optional<std::string>> WidenPushedValues(const SparseTable& table,
                                                             ElementType value_type,
                                                             absl::string_view values,
                                                             size_t keys);

// Whether a read of `table` asking for its rows in `wire_type` narrows them
// (false: they travel as stored). INVALID_ARGUMENT naming `what` for a type
// its values cannot travel in.
absl::StatusOr<bool> PullNarrows(const SparseTable& table, ElementType wire_type,
                                 const std::string& what);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TABLE_WIRE_H_
