// Collectives: where the participants of a Barrier, AllReduce or Broadcast
// meet on one server.
//
// Each operation meets in a slot named (name, generation); callers pass the
// same generation for the same round (clients number their rounds 1, 2, 3...).
// Barriers, all-reduces and broadcasts have separate slots, so a barrier and an
// all-reduce may share a name. A barrier or all-reduce slot is freed as soon
// as its last participant arrives (every waiter gets its result then), and
// also once every caller waiting on it has given up (deadline, cancellation
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
// DEADLINE_EXCEEDED saying who has arrived; CANCELLED (the same words) for a
// cancelled wait; UNAVAILABLE "server shutting down" after Shutdown();
// UNAVAILABLE (transient, "retry") or RESOURCE_EXHAUSTED (permanent) for a
// contribution over Options::max_held_bytes. A call that fails leaves no
// trace in the round.
//
// Waiting holds no thread: each call has an asynchronous form (BarrierAsync,
// AllReduceAsync, BroadcastGetAsync) that registers the caller and returns;
// its `done` runs once, on the thread that completes the round, on the
// deadline timer's thread, or on the thread that cancels it (CancelWait:
// CANCELLED, and the caller's arrival and chunk are dropped at once). The
// blocking forms wait on the caller's own thread for the asynchronous ones.
//
// Thread-safe: all methods may be called concurrently; waiting callers do not
// hold up others.
#ifndef PSERVER_CC_CORE_COLLECTIVES_H_
#define PSERVER_CC_CORE_COLLECTIVES_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
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
#include "cc/core/reduce_op.h"
#include "cc/core/waiters.h"

namespace pserver {

class Collectives {
 public:
  struct Options {
    // Broadcast data not taken by every reader is dropped this long after the
    // put.
    absl::Duration broadcast_ttl = absl::Minutes(10);
    // Runs the deadlines of waiting calls; null: a timer of its own. Must
    // outlive the Collectives.
    DeadlineTimer* timer = nullptr;
    // Bytes that waiting rounds may hold in all (all-reduce chunks and unread
    // broadcast data; --max_collective_bytes). A contribution that would hold
    // more is refused and nothing is stored: UNAVAILABLE ("... retry") while
    // others hold the room, RESOURCE_EXHAUSTED for one larger than the whole
    // limit. A contribution that completes its round is never refused: it
    // frees the round's chunks at once.
    uint64_t max_held_bytes = uint64_t{1} << 30;
  };

  Collectives() : Collectives(Options()) {}
  explicit Collectives(Options options);
  Collectives(const Collectives&) = delete;
  Collectives& operator=(const Collectives&) = delete;
  ~Collectives();

  // Returns once `size` distinct participants have called Barrier on (name,
  // generation). INVALID_ARGUMENT for size 0, an empty participant, or a size
  // differing from the round's ("barrier 'b' round 3 has size 4, got 3"); a
  // participant arriving twice in one round: ALREADY_EXISTS. At the deadline:
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
  // to the same round: ALREADY_EXISTS. The
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

  // The asynchronous forms of the waiting calls: the same checks, errors and
  // results, delivered to `done` (which may run before the call returns).
  // `out` must stay valid until `done` runs. The returned CancelWait
  // completes a call still waiting with CANCELLED and withdraws its arrival
  // (dropping its chunk); it must not be called after the Collectives is
  // destroyed.
  CancelWait BarrierAsync(absl::string_view name, uint64_t generation, uint32_t size,
                          absl::string_view participant, absl::Time deadline, WaitDone done);
  CancelWait AllReduceAsync(absl::string_view name, uint64_t generation, uint32_t size,
                            absl::string_view participant, ElementType type, absl::string_view data,
                            ReduceOp op, std::string* out, absl::Time deadline, WaitDone done);
  CancelWait BroadcastGetAsync(absl::string_view name, uint64_t generation, uint32_t size,
                               absl::string_view participant, std::string* out, absl::Time deadline,
                               WaitDone done);

  // Rounds in progress (with a caller waiting, or broadcast data unread).
  size_t open_slots() const;
  // Callers waiting now.
  size_t waiting() const;
  // Bytes the open rounds hold: all-reduce chunks and unread broadcast data.
  uint64_t held_bytes() const;

  // Wakes every waiter with UNAVAILABLE "server shutting down", drops every
  // round; later calls fail the same way. Idempotent.
  void Shutdown();

 private:
  enum class Kind { kBarrier, kAllReduce, kBroadcast };
  struct Slot;
  struct Waiter;
  using Key = std::tuple<Kind, std::string, uint64_t>;
  // Completes a waiter with (status, the round's result or null).
  using SlotDone = std::function<void(absl::Status, const std::string*)>;

  // The round's slot, created empty if there is none; INVALID_ARGUMENT if the
  // round has another size.
  absl::StatusOr<Slot*> FindOrCreate(Kind kind, absl::string_view name, uint64_t generation,
                                     uint32_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Frees the slot if no caller waits on it and it has nothing left to give.
  void MaybeFree(Slot* slot) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void DropExpired(absl::Time now) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Erases the slot and what it holds.
  void Erase(const Key& key) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // OK if `slot` may store `bytes` more: always when the contribution
  // `completes` its round, else while the total held stays within
  // max_held_bytes.
  absl::Status CheckRoom(const Slot& slot, size_t bytes, bool completes) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Adds a waiter on `slot` (a caller that has arrived) with its deadline;
  // returns what cancels it.
  CancelWait AddWaiter(Slot* slot, absl::string_view participant, absl::Time deadline,
                       SlotDone done) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Completes every waiter of a complete slot (or a broadcast slot that got
  // its data) with OK and `result`, then frees the slot if it can.
  void ReleaseWaiters(Slot* slot, const std::shared_ptr<const std::string>& result,
                      Completions& completions) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Withdraws waiter `id` (its deadline passed, or it was cancelled) and
  // completes it with an error; a no-op if it has completed.
  void Withdraw(uint64_t id, bool cancelled);
  // The error of a waiter on `slot` that gives up.
  std::string Waiting(const Slot& slot) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const Options options_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Slot>> slots_ ABSL_GUARDED_BY(mu_);
  // Broadcast puts in order of time, for expiry.
  std::deque<std::pair<absl::Time, Key>> puts_ ABSL_GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Waiter> waiters_ ABSL_GUARDED_BY(mu_);
  uint64_t next_waiter_ ABSL_GUARDED_BY(mu_) = 1;
  // All-reduce chunks and broadcast data of every slot.
  uint64_t held_bytes_ ABSL_GUARDED_BY(mu_) = 0;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  TimerRef timer_;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_COLLECTIVES_H_
