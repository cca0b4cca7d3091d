// The servers one process hosts with --replicas=R (docs/replication.md):
// one serving slot and R-1 standby slots, each a Server with its own port,
// lease and instance id. A standby slot must not back up a shard this
// process already holds or backs up (a process that dies takes all its
// slots with it), so the slots register their instance ids here, and a
// standby slot looks for its shard and attaches while holding the attach
// lock, and record the shard they copied (a joining standby is not in
// /shards/<i> yet), so that two slots of one process never back up one shard.
//
//   auto slots = std::make_shared<ProcessSlots>();
//   options.process_slots = slots;            // every Server of the process
//   ...
//   if (slots->HoldsAnyOf(config.holder(), config.replicas(), me)) continue;
//
// Live moves (docs/elastic.md, "Moves with --replicas"): the shard count
// changes, so slots move between shards. A slot leaves a shard that departed
// (a stable /placement with fewer servers), and a slot whose shard has more
// live backups than wanted leaves it for a shard that has fewer
// (ShardToRebalanceTo), so that every shard ends with `backups_wanted`.
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_PROCESS_SLOTS_H_
#define PSERVER_CC_SERVER_PROCESS_SLOTS_H_

#include <cstdint>
#include <map>
#include <set>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "google/protobuf/repeated_ptr_field.h"

namespace pserver {

class ProcessSlots {
 public:
  // `backups_wanted`: the backups each shard should have (--replicas - 1,
  // the standby slots of each process), at least 1.
  explicit ProcessSlots(int backups_wanted = 1)
      : backups_wanted_(backups_wanted < 1 ? 1 : backups_wanted) {}
  int backups_wanted() const { return backups_wanted_; }

  void Add(const std::string& instance_id) {
    absl::MutexLock lock(&mu_);
    instances_.insert(instance_id);
  }
  void Remove(const std::string& instance_id) {
    absl::MutexLock lock(&mu_);
    instances_.erase(instance_id);
    attached_.erase(instance_id);
  }
  // A standby slot copied shard `shard` (it may not be listed in
  // /shards/<shard> yet: it is joining), or left it (Detached).
  void Attached(const std::string& instance_id, uint32_t shard) {
    absl::MutexLock lock(&mu_);
    attached_[instance_id] = shard;
  }
  void Detached(const std::string& instance_id) {
    absl::MutexLock lock(&mu_);
    attached_.erase(instance_id);
  }
  // Whether a slot other than `self` copied shard `shard`.
  bool AnotherAttachedTo(uint32_t shard, absl::string_view self) const {
    absl::MutexLock lock(&mu_);
    return AnotherAttachedToLocked(shard, self);
  }
  // Whether shard `shard` (its /shards/<shard> naming `holder` and
  // `replicas`) is this process's already: held, backed up or being copied
  // by a slot other than `self`. A standby slot attaches to no such shard.
  bool Ours(uint32_t shard, absl::string_view holder,
            const google::protobuf::RepeatedPtrField<std::string>& replicas,
            absl::string_view self) const {
    return HoldsAnyOf(holder, replicas, self) || AnotherAttachedTo(shard, self);
  }
  // Whether `holder` or one of `replicas` is a slot of this process other
  // than `self`.
  bool HoldsAnyOf(absl::string_view holder,
                  const google::protobuf::RepeatedPtrField<std::string>& replicas,
                  absl::string_view self) const {
    absl::MutexLock lock(&mu_);
    auto other = [&](absl::string_view id) {
      return id != self && instances_.count(std::string(id)) > 0;
    };
    if (other(holder)) return true;
    for (const std::string& replica : replicas) {
      if (other(replica)) return true;
    }
    return false;
  }
  // Held by a standby slot from choosing a shard until attached to it.
  absl::Mutex& attach_mu() { return attach_mu_; }

 private:
  mutable absl::Mutex mu_;
  std::set<std::string> instances_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, uint32_t> attached_ ABSL_GUARDED_BY(mu_);
  bool AnotherAttachedToLocked(uint32_t shard, absl::string_view self) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (const auto& [id, attached] : attached_) {
      if (attached == shard && id != self) return true;
    }
    return false;
  }  // slot -> shard it copied
  absl::Mutex attach_mu_;
  const int backups_wanted_;
};

// One shard as a standby slot sees it in etcd.
struct ShardBackups {
  uint32_t shard = 0;
  // Standbys holding /standby/<shard>/<instance> (attached or joining; a
  // dead one's key goes with its lease, while /shards/<shard> may still
  // list it until its primary's next write).
  int live = 0;
  // Served (/ps/<shard> exists), and this slot may back it up (not its
  // process's: ProcessSlots::Ours).
  bool eligible = false;
};

// Rebalancing: a slot backing up shard `mine` (which has `mine_live` live
// backups) should leave it for the returned shard when `mine` has more than
// `wanted` and one of `shards` it may back up has fewer than `wanted` (the
// fewest first, then the lowest index). nullopt: stay.
inline std::optional<uint32_t> ShardToRebalanceTo(uint32_t mine, int mine_live, int wanted,
                                                  const std::vector<ShardBackups>& shards) {
  if (mine_live <= wanted) return std::nullopt;
  std::optional<uint32_t> best;
  int best_live = wanted;
  for (const ShardBackups& s : shards) {
    if (s.shard == mine || !s.eligible || s.live >= best_live) continue;
    best = s.shard;
    best_live = s.live;
  }
  return best;
}

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PROCESS_SLOTS_H_
