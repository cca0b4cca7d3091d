#include "cc/server/recent_writes.h"

#include <algorithm>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace pserver {

void RecentWrites::Add(const BackupLog::Write& write) {
  const uint64_t bytes = Bytes(write);
  if (bytes > max_bytes_) return;  // Since reports it missing
  auto kept = std::make_shared<const BackupLog::Write>(write);
  absl::MutexLock lock(&mu_);
  if (write.lsn <= released_) return;
  if (!writes_.emplace(write.lsn, std::move(kept)).second) return;
  bytes_ += bytes;
  while (bytes_ > max_bytes_ && !writes_.empty()) {
    bytes_ -= Bytes(*writes_.begin()->second);
    writes_.erase(writes_.begin());
  }
}

void RecentWrites::Release(uint64_t lsn) {
  std::vector<Kept> going;  // freed after the lock
  absl::MutexLock lock(&mu_);
  released_ = std::max(released_, lsn);
  while (!writes_.empty() && writes_.begin()->first <= lsn) {
    bytes_ -= Bytes(*writes_.begin()->second);
    going.push_back(std::move(writes_.begin()->second));
    writes_.erase(writes_.begin());
  }
}

absl::StatusOr<std::vector<RecentWrites::Kept>> RecentWrites::Since(uint64_t lsn,
                                                                    uint64_t last) const {
  absl::MutexLock lock(&mu_);
  std::vector<Kept> out;
  for (uint64_t next = lsn + 1; next <= last && next > lsn; ++next) {
    auto it = writes_.find(next);
    if (it == writes_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "write ", next, " is no longer kept (the primary keeps ",
          writes_.empty() ? std::string("none")
                          : absl::StrCat("LSNs ", writes_.begin()->first, "-",
                                         writes_.rbegin()->first),
          ", at most ", max_bytes_, " bytes: --catch_up_bytes)"));
    }
    out.push_back(it->second);
  }
  return out;
}

uint64_t RecentWrites::bytes() const {
  absl::MutexLock lock(&mu_);
  return bytes_;
}

}  // namespace pserver
