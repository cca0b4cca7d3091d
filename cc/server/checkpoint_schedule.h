// When a server's periodic checkpoints start (--checkpoint_interval).
//
// Saves are scheduled start to start: the next one begins `interval` after
// the last one began, so the newest published checkpoint is never older than
// the interval plus one save's duration (the window a kill -9 can lose, see
// docs/operations.md). A save that took longer than the interval is followed
// by the next one at once, never by a second one queued behind it.
//
//   absl::Time started = absl::Now();
//   ...save...
//   absl::Time next = NextPeriodicSave(started, interval, absl::Now());
#ifndef PSERVER_CC_SERVER_CHECKPOINT_SCHEDULE_H_
#define PSERVER_CC_SERVER_CHECKPOINT_SCHEDULE_H_

#include "absl/time/time.h"

namespace pserver {

// The start of the save after one that started at `last_started`, seen at
// `now` (after that save finished).
absl::Time NextPeriodicSave(absl::Time last_started, absl::Duration interval, absl::Time now);

// Whether a save that started at `started` and finished at `finished` took
// longer than the interval (the server logs it: its checkpoints are then
// further apart than the flag says).
bool SaveOverran(absl::Time started, absl::Time finished, absl::Duration interval);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_CHECKPOINT_SCHEDULE_H_
