#include "cc/server/primary_log.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

std::vector<absl::Status> SendToEach(size_t count,
                                     absl::FunctionRef<absl::Status(size_t)> send) {
  std::vector<absl::Status> answers(count);
  std::vector<std::thread> others;
  others.reserve(count > 0 ? count - 1 : 0);
  for (size_t i = 1; i < count; ++i) {
    others.emplace_back([&answers, &send, i] { answers[i] = send(i); });
  }
  if (count > 0) answers[0] = send(0);
  for (std::thread& other : others) other.join();
  return answers;
}

PrimaryLog::PrimaryLog(uint64_t epoch, uint64_t last_lsn, size_t backups, Options options,
                       Send send)
    : epoch_(epoch),
      backups_(backups),
      options_(options),
      send_(std::move(send)),
      last_lsn_(last_lsn) {}

absl::Status PrimaryLog::Write(absl::string_view method, std::string request,
                               absl::FunctionRef<absl::Status()> apply,
                               std::vector<absl::Status>* acks) {
  if (acks != nullptr) acks->clear();
  const uint64_t bytes = method.size() + request.size();
  BackupLog::Write write;
  {
    absl::MutexLock order(&order_mu_);
    {
      absl::MutexLock lock(&mu_);
      if (in_flight_writes_ >= options_.max_in_flight_writes ||
          in_flight_bytes_ + bytes > options_.max_in_flight_bytes) {
        return absl::UnavailableError(absl::StrCat(
            "primary has ", in_flight_writes_, " writes (", in_flight_bytes_,
            " bytes) not yet acknowledged by every backup, at its bound of ",
            options_.max_in_flight_writes, " writes and ", options_.max_in_flight_bytes,
            " bytes; nothing was applied; retry"));
      }
    }
    if (absl::Status applied = apply(); !applied.ok()) return applied;
    absl::MutexLock lock(&mu_);
    write = {epoch_, ++last_lsn_, std::string(method), std::move(request)};
    ++in_flight_writes_;
    in_flight_bytes_ += bytes;
  }
  // Every backup gets it, whatever another answered: a backup missing an
  // LSN would hold every later one.
  std::vector<absl::Status> answers =
      SendToEach(backups_, [&](size_t backup) { return send_(backup, write); });
  absl::Status result;
  for (size_t backup = 0; backup < answers.size(); ++backup) {
    const absl::Status& acked = answers[backup];
    if (!acked.ok() && result.ok()) {
      result = absl::Status(acked.code(),
                            absl::StrCat("backup ", backup, " did not acknowledge LSN ", write.lsn,
                                         " (", write.method, ") of epoch ", write.epoch, ": ",
                                         acked.message()));
    }
  }
  if (acks != nullptr) *acks = std::move(answers);
  absl::MutexLock lock(&mu_);
  --in_flight_writes_;
  in_flight_bytes_ -= bytes;
  return result;
}

uint64_t PrimaryLog::last_lsn() const {
  absl::MutexLock lock(&mu_);
  return last_lsn_;
}

uint64_t PrimaryLog::in_flight_writes() const {
  absl::MutexLock lock(&mu_);
  return in_flight_writes_;
}

uint64_t PrimaryLog::in_flight_bytes() const {
  absl::MutexLock lock(&mu_);
  return in_flight_bytes_;
}

}  // namespace pserver
