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
  // A slot serving a shard that departs is replaced (StandbySlots::Run);
  // the process's own on_departed would stop the whole process.
  slot.on_departed = nullptr;
  return slot;
}

StandbySlots::StandbySlots(const ServerOptions& process, int count,
                           std::function<void(const Server&)> took_over,
                           std::function<void(const std::string&)> log,
                           absl::Duration depart_linger)
    : options_(StandbySlotOptions(process)),
      depart_linger_(depart_linger),
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
      const std::string gone_why = UntilGone(*server);
      if (gone_why.empty()) return;  // the process stops
      // Fenced for good, or departed: it serves nothing more. A fresh
      // standby takes its place (the process's shards need their backups).
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
      log_(absl::StrCat("standby slot ", slot + 1, ": its server of shard ", gone->index(), " ",
                        gone_why, "; shutting it down and starting a fresh standby in its place"));
      gone->Shutdown(absl::ZeroDuration());
      gone.reset();  // leaves the process's slots
      continue;
    }
    if (options_.stop->HasBeenNotified()) return;
    if (absl::IsAborted(started.status())) {
      // Its standby left its shard (departed, or to back up one that lacks
      // a backup; Server::FollowPrimary): a fresh one looks at once.
      {
        absl::MutexLock lock(&mu_);
        ++left_;
      }
      log_(absl::StrCat("standby slot ", slot + 1, ": ", started.status().message(),
                        "; starting a fresh standby"));
      backoff = kFirstBackoff;
      continue;
    }
    log_(absl::StrCat("standby slot ", slot + 1, ": ", started.status().ToString(),
                      "; starting it again in ", absl::FormatDuration(backoff)));
    options_.stop->WaitForNotificationWithTimeout(backoff);
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
}

std::string StandbySlots::UntilGone(const Server& server) const {
  // A stepped-down server says so at once (Fence); looked at every 100 ms.
  while (!options_.stop->WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    if (server.stepped_down()) return "stepped down";
    if (server.departed()) {
      // Clients still routing by the moving placement are redirected
      // meanwhile (as the process's own server does for --depart_linger_seconds).
      if (options_.stop->WaitForNotificationWithTimeout(depart_linger_)) return "";
      return absl::StrCat("departed in a live move (after ",
                          absl::FormatDuration(depart_linger_), " answering redirects)");
    }
  }
  return "";
}

int StandbySlots::left() const {
  absl::MutexLock lock(&mu_);
  return left_;
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
