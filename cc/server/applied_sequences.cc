#include "cc/server/applied_sequences.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {

AppliedSequences::Client& AppliedSequences::Use(uint64_t client) {
  auto [it, inserted] = clients_.try_emplace(client);
  if (inserted) {
    it->second.use = by_use_.insert(by_use_.end(), client);
  } else {
    by_use_.splice(by_use_.end(), by_use_, it->second.use);
  }
  return it->second;
}

void AppliedSequences::Forget(absl::flat_hash_map<uint64_t, Client>::iterator it) {
  sequences_kept_ -= it->second.applied.size();
  by_use_.erase(it->second.use);
  clients_.erase(it);
}

void AppliedSequences::KeepWithinBounds(uint64_t keep) {
  // One pass from the least recently used: clients with requests in
  // progress (at most one per call being served) are skipped.
  for (auto next = by_use_.begin();
       next != by_use_.end() &&
       (clients_.size() > max_clients_ || sequences_kept_ > max_sequences_kept_);) {
    auto it = clients_.find(*next++);
    if (it->first == keep || !it->second.in_progress.empty()) continue;
    Forget(it);
    ++forgotten_;
  }
}

void AppliedSequences::TrimPending(Client& c) const {
  while (c.applied.size() > max_pending_) {
    c.low_water = *c.applied.begin();
    c.applied.erase(c.applied.begin());
  }
}

void AppliedSequences::set_max_clients(size_t max_clients) {
  absl::MutexLock lock(&mu_);
  max_clients_ = std::max<size_t>(max_clients, 1);
  KeepWithinBounds(0);
}

AppliedSequences::Outcome AppliedSequences::Begin(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  Client& c = Use(client);
  if (sequence <= c.low_water || c.applied.count(sequence) > 0) return kApplied;
  if (!c.in_progress.insert(sequence).second) return kInProgress;
  KeepWithinBounds(client);
  return kNew;
}

void AppliedSequences::Abandon(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  c.in_progress.erase(sequence);
  // A client whose only requests were refused leaves nothing behind.
  if (c.low_water == 0 && c.applied.empty() && c.in_progress.empty()) Forget(it);
}

void AppliedSequences::Finish(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  Client& c = Use(client);
  const size_t applied_before = c.applied.size();
  c.in_progress.erase(sequence);
  if (sequence > c.low_water) {
    c.applied.insert(sequence);
    TrimPending(c);
    while (!c.applied.empty() && *c.applied.begin() == c.low_water + 1) {
      c.low_water = *c.applied.begin();
      c.applied.erase(c.applied.begin());
    }
  }
  sequences_kept_ = sequences_kept_ - applied_before + c.applied.size();
  KeepWithinBounds(client);
}

std::string AppliedSequences::Serialize() const {
  v1::AppliedSequences out;
  {
    absl::MutexLock lock(&mu_);
    for (const auto& [id, c] : clients_) {
      if (c.low_water == 0 && c.applied.empty()) continue;
      v1::ClientSequences* entry = out.add_clients();
      entry->set_client_id(id);
      entry->set_low_water(c.low_water);
      for (uint64_t s : c.applied) entry->add_applied(s);
    }
  }
  // Deterministic bytes for the same state.
  std::sort(out.mutable_clients()->begin(), out.mutable_clients()->end(),
            [](const v1::ClientSequences& a, const v1::ClientSequences& b) {
              return a.client_id() < b.client_id();
            });
  return out.SerializeAsString();
}

absl::Status AppliedSequences::Restore(const std::string& bytes) {
  v1::AppliedSequences in;
  if (!in.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint extension ", kExtensionName, " does not parse"));
  }
  absl::MutexLock lock(&mu_);
  clients_.clear();
  by_use_.clear();
  sequences_kept_ = 0;
  // A checkpoint of a server with larger bounds keeps what fits (the ids
  // last in it count as the most recently used).
  for (const v1::ClientSequences& entry : in.clients()) {
    Client& c = Use(entry.client_id());
    sequences_kept_ -= c.applied.size();
    c.low_water = entry.low_water();
    c.applied.clear();
    for (uint64_t s : entry.applied()) {
      if (s > c.low_water) c.applied.insert(s);
    }
    TrimPending(c);
    sequences_kept_ += c.applied.size();
    KeepWithinBounds(entry.client_id());
  }
  return absl::OkStatus();
}

size_t AppliedSequences::num_clients() const {
  absl::MutexLock lock(&mu_);
  return clients_.size();
}

size_t AppliedSequences::num_sequences_kept() const {
  absl::MutexLock lock(&mu_);
  return sequences_kept_;
}

uint64_t AppliedSequences::clients_forgotten() const {
  absl::MutexLock lock(&mu_);
  return forgotten_;
}

}  // namespace pserver
