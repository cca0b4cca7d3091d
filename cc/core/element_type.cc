#include "cc/core/element_type.h"

#include "absl/strings/str_cat.h"

namespace pserver {

size_t ElementSize(ElementType type) {
  switch (type) {
    case v1::INT32:
    case v1::UINT32:
    case v1::FLOAT32:
      return 4;
    case v1::INT64:
    case v1::UINT64:
    case v1::FLOAT64:
      return 8;
    case v1::FLOAT16:
    case v1::BFLOAT16:
      return 2;
    default:
      return 0;
  }
}

std::string ElementTypeName(ElementType type) {
  switch (type) {
    case v1::INT32: return "int32";
    case v1::UINT32: return "uint32";
    case v1::INT64: return "int64";
    case v1::UINT64: return "uint64";
    case v1::FLOAT32: return "float32";
    case v1::FLOAT64: return "float64";
    case v1::FLOAT16: return "float16";
    case v1::BFLOAT16: return "bfloat16";
    case v1::ELEMENT_TYPE_UNSPECIFIED: return "unspecified";
    default: return absl::StrCat("unknown(", static_cast<int>(type), ")");
  }
}

bool IsFloatingPoint(ElementType type) {
  return type == v1::FLOAT32 || type == v1::FLOAT64;
}

bool IsInteger(ElementType type) {
  return type == v1::INT32 || type == v1::UINT32 || type == v1::INT64 ||
         type == v1::UINT64;
}

absl::Status ValidateStorableType(ElementType type, const std::string& what) {
  if (IsFloatingPoint(type) || IsInteger(type)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": element type ", ElementTypeName(type),
      " cannot be stored; use int32, uint32, int64, uint64, float32 or float64"));
}

}  // namespace pserver
