// Table keys as they travel (TablePullRequest.keys, TablePushRequest.keys):
// little-endian uint64s, and back. Shared by client and server.
//
//   std::string bytes = EncodeKeys(keys);
//   PS_ASSIGN_OR_RETURN(std::vector<uint64_t> back, DecodeKeys(bytes));
//   PS_ASSIGN_OR_RETURN(KeysView view, KeysView::Of(bytes));  // no copy if aligned
//   Use(view.keys());  // valid while `bytes` is
#ifndef PSERVER_CC_CORE_TABLE_KEYS_H_
#define PSERVER_CC_CORE_TABLE_KEYS_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pserver {

// INVALID_ARGUMENT when `bytes` is not a whole number of keys.
absl::StatusOr<std::vector<uint64_t>> DecodeKeys(absl::string_view bytes);
std::string EncodeKeys(absl::Span<const uint64_t> keys);

// The keys in `bytes` read in place when `bytes` is 8-byte aligned (as a
// received message's heap buffer is), else copied. keys() of a view that
// borrows is valid while `bytes` is. Copyable.
class KeysView {
 public:
  // INVALID_ARGUMENT when `bytes` is not a whole number of keys.
  static absl::StatusOr<KeysView> Of(absl::string_view bytes);

  absl::Span<const uint64_t> keys() const {
    if (borrowed_ != nullptr) return absl::MakeConstSpan(borrowed_, size_);
    return owned_;
  }

 private:
  const uint64_t* borrowed_ = nullptr;
  size_t size_ = 0;
  std::vector<uint64_t> owned_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TABLE_KEYS_H_
