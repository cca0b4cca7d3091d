#include "cc/server/primary_log.h"

#include <algorithm>
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
                       Send send, Post post)
    : epoch_(epoch),
      backups_(backups),
      options_(options),
      send_(std::move(send)),
      post_(std::move(post)),
      last_lsn_(last_lsn) {}

absl::Status PrimaryLog::Write(absl::string_view method, std::string request,
                               absl::FunctionRef<absl::Status()> apply,
                               std::vector<absl::Status>* acks) {
  return WriteImpl(method, std::move(request), SharedBytes{},
                   [&](absl::FunctionRef<void()>) { return apply(); }, acks);
}

absl::Status PrimaryLog::WriteShippingFirst(absl::string_view method, SharedBytes request,
                                            ApplyShipping apply,
                                            std::vector<absl::Status>* acks, uint64_t* lsn) {
  return WriteImpl(method, std::string(), std::move(request), apply, acks, lsn);
}

absl::Status PrimaryLog::WriteImpl(absl::string_view method, std::string request,
                                   SharedBytes shared, ApplyShipping apply,
                                   std::vector<absl::Status>* acks, uint64_t* lsn) {
  if (acks != nullptr) acks->clear();
  if (lsn != nullptr) *lsn = 0;
  const uint64_t bytes = method.size() + request.size() + shared.size();
  BackupLog::Write write;
  // Per backup, what completes a delivery handed over before the apply
  // (null: Send delivers it afterwards).
  std::vector<std::function<absl::Status()>> posted(backups_);
  bool numbered = false;
  absl::Status applied;
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
    // Takes the next LSN (under the order lock: LSN order is apply order).
    auto number = [&] {
      absl::MutexLock lock(&mu_);
      write.epoch = epoch_;
      write.lsn = ++last_lsn_;
      write.method = std::string(method);
      write.request = std::move(request);
      write.shared = std::move(shared);
      ++in_flight_writes_;
      in_flight_bytes_ += bytes;
      numbered = true;
    };
    applied = apply([&] {
      if (numbered) return;
      number();
      if (post_ == nullptr) return;
      for (size_t backup = 0; backup < backups_; ++backup) posted[backup] = post_(backup, write);
    });
    if (!numbered) {
      // Refused here: no LSN, sent nowhere.
      if (!applied.ok()) return applied;
      number();
    }
  }
  // Every backup gets it, whatever another answered: a backup missing an
  // LSN would hold every later one.
  auto deliver = [&](size_t backup) {
    return posted[backup] != nullptr ? posted[backup]() : send_(backup, write);
  };
  std::vector<absl::Status> answers;
  if (std::all_of(posted.begin(), posted.end(), [](const auto& p) { return p != nullptr; })) {
    // All in flight already: their answers are awaited here, one by one.
    answers.reserve(backups_);
    for (size_t backup = 0; backup < backups_; ++backup) answers.push_back(deliver(backup));
  } else {
    answers = SendToEach(backups_, deliver);
  }
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
  if (result.ok()) result = applied;
  if (acks != nullptr) *acks = std::move(answers);
  if (lsn != nullptr) *lsn = write.lsn;
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
