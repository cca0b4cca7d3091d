// Table keys as they travel (TablePullRequest.keys, TablePushRequest.keys):
// little-endian uint64s, and back. Shared by client and server.
//
//   std::string bytes = EncodeKeys(keys);
//   PS_ASSIGN_OR_RETURN(std::vector<uint64_t> back, DecodeKeys(bytes));
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

}  // namespace pserver

#endif  // PSERVER_CC_CORE_TABLE_KEYS_H_
