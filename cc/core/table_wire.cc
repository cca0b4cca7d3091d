#include "cc/core/table_wire.h"

#include "absl/strings/str_cat.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

// Whether values of `table` travel as `wire` (not as stored); an error for
// a type they cannot travel in.
absl::StatusOr<bool> Converts(const SparseTable& table, ElementType wire, const char* field,
                              const std::string& what) {
  const ElementType stored = table.config().element_type();
  if (wire == v1::ELEMENT_TYPE_UNSPECIFIED || wire == stored) return false;
  if (CanTravelAs(stored, wire)) return true;
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": ", field, " ", ElementTypeName(wire), " is not possible for a ",
      ElementTypeName(stored), " table; want float16 or bfloat16 for a float32 one, or unset"));
}

}  // namespace

absl::StatusOr<std::optional<std::string>> WidenPushedValues(const SparseTable& table,
                                                             ElementType value_type,
                                                             absl::string_view values,
                                                             size_t keys) {
  const std::string what = absl::StrCat("push to table '", table.name(), "'");
  PS_ASSIGN_OR_RETURN(bool converts, Converts(table, value_type, "value_type", what));
  if (!converts) return std::nullopt;
  return WidenGradient(value_type, values, /*indices=*/"", keys * table.config().dim(), what);
}

absl::StatusOr<bool> PullNarrows(const SparseTable& table, ElementType wire_type,
                                 const std::string& what) {
  return Converts(table, wire_type, "wire_type", what);
}

}  // namespace pserver
