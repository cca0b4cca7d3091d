#include "cc/server/standby_slots.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

constexpr char kSteppedDown[] = "stepped down";

}  // namespace


ServerOptions StandbySlotOptions(const ServerOptions& process) {
  ServerOptions slot = process;
  slot.standby = true;
  slot.accept_standbys = true;  // once it took a shard over
  slot.port = 0;
  slot.metrics_http.reset();  // one metrics listener per process: the process's own server
  // A slot serving a shard that departs is replaced (ServerSeat); the
  // process's own on_departed would stop the whole process.
  slot.on_departed = nullptr;
  return slot;
}

bool RejoinsAfterSteppingDown(const ServerOptions& options) {
  return !options.etcd_endpoints.empty() && options.accept_standbys;
}

ServerOptions RejoinOptions(const ServerOptions& options, uint32_t shard) {
  ServerOptions standby = options;
  standby.standby = true;
  standby.accept_standbys = true;  // once it took a shard over
  standby.standby_prefer_shard = shard;
  return standby;
}

// ---- ServerSeat ---------------------------------------------------------------------

ServerSeat::ServerSeat(ServerOptions standby, std::string name,
                       std::function<void(const Server&)> serving,
                       std::function<void(const std::string&)> log,
                       std::optional<absl::Duration> depart_linger)
    : standby_(std::move(standby)),
      name_(std::move(name)),
      serving_callback_(std::move(serving)),
      log_(std::move(log)),
      depart_linger_(depart_linger) {}

void ServerSeat::Run(std::unique_ptr<Server> first) {
  std::unique_ptr<Server> server = std::move(first);
  ServerOptions options = standby_;
  absl::Duration backoff = kFirstBackoff;
  while (!standby_.stop->HasBeenNotified()) {
    if (server == nullptr) {
      absl::StatusOr<std::unique_ptr<Server>> started = Server::Start(options);
      if (!started.ok()) {
        if (standby_.stop->HasBeenNotified()) return;
        if (absl::IsAborted(started.status())) {
          // Its standby left its shard (departed, or to back up one that
          // lacks a backup; Server::FollowPrimary): a fresh one looks at once.
          {
            absl::MutexLock lock(&mu_);
            ++left_;
          }
          log_(absl::StrCat(name_, ": ", started.status().message(),
                            "; starting a fresh standby"));
          options = standby_;
          backoff = kFirstBackoff;
          continue;
        }
        log_(absl::StrCat(name_, ": ", started.status().ToString(), "; starting it again in ",
                          absl::FormatDuration(backoff)));
        standby_.stop->WaitForNotificationWithTimeout(backoff);
        backoff = std::min(backoff * 2, kMaxBackoff);
        continue;
      }
      backoff = kFirstBackoff;
      server = *std::move(started);
      serving_callback_(*server);
    }
    const Server* const raw = server.get();
    {
      absl::MutexLock lock(&mu_);
      serving_ = std::move(server);
    }
    const std::string gone_why = UntilGone(*raw);
    if (gone_why.empty()) return;  // the process stops; Stop shuts it down
    // Fenced for good, or departed: it serves nothing more, and its state
    // may hold writes never acknowledged. It goes, and a fresh standby
    // copies a shard anew.
    {
      absl::MutexLock lock(&mu_);
      server = std::move(serving_);
      ++replaced_;
    }
    const uint32_t shard = server->index();
    const bool departed = gone_why != kSteppedDown;
    log_(absl::StrCat(name_, ": its server of shard ", shard, " ", gone_why,
                      "; shutting it down and starting a fresh standby in its place",
                      departed ? ""
                               : absl::StrCat(" (it copies shard ", shard,
                                              " again when that shard has the fewest backups)")));
    server->Shutdown(absl::ZeroDuration());
    server.reset();  // drops its state; leaves the process's slots
    // A departed shard is served by no one any more: back up any.
    options = departed ? standby_ : RejoinOptions(standby_, shard);
  }
  absl::MutexLock lock(&mu_);
  if (server != nullptr) serving_ = std::move(server);
}

std::string ServerSeat::UntilGone(const Server& server) const {
  // A stepped-down server says so at once (Fence); looked at every 100 ms.
  while (!standby_.stop->WaitForNotificationWithTimeout(absl::Milliseconds(100))) {
    if (server.stepped_down()) return std::string(kSteppedDown);
    if (depart_linger_.has_value() && server.departed()) {
      // Clients still routing by the moving placement are redirected
      // meanwhile (as the process's own server does for --depart_linger_seconds).
      if (standby_.stop->WaitForNotificationWithTimeout(*depart_linger_)) return "";
      return absl::StrCat("departed in a live move (after ", absl::FormatDuration(*depart_linger_),
                          " answering redirects)");
    }
  }
  return "";
}

absl::Status ServerSeat::Stop(absl::Duration grace) {
  std::unique_ptr<Server> server;
  {
    absl::MutexLock lock(&mu_);
    server = std::move(serving_);
  }
  if (server == nullptr) return absl::OkStatus();
  server->Shutdown(grace);
  return server->final_save_status();
}

bool ServerSeat::serving() const {
  absl::MutexLock lock(&mu_);
  return serving_ != nullptr;
}

int ServerSeat::replaced() const {
  absl::MutexLock lock(&mu_);
  return replaced_;
}

int ServerSeat::left() const {
  absl::MutexLock lock(&mu_);
  return left_;
}

// ---- StandbySlots -------------------------------------------------------------------

StandbySlots::StandbySlots(const ServerOptions& process, int count,
                           std::function<void(const Server&)> took_over,
                           std::function<void(const std::string&)> log,
                           absl::Duration depart_linger)
    : options_(StandbySlotOptions(process)) {
  for (int slot = 0; slot < count; ++slot) {
    seats_.push_back(std::make_unique<ServerSeat>(
        options_, absl::StrCat("standby slot ", slot + 1), took_over, log, depart_linger));
  }
  for (int slot = 0; slot < count; ++slot) {
    threads_.emplace_back([this, slot] { seats_[slot]->Run(nullptr); });
  }
}

StandbySlots::~StandbySlots() {
  if (stopped_) return;
  if (!options_.stop->HasBeenNotified()) options_.stop->Notify();
  Stop(absl::ZeroDuration()).IgnoreError();
}

absl::Status StandbySlots::Stop(absl::Duration grace) {
  stopped_ = true;
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  absl::Status first_failure;
  for (std::unique_ptr<ServerSeat>& seat : seats_) {
    if (absl::Status saved = seat->Stop(grace); !saved.ok() && first_failure.ok()) {
      first_failure = saved;
    }
  }
  return first_failure;
}

int StandbySlots::serving() const {
  int serving = 0;
  for (const std::unique_ptr<ServerSeat>& seat : seats_) serving += seat->serving() ? 1 : 0;
  return serving;
}

int StandbySlots::replaced() const {
  int replaced = 0;
  for (const std::unique_ptr<ServerSeat>& seat : seats_) replaced += seat->replaced();
  return replaced;
}

int StandbySlots::left() const {
  int left = 0;
  for (const std::unique_ptr<ServerSeat>& seat : seats_) left += seat->left();
  return left;
}

}  // namespace pserver
