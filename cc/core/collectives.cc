#include "cc/core/collectives.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/element_type.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

constexpr size_t kMaxListed = 10;  // participants named in a deadline message

absl::Status ShuttingDown() { return absl::UnavailableError("server shutting down"); }

const char* OpName(ReduceOp op) { return op == ReduceOp::kMean ? "mean" : "sum"; }

// "w0, w2" for the first kMaxListed keys, then "and N more".
template <typename Map>
std::string ListKeys(const Map& map) {
  std::vector<absl::string_view> names;
  for (const auto& entry : map) {
    if (names.size() == kMaxListed) break;
    names.push_back(entry.first);
  }
  std::string list = absl::StrJoin(names, ", ");
  if (map.size() > kMaxListed) absl::StrAppend(&list, " and ", map.size() - kMaxListed, " more");
  return list;
}

// Adds the contributions element by element in the map's (participant id)
// order, so that the result does not depend on the order of arrival. Integers
// are added as unsigned, wrapping around instead of overflowing.
template <typename T>
std::string Reduce(const std::map<std::string, std::string, std::less<>>& contributions,
                   size_t bytes, ReduceOp op, uint32_t size) {
  using Acc = typename std::conditional_t<std::is_integral_v<T>, std::make_unsigned<T>,
                                          std::common_type<T>>::type;
  const size_t n = bytes / sizeof(T);
  std::vector<Acc> acc(n, Acc{0});
  for (const auto& [participant, data] : contributions) {
    const char* p = data.data();
    for (size_t i = 0; i < n; ++i) {
      T v;
      std::memcpy(&v, p + i * sizeof(T), sizeof(T));
      acc[i] += static_cast<Acc>(v);
    }
  }
  std::vector<T> result(n);
  for (size_t i = 0; i < n; ++i) {
    const T sum = static_cast<T>(acc[i]);
    if (op == ReduceOp::kSum) {
      result[i] = sum;
    } else if constexpr (std::is_floating_point_v<T>) {
      result[i] = sum / static_cast<T>(size);
    } else if constexpr (std::is_signed_v<T>) {
      // Division truncates toward zero; int64 holds every size.
      result[i] = static_cast<T>(static_cast<int64_t>(sum) / static_cast<int64_t>(size));
    } else {
      result[i] = static_cast<T>(static_cast<uint64_t>(sum) / size);
    }
  }
  std::string out(bytes, '\0');
  if (bytes > 0) std::memcpy(out.data(), result.data(), bytes);
  return out;
}

}  // namespace

struct Collectives::Slot {
  Key key;  // kind, name, generation
  uint32_t size = 0;
  std::vector<uint64_t> waiters;  // ids of the callers waiting on this slot

  // Barrier and AllReduce: who has arrived (with its chunk, for AllReduce).
  std::map<std::string, std::string, std::less<>> arrived;
  uint64_t chunk_bytes = 0;  // of the chunks in `arrived`
  // AllReduce: the round's type, op and chunk length (set by the first
  // contribution).
  ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  ReduceOp op = ReduceOp::kSum;
  size_t bytes = 0;

  // Broadcast.
  bool has_data = false;
  std::string data;
  absl::Time put_time;
  absl::flat_hash_set<std::string> got;

  Kind kind() const { return std::get<Kind>(key); }

  std::string Describe() const {
    const char* kind_name = kind() == Kind::kBarrier     ? "barrier"
                            : kind() == Kind::kAllReduce ? "all-reduce"
                                                         : "broadcast";
    return absl::StrCat(kind_name, " '", std::get<std::string>(key), "' round ",
                        std::get<uint64_t>(key));
  }
};

struct Collectives::Waiter {
  Key key;                  // of its slot
  std::string participant;  // as arrived (barrier, all-reduce) or reading
  uint64_t timer = 0;       // its deadline's id in the timer
  SlotDone done;
};

Collectives::Collectives(Options options) : options_(options), timer_(options.timer) {}

Collectives::~Collectives() {
  Shutdown();
  // A deadline callback already started may still be about to look us up.
  timer_.Quiesce();
}

absl::StatusOr<Collectives::Slot*> Collectives::FindOrCreate(Kind kind, absl::string_view name,
                                                             uint64_t generation, uint32_t size) {
  Key key(kind, std::string(name), generation);
  auto [it, inserted] = slots_.try_emplace(key);
  if (inserted) {
    auto slot = std::make_unique<Slot>();
    slot->key = std::move(key);
    slot->size = size;
    it->second = std::move(slot);
  }
  Slot* slot = it->second.get();
  if (slot->size != size) {
    absl::Status status = absl::InvalidArgumentError(
        absl::StrCat(slot->Describe(), " has size ", slot->size, ", got ", size));
    return status;
  }
  return slot;
}

void Collectives::MaybeFree(Slot* slot) {
  if (!slot->waiters.empty()) return;
  // A barrier or all-reduce without waiters is either complete and released,
  // or abandoned by all: its arrivals were withdrawn.
  if (slot->kind() == Kind::kBroadcast && slot->has_data && !shutdown_ &&
      slot->got.size() + 1 < slot->size && absl::Now() < slot->put_time + options_.broadcast_ttl) {
    return;  // unread data, not yet expired
  }
  Erase(slot->key);
}

void Collectives::Erase(const Key& key) {
  auto it = slots_.find(key);
  if (it == slots_.end()) return;
  held_bytes_ -= it->second->chunk_bytes + it->second->data.size();
  slots_.erase(it);
}

absl::Status Collectives::CheckRoom(const Slot& slot, size_t bytes, bool completes) const {
  const uint64_t limit = options_.max_held_bytes;
  if (completes || (bytes <= limit && held_bytes_ <= limit - bytes)) return absl::OkStatus();
  if (bytes > limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(slot.Describe(), ": a contribution of ", bytes,
                     " bytes is larger than the server's whole limit for waiting collectives "
                     "(--max_collective_bytes=",
                     limit, ")"));
  }
  return absl::UnavailableError(
      absl::StrCat(slot.Describe(), ": the server holds ", held_bytes_,
                   " bytes of collective contributions waiting for their rounds (limit ", limit,
                   ", --max_collective_bytes); this one needs ", bytes, "; retry later"));
}

void Collectives::DropExpired(absl::Time now) {
  while (!puts_.empty() && puts_.front().first + options_.broadcast_ttl <= now) {
    auto it = slots_.find(puts_.front().second);
    // A slot put again later (same key) has a later put_time and stays.
    if (it != slots_.end() && it->second->has_data && it->second->waiters.empty() &&
        it->second->put_time == puts_.front().first) {
      Erase(it->first);
    }
    puts_.pop_front();
  }
}

CancelWait Collectives::AddWaiter(Slot* slot, absl::string_view participant, absl::Time deadline,
                                  SlotDone done) {
  const uint64_t id = next_waiter_++;
  Waiter& waiter = waiters_[id];
  waiter.key = slot->key;
  waiter.participant = std::string(participant);
  waiter.done = std::move(done);
  slot->waiters.push_back(id);
  // The timer's lock is taken under mu_, never the other way round: the
  // timer runs its callbacks without holding its lock.
  waiter.timer = timer_.get().Schedule(deadline, [this, id] { Withdraw(id, /*cancelled=*/false); });
  return [this, id] { Withdraw(id, /*cancelled=*/true); };
}

void Collectives::ReleaseWaiters(Slot* slot, const std::shared_ptr<const std::string>& result,
                                 Completions& completions) {
  for (uint64_t id : slot->waiters) {
    auto it = waiters_.find(id);
    timer_.get().Cancel(it->second.timer);
    completions.Add(
        [done = std::move(it->second.done), result] { done(absl::OkStatus(), result.get()); });
    waiters_.erase(it);
  }
  slot->waiters.clear();
}

std::string Collectives::Waiting(const Slot& slot) const {
  switch (slot.kind()) {
    case Kind::kBarrier:
      return absl::StrCat(slot.Describe(), ": ", slot.arrived.size(), " of ", slot.size,
                          " arrived (", ListKeys(slot.arrived), ")");
    case Kind::kAllReduce:
      return absl::StrCat(slot.Describe(), ": ", slot.arrived.size(), " of ", slot.size,
                          " contributed (", ListKeys(slot.arrived), ")");
    case Kind::kBroadcast:
      break;
  }
  return absl::StrCat(slot.Describe(), ": no data from the root yet");
}

void Collectives::Withdraw(uint64_t id, bool cancelled) {
  SlotDone done;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = waiters_.find(id);
    if (it == waiters_.end()) return;  // completed already
    Waiter waiter = std::move(it->second);
    waiters_.erase(it);
    if (cancelled) timer_.get().Cancel(waiter.timer);
    auto slot_it = slots_.find(waiter.key);
    if (slot_it != slots_.end()) {
      Slot* slot = slot_it->second.get();
      // The message names who had arrived, the caller included.
      status = cancelled ? absl::CancelledError(
                               absl::StrCat(Waiting(*slot), "; the caller cancelled its call"))
                         : absl::DeadlineExceededError(Waiting(*slot));
      auto arrived = slot->arrived.find(waiter.participant);
      if (arrived != slot->arrived.end()) {
        slot->chunk_bytes -= arrived->second.size();
        held_bytes_ -= arrived->second.size();
        slot->arrived.erase(arrived);
      }
      slot->waiters.erase(std::find(slot->waiters.begin(), slot->waiters.end(), id));
      MaybeFree(slot);
    } else {
      status = absl::CancelledError("the call was cancelled");
    }
    done = std::move(waiter.done);
  }
  done(status, nullptr);
}

absl::Status Collectives::Barrier(absl::string_view name, uint64_t generation, uint32_t size,
                                  absl::string_view participant, absl::Time deadline) {
  BlockingWait wait;
  BarrierAsync(name, generation, size, participant, deadline, wait.Done());
  return wait.Wait();
}

CancelWait Collectives::BarrierAsync(absl::string_view name, uint64_t generation, uint32_t size,
                                     absl::string_view participant, absl::Time deadline,
                                     WaitDone done) {
  Completions completions;  // run once the lock is released
  auto fail = [&](absl::Status status) {
    completions.Add([done = std::move(done), status = std::move(status)] { done(status); });
    return CancelWait([] {});
  };
  if (size == 0) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "' round ", generation, ": size must be at least 1")));
  }
  if (participant.empty()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "' round ", generation, ": participant is empty")));
  }
  absl::MutexLock lock(&mu_);
  if (shutdown_) return fail(ShuttingDown());
  DropExpired(absl::Now());
  absl::StatusOr<Slot*> found = FindOrCreate(Kind::kBarrier, name, generation, size);
  if (!found.ok()) return fail(found.status());
  Slot* slot = *found;
  if (slot->arrived.count(participant) > 0) {
    return fail(absl::AlreadyExistsError(
        absl::StrCat("participant '", participant, "' has already arrived at ", slot->Describe())));
  }
  slot->arrived.emplace(std::string(participant), std::string());
  if (slot->arrived.size() < size) {
    return AddWaiter(slot, participant, deadline,
                     [done = std::move(done)](absl::Status status, const std::string*) {
                       done(std::move(status));
                     });
  }
  ReleaseWaiters(slot, nullptr, completions);
  MaybeFree(slot);
  completions.Add([done = std::move(done)] { done(absl::OkStatus()); });
  return [] {};
}

absl::Status Collectives::AllReduce(absl::string_view name, uint64_t generation, uint32_t size,
                                    absl::string_view participant, ElementType type,
                                    absl::string_view data, ReduceOp op, std::string* out,
                                    absl::Time deadline) {
  BlockingWait wait;
  AllReduceAsync(name, generation, size, participant, type, data, op, out, deadline, wait.Done());
  return wait.Wait();
}

CancelWait Collectives::AllReduceAsync(absl::string_view name, uint64_t generation, uint32_t size,
                                       absl::string_view participant, ElementType type,
                                       absl::string_view data, ReduceOp op, std::string* out,
                                       absl::Time deadline, WaitDone done) {
  Completions completions;  // run once the lock is released
  auto fail = [&](absl::Status status) {
    completions.Add([done = std::move(done), status = std::move(status)] { done(status); });
    return CancelWait([] {});
  };
  const std::string what = absl::StrCat("all-reduce '", name, "' round ", generation);
  if (size == 0) return fail(absl::InvalidArgumentError(what + ": size must be at least 1"));
  if (participant.empty()) return fail(absl::InvalidArgumentError(what + ": participant is empty"));
  if (out == nullptr) return fail(absl::InvalidArgumentError(what + ": no output buffer"));
  if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown reduce op ", static_cast<int>(op))));
  }
  if (absl::Status s = ValidateStorableType(type, what); !s.ok()) return fail(s);
  const size_t element_size = ElementSize(type);
  if (data.size() % element_size != 0) {
    return fail(absl::InvalidArgumentError(absl::StrCat(
        what, ": ", data.size(), " bytes from '", participant, "' are not a whole number of ",
        ElementTypeName(type), " elements (", element_size, " bytes each)")));
  }

  absl::MutexLock lock(&mu_);
  if (shutdown_) return fail(ShuttingDown());
  DropExpired(absl::Now());
  absl::StatusOr<Slot*> found = FindOrCreate(Kind::kAllReduce, name, generation, size);
  if (!found.ok()) return fail(found.status());
  Slot* slot = *found;
  if (slot->arrived.count(participant) > 0) {
    return fail(absl::AlreadyExistsError(absl::StrCat(
        "participant '", participant, "' has already contributed to ", slot->Describe())));
  }
  if (slot->arrived.empty()) {
    // The first contribution (or the first after all were withdrawn) sets
    // what the round is.
    slot->type = type;
    slot->op = op;
    slot->bytes = data.size();
  } else if (slot->type != type) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(slot->Describe(), ": '", participant, "' sent ", ElementTypeName(type),
                     " data, the round's is ", ElementTypeName(slot->type))));
  } else if (slot->bytes != data.size()) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(slot->Describe(), ": '", participant, "' sent ", data.size(),
                     " bytes, the round's chunk is ", slot->bytes, " bytes")));
  } else if (slot->op != op) {
    return fail(absl::InvalidArgumentError(absl::StrCat(slot->Describe(), ": '", participant,
                                                        "' asked for the ", OpName(op),
                                                        ", the round's op is ", OpName(slot->op))));
  }
  if (absl::Status room = CheckRoom(*slot, data.size(), slot->arrived.size() + 1 == size);
      !room.ok()) {
    MaybeFree(slot);  // a round this call created
    return fail(room);
  }
  slot->arrived.emplace(std::string(participant), std::string(data));
  slot->chunk_bytes += data.size();
  held_bytes_ += data.size();
  auto deliver = [out, done = std::move(done)](absl::Status status, const std::string* result) {
    if (status.ok()) *out = *result;
    done(std::move(status));
  };
  if (slot->arrived.size() < size) {
    return AddWaiter(slot, participant, deadline, std::move(deliver));
  }
  // Reduced here, under the lock, rather than outside it: a round that is
  // full can then never be seen half done, so a waiter that times out
  // meanwhile needs no third state between "withdrawn" and "complete".
  std::shared_ptr<const std::string> result;
  DispatchStorable(slot->type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    result =
        std::make_shared<const std::string>(Reduce<T>(slot->arrived, slot->bytes, slot->op, size));
  });
  ReleaseWaiters(slot, result, completions);
  MaybeFree(slot);
  completions.Add(
      [deliver = std::move(deliver), result] { deliver(absl::OkStatus(), result.get()); });
  return [] {};
}

absl::Status Collectives::BroadcastPut(absl::string_view name, uint64_t generation, uint32_t size,
                                       absl::string_view data) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast '", name, "' round ", generation, ": size must be at least 1"));
  }
  Completions completions;  // run after the lock is released
  absl::MutexLock lock(&mu_);
  if (shutdown_) return ShuttingDown();
  const absl::Time now = absl::Now();
  DropExpired(now);
  if (size == 1) return absl::OkStatus();  // the root alone: nobody to read it
  PS_ASSIGN_OR_RETURN(Slot * slot, FindOrCreate(Kind::kBroadcast, name, generation, size));
  if (slot->has_data) {
    return absl::AlreadyExistsError(
        absl::StrCat(slot->Describe(), " already has data from the root"));
  }
  // Every reader already waiting: the data is delivered and freed at once.
  if (absl::Status room = CheckRoom(*slot, data.size(), slot->waiters.size() + 1 >= size);
      !room.ok()) {
    MaybeFree(slot);  // a round this call created
    return room;
  }
  slot->has_data = true;
  slot->data = std::string(data);
  held_bytes_ += data.size();
  slot->put_time = now;
  puts_.emplace_back(now, slot->key);
  if (!slot->waiters.empty()) {
    // The readers waiting get it now.
    for (uint64_t id : slot->waiters) slot->got.insert(waiters_.at(id).participant);
    ReleaseWaiters(slot, std::make_shared<const std::string>(slot->data), completions);
    MaybeFree(slot);
  }
  return absl::OkStatus();
}

absl::Status Collectives::BroadcastGet(absl::string_view name, uint64_t generation, uint32_t size,
                                       absl::string_view participant, std::string* out,
                                       absl::Time deadline) {
  BlockingWait wait;
  BroadcastGetAsync(name, generation, size, participant, out, deadline, wait.Done());
  return wait.Wait();
}

CancelWait Collectives::BroadcastGetAsync(absl::string_view name, uint64_t generation,
                                          uint32_t size, absl::string_view participant,
                                          std::string* out, absl::Time deadline, WaitDone done) {
  Completions completions;  // run once the lock is released
  auto fail = [&](absl::Status status) {
    completions.Add([done = std::move(done), status = std::move(status)] { done(status); });
    return CancelWait([] {});
  };
  const std::string what = absl::StrCat("broadcast '", name, "' round ", generation);
  if (size < 2) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(what, ": size must be at least 2 (the root and a reader), got ", size)));
  }
  if (participant.empty()) return fail(absl::InvalidArgumentError(what + ": participant is empty"));
  if (out == nullptr) return fail(absl::InvalidArgumentError(what + ": no output buffer"));
  absl::MutexLock lock(&mu_);
  if (shutdown_) return fail(ShuttingDown());
  DropExpired(absl::Now());
  absl::StatusOr<Slot*> found = FindOrCreate(Kind::kBroadcast, name, generation, size);
  if (!found.ok()) return fail(found.status());
  Slot* slot = *found;
  if (slot->got.contains(participant)) {
    return fail(absl::AlreadyExistsError(
        absl::StrCat("participant '", participant, "' has already got ", slot->Describe())));
  }
  for (uint64_t id : slot->waiters) {
    if (waiters_.at(id).participant == participant) {
      return fail(absl::AlreadyExistsError(absl::StrCat(
          "participant '", participant, "' is already waiting for ", slot->Describe())));
    }
  }
  auto deliver = [out, done = std::move(done)](absl::Status status, const std::string* result) {
    if (status.ok()) *out = *result;
    done(std::move(status));
  };
  if (!slot->has_data) return AddWaiter(slot, participant, deadline, std::move(deliver));
  slot->got.emplace(participant);
  completions.Add(
      [deliver = std::move(deliver), data = std::make_shared<const std::string>(slot->data)] {
        deliver(absl::OkStatus(), data.get());
      });
  MaybeFree(slot);
  return [] {};
}

size_t Collectives::open_slots() const {
  absl::MutexLock lock(&mu_);
  return slots_.size();
}

size_t Collectives::waiting() const {
  absl::MutexLock lock(&mu_);
  return waiters_.size();
}

uint64_t Collectives::held_bytes() const {
  absl::MutexLock lock(&mu_);
  return held_bytes_;
}

void Collectives::Shutdown() {
  Completions completions;  // run after the lock is released
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  puts_.clear();
  for (auto& [id, waiter] : waiters_) {
    timer_.get().Cancel(waiter.timer);
    completions.Add([done = std::move(waiter.done)] { done(ShuttingDown(), nullptr); });
  }
  waiters_.clear();
  slots_.clear();
  held_bytes_ = 0;
}

}  // namespace pserver
