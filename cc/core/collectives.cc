#include "cc/core/collectives.h"

#include <cstddef>
#include <cstdint>
#include <cstring>
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
  int waiters = 0;  // callers inside a call that waits on this slot

  // Barrier and AllReduce: who has arrived (with its chunk, for AllReduce,
  // until the result is computed).
  std::map<std::string, std::string, std::less<>> arrived;
  bool complete = false;
  // AllReduce: the round's type, op and chunk length (set by the first
  // contribution) and the result.
  ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  ReduceOp op = ReduceOp::kSum;
  size_t bytes = 0;
  std::string result;

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

Collectives::Collectives(Options options) : options_(options) {}

Collectives::~Collectives() = default;

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
    return absl::InvalidArgumentError(
        absl::StrCat(slot->Describe(), " has size ", slot->size, ", got ", size));
  }
  return slot;
}

void Collectives::MaybeFree(Slot* slot) {
  if (slot->waiters > 0) return;
  // A barrier or all-reduce without waiters is either complete and delivered
  // to all, or abandoned by all: its arrivals were withdrawn.
  if (slot->kind() == Kind::kBroadcast && slot->has_data && !shutdown_ &&
      slot->got.size() + 1 < slot->size && absl::Now() < slot->put_time + options_.broadcast_ttl) {
    return;  // unread data, not yet expired
  }
  slots_.erase(slot->key);
}

void Collectives::DropExpired(absl::Time now) {
  while (!puts_.empty() && puts_.front().first + options_.broadcast_ttl <= now) {
    auto it = slots_.find(puts_.front().second);
    // A slot put again later (same key) has a later put_time and stays.
    if (it != slots_.end() && it->second->has_data && it->second->waiters == 0 &&
        it->second->put_time == puts_.front().first) {
      slots_.erase(it);
    }
    puts_.pop_front();
  }
}

absl::Status Collectives::Barrier(absl::string_view name, uint64_t generation, uint32_t size,
                                  absl::string_view participant, absl::Time deadline) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "' round ", generation, ": size must be at least 1"));
  }
  if (participant.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("barrier '", name, "' round ", generation, ": participant is empty"));
  }
  absl::MutexLock lock(&mu_);
  if (shutdown_) return ShuttingDown();
  DropExpired(absl::Now());
  PS_ASSIGN_OR_RETURN(Slot * slot, FindOrCreate(Kind::kBarrier, name, generation, size));
  if (slot->arrived.count(participant) > 0) {
    return absl::AlreadyExistsError(
        absl::StrCat("participant '", participant, "' has already arrived at ", slot->Describe()));
  }
  if (slot->complete) {
    return absl::FailedPreconditionError(absl::StrCat(slot->Describe(), " is already complete; '",
                                                      participant, "' is one too many"));
  }
  slot->arrived.emplace(std::string(participant), std::string());
  if (slot->arrived.size() == size) slot->complete = true;
  ++slot->waiters;
  auto done = [this, slot]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return slot->complete || shutdown_; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  absl::Status status;
  if (!slot->complete) {
    status = shutdown_ ? ShuttingDown()
                       : absl::DeadlineExceededError(
                             absl::StrCat(slot->Describe(), ": ", slot->arrived.size(), " of ",
                                          size, " arrived (", ListKeys(slot->arrived), ")"));
    slot->arrived.erase(slot->arrived.find(participant));
  }
  --slot->waiters;
  MaybeFree(slot);
  return status;
}

absl::Status Collectives::AllReduce(absl::string_view name, uint64_t generation, uint32_t size,
                                    absl::string_view participant, ElementType type,
                                    absl::string_view data, ReduceOp op, std::string* out,
                                    absl::Time deadline) {
  const std::string what = absl::StrCat("all-reduce '", name, "' round ", generation);
  if (size == 0) return absl::InvalidArgumentError(what + ": size must be at least 1");
  if (participant.empty()) return absl::InvalidArgumentError(what + ": participant is empty");
  if (out == nullptr) return absl::InvalidArgumentError(what + ": no output buffer");
  if (op != ReduceOp::kSum && op != ReduceOp::kMean) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": unknown reduce op ", static_cast<int>(op)));
  }
  PS_RETURN_IF_ERROR(ValidateStorableType(type, what));
  const size_t element_size = ElementSize(type);
  if (data.size() % element_size != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", data.size(), " bytes from '", participant, "' are not a whole number of ",
        ElementTypeName(type), " elements (", element_size, " bytes each)"));
  }

  absl::MutexLock lock(&mu_);
  if (shutdown_) return ShuttingDown();
  DropExpired(absl::Now());
  PS_ASSIGN_OR_RETURN(Slot * slot, FindOrCreate(Kind::kAllReduce, name, generation, size));
  if (slot->arrived.count(participant) > 0) {
    return absl::AlreadyExistsError(absl::StrCat(
        "participant '", participant, "' has already contributed to ", slot->Describe()));
  }
  if (slot->complete) {
    return absl::FailedPreconditionError(absl::StrCat(slot->Describe(), " is already complete; '",
                                                      participant, "' is one too many"));
  }
  if (slot->arrived.empty()) {
    // The first contribution (or the first after all were withdrawn) sets
    // what the round is.
    slot->type = type;
    slot->op = op;
    slot->bytes = data.size();
  } else if (slot->type != type) {
    return absl::InvalidArgumentError(absl::StrCat(slot->Describe(), ": '", participant, "' sent ",
                                                   ElementTypeName(type), " data, the round's is ",
                                                   ElementTypeName(slot->type)));
  } else if (slot->bytes != data.size()) {
    return absl::InvalidArgumentError(absl::StrCat(slot->Describe(), ": '", participant, "' sent ",
                                                   data.size(), " bytes, the round's chunk is ",
                                                   slot->bytes, " bytes"));
  } else if (slot->op != op) {
    return absl::InvalidArgumentError(absl::StrCat(slot->Describe(), ": '", participant,
                                                   "' asked for the ", OpName(op),
                                                   ", the round's op is ", OpName(slot->op)));
  }
  slot->arrived.emplace(std::string(participant), std::string(data));
  if (slot->arrived.size() == size) {
    // Reduced here, under the lock, rather than outside it: a round that is
    // full can then never be seen half done, so a waiter that times out
    // meanwhile needs no third state between "withdrawn" and "complete".
    DispatchStorable(slot->type, [&](auto tag) {
      using T = typename decltype(tag)::type;
      slot->result = Reduce<T>(slot->arrived, slot->bytes, slot->op, size);
    });
    // Keep the names (a second contribution is still ALREADY_EXISTS) but
    // free the chunks.
    for (auto& [id, chunk] : slot->arrived) std::string().swap(chunk);
    slot->complete = true;
  }
  ++slot->waiters;
  auto done = [this, slot]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return slot->complete || shutdown_; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  absl::Status status;
  if (slot->complete) {
    *out = slot->result;
  } else {
    status = shutdown_ ? ShuttingDown()
                       : absl::DeadlineExceededError(
                             absl::StrCat(slot->Describe(), ": ", slot->arrived.size(), " of ",
                                          size, " contributed (", ListKeys(slot->arrived), ")"));
    slot->arrived.erase(slot->arrived.find(participant));
  }
  --slot->waiters;
  MaybeFree(slot);
  return status;
}

absl::Status Collectives::BroadcastPut(absl::string_view name, uint64_t generation, uint32_t size,
                                       absl::string_view data) {
  if (size == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("broadcast '", name, "' round ", generation, ": size must be at least 1"));
  }
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
  slot->has_data = true;
  slot->data = std::string(data);
  slot->put_time = now;
  puts_.emplace_back(now, slot->key);
  return absl::OkStatus();
}

absl::Status Collectives::BroadcastGet(absl::string_view name, uint64_t generation, uint32_t size,
                                       absl::string_view participant, std::string* out,
                                       absl::Time deadline) {
  const std::string what = absl::StrCat("broadcast '", name, "' round ", generation);
  if (size < 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": size must be at least 2 (the root and a reader), got ", size));
  }
  if (participant.empty()) return absl::InvalidArgumentError(what + ": participant is empty");
  if (out == nullptr) return absl::InvalidArgumentError(what + ": no output buffer");
  absl::MutexLock lock(&mu_);
  if (shutdown_) return ShuttingDown();
  DropExpired(absl::Now());
  PS_ASSIGN_OR_RETURN(Slot * slot, FindOrCreate(Kind::kBroadcast, name, generation, size));
  if (slot->got.contains(participant)) {
    return absl::AlreadyExistsError(
        absl::StrCat("participant '", participant, "' has already got ", slot->Describe()));
  }
  ++slot->waiters;
  auto done = [this, slot]()
                  ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return slot->has_data || shutdown_; };
  mu_.AwaitWithDeadline(absl::Condition(&done), deadline);
  absl::Status status;
  if (slot->has_data) {
    *out = slot->data;
    slot->got.emplace(participant);
  } else {
    status = shutdown_ ? ShuttingDown()
                       : absl::DeadlineExceededError(
                             absl::StrCat(slot->Describe(), ": no data from the root yet"));
  }
  --slot->waiters;
  MaybeFree(slot);
  return status;
}

size_t Collectives::open_slots() const {
  absl::MutexLock lock(&mu_);
  return slots_.size();
}

void Collectives::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
  puts_.clear();
  // Waiters free their own slots as they leave.
  for (auto it = slots_.begin(); it != slots_.end();) {
    if (it->second->waiters == 0) {
      slots_.erase(it++);
    } else {
      ++it;
    }
  }
}

}  // namespace pserver
