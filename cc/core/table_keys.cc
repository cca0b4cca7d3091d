#include "cc/core/table_keys.h"

#include <cstdint>
#include <cstring>
#include <utility>

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

absl::StatusOr<KeysView> KeysView::Of(absl::string_view bytes) {
  KeysView view;
  if (reinterpret_cast<uintptr_t>(bytes.data()) % alignof(uint64_t) != 0) {
    absl::StatusOr<std::vector<uint64_t>> copied = DecodeKeys(bytes);
    if (!copied.ok()) return copied.status();
    view.owned_ = *std::move(copied);
    return view;
  }
  if (bytes.size() % sizeof(uint64_t) != 0) return DecodeKeys(bytes).status();
  view.size_ = bytes.size() / sizeof(uint64_t);
  view.borrowed_ = view.size_ == 0 ? nullptr : reinterpret_cast<const uint64_t*>(bytes.data());
  return view;
}

std::string EncodeKeys(absl::Span<const uint64_t> keys) {
  return std::string(reinterpret_cast<const char*>(keys.data()), keys.size() * sizeof(uint64_t));
}

}  // namespace pserver
