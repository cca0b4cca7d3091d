#include "cc/server/standby_slots.h"

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
  while (!options_.stop->HasBeenNotified()) {
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options_);
    if (server.ok()) {
      took_over_(**server);
      absl::MutexLock lock(&mu_);
      serving_.push_back(*std::move(server));
      return;
    }
    if (options_.stop->HasBeenNotified()) return;
    log_(absl::StrCat("standby slot ", slot + 1, ": ", server.status().ToString(),
                      "; starting it again in 1s"));
    options_.stop->WaitForNotificationWithTimeout(absl::Seconds(1));
  }
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
