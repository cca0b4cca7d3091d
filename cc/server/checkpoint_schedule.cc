#include "cc/server/checkpoint_schedule.h"

#include <algorithm>

namespace pserver {

absl::Time NextPeriodicSave(absl::Time last_started, absl::Duration interval, absl::Time now) {
  return std::max(last_started + interval, now);
}

bool SaveOverran(absl::Time started, absl::Time finished, absl::Duration interval) {
  return finished - started > interval;
}

}  // namespace pserver
