#include "cc/server/frame_deadlines.h"

#include <algorithm>
#include <utility>

#include "absl/time/clock.h"

namespace pserver {

FrameDeadlines::FrameDeadlines(absl::Duration timeout, std::function<void()> on_expired)
    : timeout_(timeout),
      enabled_(timeout > absl::ZeroDuration() && timeout != absl::InfiniteDuration()),
      on_expired_(std::move(on_expired)) {
  if (enabled_) thread_ = std::thread([this] { Loop(); });
}

FrameDeadlines::~FrameDeadlines() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

FrameDeadlines::Armed::Armed(Armed&& other) noexcept
    : owner_(std::exchange(other.owner_, nullptr)), id_(other.id_) {}

FrameDeadlines::Armed& FrameDeadlines::Armed::operator=(Armed&& other) noexcept {
  if (this != &other) {
    Disarm();
    owner_ = std::exchange(other.owner_, nullptr);
    id_ = other.id_;
  }
  return *this;
}

void FrameDeadlines::Armed::Disarm() {
  if (owner_ != nullptr) std::exchange(owner_, nullptr)->Disarm(id_);
}

FrameDeadlines::Armed FrameDeadlines::Arm(ByteStream* stream) {
  if (!enabled_) return Armed();
  absl::MutexLock lock(&mu_);
  const uint64_t id = next_id_++;
  armed_.emplace(id, Entry{absl::Now() + timeout_, stream});
  return Armed(this, id);
}

void FrameDeadlines::Disarm(uint64_t id) {
  absl::MutexLock lock(&mu_);
  armed_.erase(id);  // gone already when its deadline passed
}

void FrameDeadlines::Loop() {
  absl::MutexLock lock(&mu_);
  while (!stopping_) {
    if (armed_.empty()) {
      mu_.Await(absl::Condition(this, &FrameDeadlines::ArmedOrStopping));
      continue;
    }
    // Few entries (one per connection at most): each wake looks at all.
    const absl::Time now = absl::Now();
    absl::Time earliest = absl::InfiniteFuture();
    for (auto it = armed_.begin(); it != armed_.end();) {
      if (it->second.deadline <= now) {
        it->second.stream->Shutdown();  // its reader's Read fails now
        expired_.fetch_add(1, std::memory_order_relaxed);
        if (on_expired_) on_expired_();
        armed_.erase(it++);
      } else {
        earliest = std::min(earliest, it->second.deadline);
        ++it;
      }
    }
    // Not woken by arms and disarms: a deadline armed meanwhile is later
    // than `earliest` (or, if the clock stepped back, found at this wake).
    if (earliest != absl::InfiniteFuture()) {
      mu_.AwaitWithDeadline(absl::Condition(&stopping_), earliest);
    }
  }
}

}  // namespace pserver
