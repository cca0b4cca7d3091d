// PlacementGate: whether this server owns a dense block under the cluster's
// current placement (live moves, docs/elastic.md). A server started with
// --placement_redirects sets one on its dispatcher and keeps it at etcd's
// /placement (it watches the key); every bulk push and read then checks each
// block before anything is applied or read, and a block this server does
// not own is answered with PlacementMoved (FAILED_PRECONDITION naming the
// version and the owner), never applied.
//
//   PlacementGate gate(/*self=*/0, placement);
//   dispatcher.SetPlacementGate(&gate);
//   gate.Set(newer);                          // /placement changed
//   PS_RETURN_IF_ERROR(gate.CheckBlock("w", block));
//
// Only dense blocks are checked: table keys, control methods (InitParam,
// GetParam, ...) and worker clocks are not (docs/elastic.md, limits).
//
// Thread-safe: Set takes a writer lock, checks a reader lock.
#ifndef PSERVER_CC_SERVER_PLACEMENT_GATE_H_
#define PSERVER_CC_SERVER_PLACEMENT_GATE_H_

#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/placement.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

class PlacementGate {
 public:
  PlacementGate(int self, Placement placement);
  PlacementGate(const PlacementGate&) = delete;
  PlacementGate& operator=(const PlacementGate&) = delete;

  // From now on blocks are checked against `placement`; an older version
  // than the one held is ignored (etcd's watch may replay).
  void Set(const Placement& placement) ABSL_LOCKS_EXCLUDED(mu_);
  uint64_t version() const ABSL_LOCKS_EXCLUDED(mu_);

  // OK when block `block` of parameter `name` is this server's under the
  // current placement; PlacementMoved otherwise.
  absl::Status CheckBlock(absl::string_view name, const v1::BlockRef& block) const
      ABSL_LOCKS_EXCLUDED(mu_);

 private:
  const int self_;
  mutable absl::Mutex mu_;
  Placement placement_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PLACEMENT_GATE_H_
