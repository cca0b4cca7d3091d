#include "cc/server/applied_sequences.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "pserver/v1/registry.pb.h"

namespace pserver {

AppliedSequences::Outcome AppliedSequences::Begin(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  Client& c = clients_[client];
  if (sequence <= c.low_water || c.applied.count(sequence) > 0) return kApplied;
  if (!c.in_progress.insert(sequence).second) return kInProgress;
  return kNew;
}

void AppliedSequences::Abandon(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  auto it = clients_.find(client);
  if (it == clients_.end()) return;
  Client& c = it->second;
  c.in_progress.erase(sequence);
  // A client whose only requests were refused leaves nothing behind.
  if (c.low_water == 0 && c.applied.empty() && c.in_progress.empty()) clients_.erase(it);
}

void AppliedSequences::Finish(uint64_t client, uint64_t sequence) {
  absl::MutexLock lock(&mu_);
  Client& c = clients_[client];
  c.in_progress.erase(sequence);
  if (sequence <= c.low_water) return;
  c.applied.insert(sequence);
  // Past the bound, give up on the oldest gaps.
  while (c.applied.size() > max_pending_) {
    c.low_water = *c.applied.begin();
    c.applied.erase(c.applied.begin());
  }
  while (!c.applied.empty() && *c.applied.begin() == c.low_water + 1) {
    c.low_water = *c.applied.begin();
    c.applied.erase(c.applied.begin());
  }
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
  absl::flat_hash_map<uint64_t, Client> clients;
  for (const v1::ClientSequences& entry : in.clients()) {
    Client& c = clients[entry.client_id()];
    c.low_water = entry.low_water();
    for (uint64_t s : entry.applied()) {
      if (s > c.low_water) c.applied.insert(s);
    }
  }
  absl::MutexLock lock(&mu_);
  clients_ = std::move(clients);
  return absl::OkStatus();
}

size_t AppliedSequences::num_clients() const {
  absl::MutexLock lock(&mu_);
  return clients_.size();
}

}  // namespace pserver
