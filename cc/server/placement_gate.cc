#include "cc/server/placement_gate.h"

#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "cc/core/gradient_view.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

constexpr char kGateRefusalPayload[] = "pserver.placement_gate.refusal";

absl::Status Refusal(absl::Status status) {
  status.SetPayload(kGateRefusalPayload, absl::Cord("1"));
  return status;
}

}  // namespace

bool IsGateRefusal(const absl::Status& status) {
  return PlacementMovedVersion(status).has_value() ||
         status.GetPayload(kGateRefusalPayload).has_value();
}

PlacementGate::PlacementGate(int self, Placement placement)
    : self_(self), placement_(std::move(placement)) {}

void PlacementGate::SetLocked(const Placement& to, std::optional<Placement> from) {
  if (to.version() < placement_.version()) return;
  // A replayed value (same version) keeps the move's progress.
  if (to.version() > placement_.version()) blocks_.clear();
  placement_ = to;
  from_ = std::move(from);
}

void PlacementGate::Set(const Placement& placement) {
  absl::MutexLock lock(&mu_);
  SetLocked(placement, std::nullopt);
}

absl::Status PlacementGate::SetSpec(const v1::Placement& spec) {
  PS_ASSIGN_OR_RETURN(Placement to, Placement::FromSpec(spec, 1));
  std::optional<Placement> from;
  if (spec.moving()) {
    v1::Placement before = spec;
    before.set_num_servers(spec.from_num_servers());
    before.set_moving(false);
    before.set_from_num_servers(0);
    absl::StatusOr<Placement> made = Placement::FromSpec(before, 1);
    if (!made.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("a moving placement's from_num_servers: ", made.status().message()));
    }
    from = *std::move(made);
  }
  absl::MutexLock lock(&mu_);
  SetLocked(to, std::move(from));
  return absl::OkStatus();
}

uint64_t PlacementGate::version() const {
  absl::ReaderMutexLock lock(&mu_);
  return placement_.version();
}

v1::Placement PlacementGate::spec() const {
  absl::ReaderMutexLock lock(&mu_);
  v1::Placement spec = placement_.spec();
  if (from_.has_value()) {
    spec.set_moving(true);
    spec.set_from_num_servers(static_cast<uint32_t>(from_->num_servers()));
  }
  return spec;
}

absl::Status PlacementGate::CheckBlock(absl::string_view name, const v1::BlockRef& block) const {
  return Check(name, block, /*write=*/true);
}

absl::Status PlacementGate::CheckRead(absl::string_view name, const v1::BlockRef& block) const {
  return Check(name, block, /*write=*/false);
}

absl::Status PlacementGate::Check(absl::string_view name, const v1::BlockRef& block,
                                  bool write) const {
  absl::ReaderMutexLock lock(&mu_);
  const uint64_t version = placement_.version();
  const int to = placement_.ServerOf(name, block.index());
  if (!from_.has_value()) {
    if (to == self_) return absl::OkStatus();
    return PlacementMoved(version, DescribeBlock(name, block), to, self_);
  }
  const int from = from_->ServerOf(name, block.index());
  if (from == self_ && to == self_) return absl::OkStatus();
  auto it = blocks_.find(BlockKey(std::string(name), block.index()));
  const std::optional<State> state =
      it == blocks_.end() ? std::nullopt : std::optional<State>(it->second);
  if (from == self_) {
    if (!state.has_value() || (*state == State::kHeld && !write)) return absl::OkStatus();
    if (*state == State::kHeld) {
      return Refusal(absl::UnavailableError(
          absl::StrCat(DescribeBlock(name, block), " is being handed to server ", to,
                       " (placement version ", version, "); nothing applied; retry")));
    }
    return PlacementMoved(version, DescribeBlock(name, block), to, self_);
  }
  if (to == self_) {
    if (state == State::kReceived) return absl::OkStatus();
    return Refusal(absl::UnavailableError(absl::StrCat(
        DescribeBlock(name, block), " not yet received: placement version ", version,
        " moves it from server ", from, " to this server ", self_, "; nothing applied; retry")));
  }
  return PlacementMoved(version, DescribeBlock(name, block), from, self_);
}

std::optional<int> PlacementGate::Destination(uint64_t version, absl::string_view name,
                                              uint32_t index) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!from_.has_value() || placement_.version() != version) return std::nullopt;
  if (from_->ServerOf(name, index) != self_) return std::nullopt;
  const int to = placement_.ServerOf(name, index);
  if (to == self_) return std::nullopt;
  auto it = blocks_.find(BlockKey(std::string(name), index));
  if (it != blocks_.end() && it->second == State::kHandedOver) return std::nullopt;
  return to;
}

void PlacementGate::Hold(const std::vector<BlockKey>& blocks) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : blocks) blocks_[key] = State::kHeld;
}

void PlacementGate::Release(const std::vector<BlockKey>& blocks, bool handed_over) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : blocks) {
    auto it = blocks_.find(key);
    if (it == blocks_.end() || it->second != State::kHeld) continue;  // the placement changed
    if (handed_over) {
      it->second = State::kHandedOver;
    } else {
      blocks_.erase(it);
    }
  }
}

size_t PlacementGate::handed_over() const {
  absl::ReaderMutexLock lock(&mu_);
  size_t n = 0;
  for (const auto& [key, state] : blocks_) n += state == State::kHandedOver;
  return n;
}

absl::Status PlacementGate::CheckReceive(uint64_t version, absl::string_view name,
                                         uint32_t index) const {
  absl::ReaderMutexLock lock(&mu_);
  if (placement_.version() < version) {
    return absl::UnavailableError(absl::StrCat("server ", self_, " knows placement version ",
                                               placement_.version(), ", not yet ", version,
                                               "; retry"));
  }
  if (placement_.version() != version || !from_.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("server ", self_, " is at placement version ", placement_.version(),
                     from_.has_value() ? " (moving)" : " (not moving)",
                     ": a copy for the move of version ", version, " is refused"));
  }
  const int to = placement_.ServerOf(name, index);
  if (to != self_) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter '", name, "' block ", index, " goes to server ", to, " under placement version ",
        version, ", not to this server ", self_));
  }
  return absl::OkStatus();
}

void PlacementGate::Received(const std::vector<BlockKey>& blocks) {
  absl::MutexLock lock(&mu_);
  for (const BlockKey& key : blocks) blocks_[key] = State::kReceived;
}

}  // namespace pserver
