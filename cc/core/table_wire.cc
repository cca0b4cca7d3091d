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
                                                             const v1::TablePushRequest& request,
                                                             size_t keys) {
  const std::string what = absl::StrCat("push to table '", table.name(), "'");
  PS_ASSIGN_OR_RETURN(bool converts, Converts(table, request.value_type(), "value_type", what));
  if (!converts) return std::nullopt;
  return WidenGradient(request.value_type(), request.values(), /*indices=*/"",
                       keys * table.config().dim(), what);
}

absl::Status NarrowPulledValues(const SparseTable& table, const v1::TablePullRequest& request,
                                v1::TablePullResponse* response) {
  const std::string what = absl::StrCat("read of table '", table.name(), "'");
  PS_ASSIGN_OR_RETURN(bool converts, Converts(table, request.wire_type(), "wire_type", what));
  if (!converts) return absl::OkStatus();
  response->set_values(NarrowFloats(request.wire_type(), response->values()));
  response->set_content_type(request.wire_type());
  return absl::OkStatus();
}

}  // namespace pserver
