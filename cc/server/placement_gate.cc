#include "cc/server/placement_gate.h"

#include <utility>

#include "cc/core/gradient_view.h"

namespace pserver {

PlacementGate::PlacementGate(int self, Placement placement)
    : self_(self), placement_(std::move(placement)) {}

void PlacementGate::Set(const Placement& placement) {
  absl::MutexLock lock(&mu_);
  if (placement.version() >= placement_.version()) placement_ = placement;
}

uint64_t PlacementGate::version() const {
  absl::ReaderMutexLock lock(&mu_);
  return placement_.version();
}

absl::Status PlacementGate::CheckBlock(absl::string_view name, const v1::BlockRef& block) const {
  absl::ReaderMutexLock lock(&mu_);
  const int owner = placement_.ServerOf(name, block.index());
  if (owner == self_) return absl::OkStatus();
  return PlacementMoved(placement_.version(), DescribeBlock(name, block), owner, self_);
}

}  // namespace pserver
