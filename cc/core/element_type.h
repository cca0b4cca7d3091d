// Element types of parameters and gradients: sizes, names, C++ type mapping.
//
//   size_t bytes = ElementSize(v1::FLOAT32) * n;          // 4 * n
//   static_assert(kElementTypeOf<double> == v1::FLOAT64);
//   DispatchStorable(type, [&](auto tag) { using T = typename decltype(tag)::type; ... });
//
// All functions are pure and thread-safe.
#ifndef PSERVER_CC_CORE_ELEMENT_TYPE_H_
#define PSERVER_CC_CORE_ELEMENT_TYPE_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

using ElementType = v1::ElementType;

// Bytes per element; 0 for ELEMENT_TYPE_UNSPECIFIED and unknown values.
size_t ElementSize(ElementType type);

// "float32", "int64", ...; "unknown(<n>)" for values outside the enum.
std::string ElementTypeName(ElementType type);

bool IsFloatingPoint(ElementType type);  // float32 and float64 (stored types)
bool IsInteger(ElementType type);

// OK for the six types a server stores and updates; INVALID_ARGUMENT otherwise,
// naming `what` (e.g. "parameter 'w'").
absl::Status ValidateStorableType(ElementType type, const std::string& what);

template <typename T>
struct TypeTag {
  using type = T;
};

template <typename T>
inline constexpr ElementType kElementTypeOf = v1::ELEMENT_TYPE_UNSPECIFIED;
template <>
inline constexpr ElementType kElementTypeOf<int32_t> = v1::INT32;
template <>
inline constexpr ElementType kElementTypeOf<uint32_t> = v1::UINT32;
template <>
inline constexpr ElementType kElementTypeOf<int64_t> = v1::INT64;
template <>
inline constexpr ElementType kElementTypeOf<uint64_t> = v1::UINT64;
template <>
inline constexpr ElementType kElementTypeOf<float> = v1::FLOAT32;
template <>
inline constexpr ElementType kElementTypeOf<double> = v1::FLOAT64;

// Calls fn(TypeTag<T>{}) with T the C++ type of a storable `type`; returns
// false (and calls nothing) for any other type.
template <typename Fn>
bool DispatchStorable(ElementType type, Fn&& fn) {
  switch (type) {
    case v1::INT32: fn(TypeTag<int32_t>{}); return true;
    case v1::UINT32: fn(TypeTag<uint32_t>{}); return true;
    case v1::INT64: fn(TypeTag<int64_t>{}); return true;
    case v1::UINT64: fn(TypeTag<uint64_t>{}); return true;
    case v1::FLOAT32: fn(TypeTag<float>{}); return true;
    case v1::FLOAT64: fn(TypeTag<double>{}); return true;
    default: return false;
  }
}

// Like DispatchStorable, for float32 and float64 only.
template <typename Fn>
bool DispatchFloating(ElementType type, Fn&& fn) {
  switch (type) {
    case v1::FLOAT32: fn(TypeTag<float>{}); return true;
    case v1::FLOAT64: fn(TypeTag<double>{}); return true;
    default: return false;
  }
}

}  // namespace pserver

#endif  // PSERVER_CC_CORE_ELEMENT_TYPE_H_
