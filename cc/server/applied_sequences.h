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
// The clients remembered are bounded too (`max_clients`, the server's
// --max_exactly_once_clients), and so are the applied sequences kept above
// their marks over all clients (kMaxSequencesKept): past either, the client
// whose last push is the oldest (and has none in progress) is forgotten, so
// that many client ids (one request each, or sequences with gaps) cannot grow
// a server without bound. A forgotten client's late retry is applied again.
//
// Thread-safe.
#ifndef PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_
#define PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_

#include <cstddef>
#include <cstdint>
#include <list>
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

  static constexpr size_t kDefaultMaxClients = size_t{1} << 16;
  // Applied sequences kept above the clients' marks, all clients together
  // (each takes about 40 bytes).
  static constexpr size_t kMaxSequencesKept = size_t{1} << 20;

  explicit AppliedSequences(size_t max_pending = 4096, size_t max_clients = kDefaultMaxClients,
                            size_t max_sequences_kept = kMaxSequencesKept)
      : max_pending_(max_pending),
        max_sequences_kept_(max_sequences_kept),
        max_clients_(max_clients) {}

  // Changes the bound on clients remembered (>= 1), forgetting the
  // longest-idle ones past it.
  void set_max_clients(size_t max_clients);

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
  // Applied sequences kept above the marks, over all clients.
  size_t num_sequences_kept() const;
  // Clients forgotten to keep within the bounds since construction.
  uint64_t clients_forgotten() const;

 private:
  struct Client {
    uint64_t low_water = 0;
    std::set<uint64_t> applied;      // all > low_water
    std::set<uint64_t> in_progress;  // all > low_water, not in `applied`
    std::list<uint64_t>::iterator use;  // its place in `by_use_`
  };

  // The client's state, created if new, marked as the most recently used.
  Client& Use(uint64_t client) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Forget(absl::flat_hash_map<uint64_t, Client>::iterator it)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Forgets the longest-idle clients with nothing in progress (never
  // `keep`) until both bounds hold, or none is left to forget.
  void KeepWithinBounds(uint64_t keep) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Past max_pending_ applied sequences above `c`'s mark, gives up on its
  // oldest gaps: the mark rises to the oldest applied until they fit.
  void TrimPending(Client& c) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t max_pending_;
  const size_t max_sequences_kept_;
  mutable absl::Mutex mu_;
  size_t max_clients_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Client> clients_ ABSL_GUARDED_BY(mu_);
  std::list<uint64_t> by_use_ ABSL_GUARDED_BY(mu_);  // client ids, least recently used first
  size_t sequences_kept_ ABSL_GUARDED_BY(mu_) = 0;   // sum of applied.size()
  uint64_t forgotten_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_APPLIED_SEQUENCES_H_
