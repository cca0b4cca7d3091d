#include "cc/core/table_keys.h"

#include <cstring>

#include "absl/strings/str_cat.h"

namespace pserver {

absl::StatusOr<std::vector<uint64_t>> DecodeKeys(absl::string_view bytes) {
  if (bytes.size() % sizeof(uint64_t) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("keys must be whole little-endian uint64s, got ", bytes.size(), " bytes"));
  }
  std::vector<uint64_t> keys(bytes.size() / sizeof(uint64_t));
  if (!keys.empty()) std::memcpy(keys.data(), bytes.data(), bytes.size());
  return keys;
}

std::string EncodeKeys(absl::Span<const uint64_t> keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
}

}  // namespace pserver
