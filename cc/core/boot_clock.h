// BootClockNow: time since the machine booted, on CLOCK_BOOTTIME, which
// counts time the process was stopped (SIGSTOP) and the machine was
// suspended, and never jumps with the wall clock. What a lease bound is
// measured on (cc/server/fence.h): the time a lease has left must count every
// second etcd counted, suspended ones included; CLOCK_MONOTONIC stops while
// the machine sleeps, and the wall clock can be set back.
//
//   const absl::Duration sent = BootClockNow();
//   ... a renewal etcd granted ...
//   const bool confirmed = BootClockNow() < sent + ttl - margin;
//
// Thread-safe.
#ifndef PSERVER_CC_CORE_BOOT_CLOCK_H_
#define PSERVER_CC_CORE_BOOT_CLOCK_H_

#include <time.h>

#include "absl/time/time.h"

namespace pserver {

inline absl::Duration BootClockNow() {
  struct timespec now;
  if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) clock_gettime(CLOCK_MONOTONIC, &now);
  return absl::DurationFromTimespec(now);
}

}  // namespace pserver

#endif  // PSERVER_CC_CORE_BOOT_CLOCK_H_
