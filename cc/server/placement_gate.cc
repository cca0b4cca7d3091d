#include "cc/server/placement_gate.h"

#include <algorithm>
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
  if (to.version() > placement_.version()) {
    // A list not taken before this newer placement is stale: what it names
    // may have come back in a later move, and must not be dropped then.
    // (The server takes it right after each change; kept, it costs memory.)
    handed_over_.reset();
    if (from_.has_value() && !from.has_value() && to.num_servers() == placement_.num_servers()) {
      // The move ended: what was handed over in it stays handed over.
      HandedOver done{placement_.version(), to, {}, {}};
      for (const auto& [key, state] : blocks_) {
        if (state == State::kHandedOver) done.blocks.push_back(key);
      }
      for (const auto& [key, state] : buckets_) {
        if (state == State::kHandedOver && std::get<2>(key) == self_) {
          done.buckets.emplace_back(std::get<0>(key), std::get<1>(key));
        }
      }
      std::sort(done.blocks.begin(), done.blocks.end());  // in (name, index) order
      std::sort(done.buckets.begin(), done.buckets.end());
      if (!done.blocks.empty() || !done.buckets.empty()) handed_over_ = std::move(done);
    }
    blocks_.clear();
    buckets_.clear();
  }
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
  const int to = placement_.ServerOf(name, block.index());
  std::optional<int> from;
  std::optional<State> state;
  if (from_.has_value()) {
    from = from_->ServerOf(name, block.index());
    auto it = blocks_.find(BlockKey(std::string(name), block.index()));
    if (it != blocks_.end()) state = it->second;
  }
  if (to == self_ && (!from.has_value() || *from == self_)) return absl::OkStatus();
  return Decide(DescribeBlock(name, block), from, to, state, write);
}

absl::Status PlacementGate::Decide(absl::string_view what, std::optional<int> from, int to,
                                   std::optional<State> state, bool write) const {
  const uint64_t version = placement_.version();
  if (!from.has_value()) {
    if (to == self_) return absl::OkStatus();
    return PlacementMoved(version, what, to, self_);
  }
  if (*from == self_ && to == self_) return absl::OkStatus();
  if (*from == self_) {
    if (!state.has_value() || (*state == State::kHeld && !write)) return absl::OkStatus();
    if (*state == State::kHeld) {
      return Refusal(absl::UnavailableError(
          absl::StrCat(what, " is being handed to server ", to, " (placement version ", version,
                       "); nothing applied; retry")));
    }
    return PlacementMoved(version, what, to, self_);
  }
  if (to == self_) {
    if (state == State::kReceived) return absl::OkStatus();
    return Refusal(absl::UnavailableError(absl::StrCat(
        what, " not yet received: placement version ", version, " moves it from server ", *from,
        " to this server ", self_, "; nothing applied; retry")));
  }
  return PlacementMoved(version, what, *from, self_);
}

absl::Status PlacementGate::CheckKeys(absl::string_view table,
                                      const v1::Partitioning& partitioning,
                                      absl::Span<const uint64_t> keys, bool write) const {
  absl::ReaderMutexLock lock(&mu_);
  for (uint64_t key : keys) {
    PS_ASSIGN_OR_RETURN(const int to, KeyServer(key, partitioning, placement_));
    std::optional<int> from;
    std::optional<State> state;
    if (from_.has_value()) {
      PS_ASSIGN_OR_RETURN(from, KeyServer(key, partitioning, *from_));
      auto it = buckets_.find(BucketKey(std::string(table), KeyBucket(key), *from));
      if (it != buckets_.end()) state = it->second;
    }
    if (to == self_ && (!from.has_value() || *from == self_)) continue;
    PS_RETURN_IF_ERROR(
        Decide(absl::StrCat("table '", table, "' key ", key), from, to, state, write));
  }
  return absl::OkStatus();
}

bool PlacementGate::Moving(uint64_t version) const {
  absl::ReaderMutexLock lock(&mu_);
  return from_.has_value() && placement_.version() == version;
}

bool PlacementGate::moving() const {
  absl::ReaderMutexLock lock(&mu_);
  return from_.has_value();
}

absl::StatusOr<std::optional<int>> PlacementGate::KeyDestination(
    uint64_t version, int from, const v1::Partitioning& partitioning, uint64_t key) const {
  absl::ReaderMutexLock lock(&mu_);
  if (!from_.has_value() || placement_.version() != version) return std::nullopt;
  PS_ASSIGN_OR_RETURN(const int owner, KeyServer(key, partitioning, *from_));
  if (owner != from) return std::nullopt;
  PS_ASSIGN_OR_RETURN(const int to, KeyServer(key, partitioning, placement_));
  if (to == from) return std::nullopt;
  return to;
}

void PlacementGate::HoldBuckets(absl::string_view table, uint32_t begin, uint32_t end) {
  absl::MutexLock lock(&mu_);
  for (uint32_t b = begin; b < end; ++b) buckets_[BucketKey(std::string(table), b, self_)] = State::kHeld;
}

void PlacementGate::ReleaseBuckets(absl::string_view table, uint32_t begin, uint32_t end,
                                   bool handed_over) {
  absl::MutexLock lock(&mu_);
  for (uint32_t b = begin; b < end; ++b) {
    auto it = buckets_.find(BucketKey(std::string(table), b, self_));
    if (it == buckets_.end() || it->second != State::kHeld) continue;  // the placement changed
    if (handed_over) {
      it->second = State::kHandedOver;
    } else {
      buckets_.erase(it);
    }
  }
}

bool PlacementGate::BucketHandedOver(absl::string_view table, uint32_t bucket) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = buckets_.find(BucketKey(std::string(table), bucket, self_));
  return it != buckets_.end() && it->second == State::kHandedOver;
}

absl::Status PlacementGate::CheckReceiveKey(uint64_t version, int from, absl::string_view table,
                                            const v1::Partitioning& partitioning,
                                            uint64_t key) const {
  absl::ReaderMutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckReceiveLocked(version));
  PS_ASSIGN_OR_RETURN(const int to, KeyServer(key, partitioning, placement_));
  PS_ASSIGN_OR_RETURN(const int owner, KeyServer(key, partitioning, *from_));
  if (to != self_ || owner != from) {
    return absl::FailedPreconditionError(absl::StrCat(
        "table '", table, "' key ", key, " goes from server ", owner, " to server ", to,
        " under placement version ", version, ", not from server ", from, " to this server ",
        self_));
  }
  return absl::OkStatus();
}

absl::Status PlacementGate::CheckReceiveVersion(uint64_t version) const {
  absl::ReaderMutexLock lock(&mu_);
  return CheckReceiveLocked(version);
}

void PlacementGate::ReceivedBuckets(absl::string_view table, int from, uint32_t begin,
                                    uint32_t end) {
  absl::MutexLock lock(&mu_);
  for (uint32_t b = begin; b < end; ++b) {
    buckets_[BucketKey(std::string(table), b, from)] = State::kReceived;
  }
}

bool PlacementGate::BucketReceived(absl::string_view table, uint32_t bucket, int from) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = buckets_.find(BucketKey(std::string(table), bucket, from));
  return it != buckets_.end() && it->second == State::kReceived;
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

std::optional<PlacementGate::HandedOver> PlacementGate::TakeHandedOver() {
  absl::MutexLock lock(&mu_);
  std::optional<HandedOver> taken = std::move(handed_over_);
  handed_over_.reset();
  return taken;
}

absl::Status PlacementGate::CheckReceiveLocked(uint64_t version) const {
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
  return absl::OkStatus();
}

absl::Status PlacementGate::CheckReceive(uint64_t version, absl::string_view name,
                                         uint32_t index) const {
  absl::ReaderMutexLock lock(&mu_);
  PS_RETURN_IF_ERROR(CheckReceiveLocked(version));
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
