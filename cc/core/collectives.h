// Collectives: where the participants of a Barrier, AllReduce or Broadcast
// meet on one server.
//
// Each operation meets in a slot named (name, generation); callers pass the
// same generation for the same round (clients number their rounds 1, 2, 3...).
// Barriers, all-reduces and broadcasts have separate slots, so a barrier and an
// all-reduce may share a name. A slot is freed once every participant has got
// its result, and also once every caller waiting on it has given up (deadline
// or shutdown), so nothing grows without bound. A freed round is forgotten:
// calling it again starts it afresh, so clients must not reuse a generation.
// Broadcast data that the root
// has put but not every reader has taken is dropped `broadcast_ttl` (default
// 10 minutes) after the put; a reader arriving later waits for a new put.
//
//   Collectives collectives;
//   // on each of 4 workers, concurrently:
//   PS_RETURN_IF_ERROR(collectives.Barrier("epoch", round, 4, worker, deadline));
//   std::string sum;
//   PS_RETURN_IF_ERROR(collectives.AllReduce("grad/0", round, 4, worker, v1::FLOAT32,
//                                            bytes, ReduceOp::kSum, &sum, deadline));
//
// AllReduce keeps each participant's chunk until all have arrived and then
// adds them in the order of participant ids, so the result does not depend on
// the order of arrival, and every participant receives identical bytes.
// Integer sums wrap around modulo 2^bits; float32 data is summed in float32.
//
// Errors: INVALID_ARGUMENT for a bad argument or one that disagrees with the
// round's (naming what differs); ALREADY_EXISTS for a participant arriving
// twice in a round (a timed-out caller's arrival is withdrawn, so it may retry);
// DEADLINE_EXCEEDED saying who has arrived; UNAVAILABLE "server shutting down"
// after Shutdown(). A call that fails leaves no trace in the round.
//
// Thread-safe: all methods may be called concurrently; waiting callers do not
// hold up others.
#ifndef PSERVER_CC_CORE_COLLECTIVES_H_
#define PSERVER_CC_CORE_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/core/element_type.h"

namespace pserver {

enum class ReduceOp { kSum, kMean };

class Collectives {
 public:
  struct Options {
    // Broadcast data not taken by every reader is dropped this long after the
    // put.
    absl::Duration broadcast_ttl = absl::Minutes(10);
  };

  Collectives() : Collectives(Options()) {}
  explicit Collectives(Options options);
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;
  ~Collectives();

  // Returns once `size` distinct participants have called Barrier on (name,
  // generation). INVALID_ARGUMENT for size 0, an empty participant, or a size
  // differing from the round's ("barrier 'b' round 3 has size 4, got 3"); a
  // participant arriving twice in one round: ALREADY_EXISTS; one more distinct
  // participant while a complete round is still being released:
  // FAILED_PRECONDITION. At the deadline:
  // DEADLINE_EXCEEDED "barrier 'b' round 3: 2 of 4 arrived (w0, w2)", and the
  // caller's arrival is withdrawn so that a retry can arrive again.
  absl::Status Barrier(absl::string_view name, uint64_t generation, uint32_t size,
                       absl::string_view participant, absl::Time deadline);

  // One chunk of an all-reduce: contributes `data` (elements of `type`, one of
  // the six storable types, little-endian) to the round; once `size` distinct
  // participants have contributed, each gets the result in *out (same byte
  // length): the element-wise sum, or for kMean the sum / size (integers
  // truncated toward zero). Empty data is allowed (the result is empty).
  // INVALID_ARGUMENT for a bad argument, data whose length is not a multiple
  // of the element size, or a type, length, op or size differing from the
  // round's first contribution (the first one after every contribution was
  // withdrawn sets them afresh). A second contribution by the same participant
  // to the same round: ALREADY_EXISTS; one too many: FAILED_PRECONDITION. The
  // sum is computed once, by the last contributor, under the lock: keep chunks
  // to a few MB. At the deadline: DEADLINE_EXCEEDED
  // "all-reduce 'g' round 2: 3 of 4 contributed (w0, w1, w2)", and the
  // caller's contribution is withdrawn.
  absl::Status AllReduce(absl::string_view name, uint64_t generation, uint32_t size,
                         absl::string_view participant, ElementType type, absl::string_view data,
                         ReduceOp op, std::string* out, absl::Time deadline);

  // The root's half of a broadcast to `size` participants (the root and
  // size - 1 readers): stores `data` for the readers and returns at once.
  // ALREADY_EXISTS if the round already has data; INVALID_ARGUMENT for size 0
  // or a size differing from waiting readers'. With size 1 there is no reader
  // and nothing is stored.
  absl::Status BroadcastPut(absl::string_view name, uint64_t generation, uint32_t size,
                            absl::string_view data);

  // A reader's half: waits for the root's data and copies it into *out. The
  // round is freed once size - 1 distinct readers have got it. INVALID_ARGUMENT
  // for size < 2, an empty participant, or a size differing from the round's;
  // ALREADY_EXISTS for a reader that already got this round's data. At the
  // deadline: DEADLINE_EXCEEDED "broadcast 'x' round 2: no data from the root
  // yet".
  absl::Status BroadcastGet(absl::string_view name, uint64_t generation, uint32_t size,
                            absl::string_view participant, std::string* out, absl::Time deadline);

  // Rounds in progress (with a caller waiting, or broadcast data unread).
  size_t open_slots() const;

  // Wakes every waiter with UNAVAILABLE "server shutting down", drops every
  // round; later calls fail the same way. Idempotent.
  void Shutdown();

 private:
  enum class Kind { kBarrier, kAllReduce, kBroadcast };
  struct Slot;
  using Key = std::tuple<Kind, std::string, uint64_t>;

  // The round's slot, created empty if there is none; INVALID_ARGUMENT if the
  // round has another size.
  absl::StatusOr<Slot*> FindOrCreate(Kind kind, absl::string_view name, uint64_t generation,
                                     uint32_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the slot if no caller waits on it and it has nothing left to give.
  void MaybeFree(Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  // Broadcast puts in order of time, for expiry.
  std::deque<std::pair<absl::Time, Key>> puts_ ABSL_GUARDED_BY(mu_);
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_COLLECTIVES_H_
