#include "cc/server/backup_log.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

BackupLog::BackupLog(uint64_t epoch, uint64_t applied_lsn, Options options, Apply apply)
    : options_(options), apply_(std::move(apply)), epoch_(epoch), applied_(applied_lsn) {}

absl::Status BackupLog::Deliver(Write write, absl::Time deadline) {
  const uint64_t lsn = write.lsn;
  if (lsn == 0) return absl::InvalidArgumentError("replicated write has LSN 0 (LSNs start at 1)");
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  if (write.epoch < epoch_) {
    return absl::FailedPreconditionError(
        absl::StrCat("replicated write LSN ", lsn, " is of epoch ", write.epoch,
                     ", older than this replica's epoch ", epoch_, ": its sender is no longer "
                     "the primary"));
  }
  if (write.epoch > epoch_) {
    return absl::UnavailableError(
        absl::StrCat("replicated write LSN ", lsn, " is of epoch ", write.epoch,
                     ", newer than this replica knows (", epoch_, "); retry"));
  }
  if (lsn <= applied_) return absl::OkStatus();  // a retry: applied once already
  auto held = held_.find(lsn);
  if (held != held_.end()) {
    std::string held_storage, storage;
    if (held->second.method != write.method ||
        held->second.request_view(&held_storage) != write.request_view(&storage)) {
      return absl::InvalidArgumentError(
          absl::StrCat("replicated write LSN ", lsn, " differs from the write already held "
                       "under that LSN"));
    }
  } else {
    const uint64_t bytes = Bytes(write);
    // The next LSN is never refused for room: it drains what is held.
    if (lsn != applied_ + 1 && (held_.size() >= options_.max_held_writes ||
                                held_bytes_ + bytes > options_.max_held_bytes)) {
      return absl::UnavailableError(absl::StrCat(
          "replica holds ", held_.size(), " writes (", held_bytes_, " bytes) waiting for LSN ",
          applied_ + 1, ", at its bound of ", options_.max_held_writes, " writes and ",
          options_.max_held_bytes, " bytes; retry"));
    }
    held_bytes_ += bytes;
    held_.emplace(lsn, std::move(write));
  }
  while (true) {
    if (!broken_.ok()) return broken_;
    if (lsn <= applied_) return absl::OkStatus();
    if (held_.find(lsn) == held_.end()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "replicated write LSN ", lsn, " was dropped: this replica moved to epoch ", epoch_));
    }
    if (!applying_ && held_.count(applied_ + 1) > 0) {
      Drain();
      continue;
    }
    if (changed_.WaitWithDeadline(&mu_, deadline) && absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("replicated write LSN ", lsn, " is held waiting for LSN ", applied_ + 1,
                       ", which did not arrive in time"));
    }
  }
}

void BackupLog::Drain() {
  applying_ = true;
  for (auto next = held_.find(applied_ + 1); next != held_.end();
       next = held_.find(applied_ + 1)) {
    Write write = std::move(next->second);
    held_.erase(next);
    held_bytes_ -= Bytes(write);
    mu_.Unlock();
    absl::Status applied = apply_(write);
    mu_.Lock();
    if (!applied.ok()) {
      broken_ = absl::DataLossError(
          absl::StrCat("applying replicated write LSN ", write.lsn, " (", write.method,
                       ") failed where the primary's succeeded: ", applied.message(),
                       "; this replica no longer matches its primary and must be rebuilt"));
      break;
    }
    ++applied_;
    // A retry of this LSN that arrived while it was applied (its first
    // connection broke) was held again: it is done, not held.
    if (auto retried = held_.find(applied_); retried != held_.end()) {
      held_bytes_ -= Bytes(retried->second);
      held_.erase(retried);
    }
    const uint64_t bytes = Bytes(write);
    if (bytes <= options_.max_retained_bytes) {
      retained_bytes_ += bytes;
      retained_.push_back(std::move(write));
    } else {  // larger than all the room: nothing before it can follow it
      retained_.clear();
      retained_bytes_ = 0;
    }
    while (retained_bytes_ > options_.max_retained_bytes) {
      retained_bytes_ -= Bytes(retained_.front());
      retained_.pop_front();
    }
  }
  applying_ = false;
  changed_.SignalAll();
}

void BackupLog::SetEpoch(uint64_t epoch) {
  absl::MutexLock lock(&mu_);
  if (epoch <= epoch_) return;
  epoch_ = epoch;
  held_.clear();
  held_bytes_ = 0;
  changed_.SignalAll();
  // A write of the old epoch being applied now finishes before this returns:
  // afterwards applied_lsn() is final for the old epoch.
  mu_.Await(absl::Condition(
      +[](bool* applying) { return !*applying; }, &applying_));
}

absl::StatusOr<std::vector<BackupLog::Write>> BackupLog::AppliedSince(uint64_t lsn) const {
  absl::MutexLock lock(&mu_);
  std::vector<Write> out;
  if (lsn >= applied_) return out;
  if (retained_.empty() || retained_.front().lsn > lsn + 1) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this replica no longer retains LSN ", lsn + 1, " (it keeps ",
        retained_.empty() ? std::string("none") : absl::StrCat("LSNs from ", retained_.front().lsn),
        ", max_retained_bytes ", options_.max_retained_bytes, "): rebuild the successor"));
  }
  for (const Write& w : retained_) {
    if (w.lsn > lsn) out.push_back(w);
  }
  return out;
}

uint64_t BackupLog::epoch() const {
  absl::MutexLock lock(&mu_);
  return epoch_;
}

uint64_t BackupLog::applied_lsn() const {
  absl::MutexLock lock(&mu_);
  return applied_;
}

uint64_t BackupLog::held_writes() const {
  absl::MutexLock lock(&mu_);
  return held_.size();
}

uint64_t BackupLog::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

}  // namespace pserver
