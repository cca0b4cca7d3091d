// AppliedSequences: which push requests a server has applied, per client, so
// that a request retried after its reply was lost is acknowledged without
// being applied a second time (exactly-once gradients).
//
//   AppliedSequences applied;
//   switch (applied.Begin(client_id, sequence)) {
//     case AppliedSequences::kNew:        apply it; applied.Finish(client_id, sequence); break;
//     case AppliedSequences::kApplied:    acknowledge, apply nothing; break;
//     case AppliedSequences::kInProgress: the first copy is still being applied: UNAVAILABLE
//   }
//
// A client numbers its requests to one server 1, 2, 3, ... and may have
// several in flight at once, so they can finish out of order. Per client this
// keeps a low-water mark (every sequence <= it is applied) and the set of
// applied sequences above it; the mark advances over every contiguous run.
// The set is bounded (`max_pending`): past it, the mark is raised over the
// oldest gaps, whose requests (long lost, or never re-sent after a server
// restarted from an older checkpoint) then count as applied. The whole state
// goes into checkpoints as the extension kExtensionName.
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_
#define PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_

#include <cstddef>
#include <cstdint>
#include <set>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace pserver {

class AppliedSequences {
 public:
  static constexpr char kExtensionName[] = "pserver.applied_sequences";

  enum Outcome { kNew, kApplied, kInProgress };

  explicit AppliedSequences(size_t max_pending = 4096) : max_pending_(max_pending) {}

  // Whether (client, sequence) is new, and if so marks it in progress.
  Outcome Begin(uint64_t client, uint64_t sequence);
  // Marks a request that Begin returned kNew for as applied (also when it
  // failed past its checks, partly applied: its sequence number is used up).
  void Finish(uint64_t client, uint64_t sequence);
  // Ends a request that Begin returned kNew for as not applied and not used
  // up: its retry is new again. For a push refused before anything was
  // applied (its checks failed, or its blocks moved: PlacementMoved): a
  // retry is checked again rather than acknowledged as applied, and a
  // backup, which never sees a refused push, holds the same set. The gap it
  // leaves is closed by the bound; a client with nothing applied is
  // forgotten.
  void Abandon(uint64_t client, uint64_t sequence);

  // The state as a serialized v1::AppliedSequences (requests in progress are
  // not included). Callers wanting it consistent with the store stop
  // applying while they take both.
  std::string Serialize() const;
  // Replaces the state with a serialized v1::AppliedSequences.
  // INVALID_ARGUMENT for bytes that do not parse.
  absl::Status Restore(const std::string& bytes);

  size_t num_clients() const;

 private:
  struct Client {
    uint64_t low_water = 0;
    std::set<uint64_t> applied;      // all > low_water
    std::set<uint64_t> in_progress;  // all > low_water, not in `applied`
  };

  const size_t max_pending_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_
