#include "cc/server/standby_slots.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {

ServerOptions StandbySlotOptions(const ServerOptions& process) {
  ServerOptions slot = process;
  slot.standby = true;
  slot.accept_standbys = true;  // once it took a shard over
  slot.port = 0;
  slot.metrics_http.reset();  // one metrics listener per process: the process's own server
  return slot;
}

StandbySlots::StandbySlots(const ServerOptions& process, int count,
                           std::function<void(const Server&)> took_over,
                           std::function<void(const std::string&)> log)
    : options_(StandbySlotOptions(process)),
      took_over_(std::move(took_over)),
      log_(std::move(log)) {
  for (int slot = 0; slot < count; ++slot) threads_.emplace_back([this, slot] { Run(slot); });
}

StandbySlots::~StandbySlots() {
  if (stopped_) return;
  if (!options_.stop->HasBeenNotified()) options_.stop->Notify();
  Stop(absl::ZeroDuration()).IgnoreError();
}

void StandbySlots::Run(int slot) {
  absl::Duration backoff = kFirstBackoff;
  while (!options_.stop->HasBeenNotified()) {
    absl::StatusOr<std::unique_ptr<Server>> started = Server::Start(options_);
    if (started.ok()) {
      backoff = kFirstBackoff;
      const Server* server = started->get();
      took_over_(*server);
      {
        absl::MutexLock lock(&mu_);
        serving_.push_back(*std::move(started));
      }
      if (!UntilSteppedDown(*server)) return;  // the process stops
      // Fenced for good: it serves nothing more. A fresh standby takes its
      // place (the process's shards need their backups).
      std::unique_ptr<Server> gone;
      {
        absl::MutexLock lock(&mu_);
        for (auto it = serving_.begin(); it != serving_.end(); ++it) {
          if (it->get() != server) continue;
          gone = std::move(*it);
          serving_.erase(it);
          break;
        }
        ++replaced_;
      }
      log_(absl::StrCat("standby slot ", slot + 1, ": its server of shard ", gone->index(),
                        " stepped down; shutting it down and starting a fresh standby in "
                        "its place"));
      gone->Shutdown(absl::ZeroDuration());
      gone.reset();  // leaves the process's slots
      continue;
    }
    if (options_.stop->HasBeenNotified()) return;
    log_(absl::StrCat("standby slot ", slot + 1, ": ", started.status().ToString(),
                      "; starting it again in ", absl::FormatDuration(backoff)));
    options_.stop->WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

bool StandbySlots::UntilSteppedDown(const Server& server) const {
  // A stepped-down server says so at once (Fence); looked at every 100 ms.
  while (!options_.stop->WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    if (server.stepped_down()) return true;
  }
  return false;
}

int StandbySlots::replaced() const {
  absl::MutexLock lock(&mu_);
  return replaced_;
}

absl::Status StandbySlots::Stop(absl::Duration grace) {
  stopped_ = true;
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  absl::Status first_failure;
  absl::MutexLock lock(&mu_);
  for (std::unique_ptr<Server>& server : serving_) {
    server->Shutdown(grace);
    if (absl::Status saved = server->final_save_status(); !saved.ok() && first_failure.ok()) {
      first_failure = saved;
    }
  }
  return first_failure;
}

int StandbySlots::serving() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int>(serving_.size());
}

}  // namespace pserver
