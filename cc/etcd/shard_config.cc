#include "cc/etcd/shard_config.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/json_record.h"
#include "cc/etcd/keys.h"

namespace pserver {
namespace {

bool IsId(absl::string_view id) {
  if (id.empty() || id.size() > 64) return false;
  for (char c : id) {
    if (!absl::ascii_isalnum(c)) return false;
  }
  return true;
}

}  // namespace

absl::StatusOr<v1::ShardConfig> ParseShardConfig(uint32_t shard, absl::string_view value) {
  const std::string key = etcd_keys::ShardKey(shard);
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd ", key, " does not hold a shard configuration: ", why));
  };
  v1::ShardConfig config;
  if (std::string why = ParseJsonRecord(value, kMaxShardConfigBytes, &config); !why.empty()) {
    return refused(why);
  }
  if (config.epoch() == 0) return refused("its epoch is 0 (epochs start at 1)");
  if (config.epoch() == std::numeric_limits<uint64_t>::max()) {
    return refused("its epoch is 2^64-1: it cannot be bumped");
  }
  if (!IsId(config.holder())) {
    return refused(absl::StrCat("its holder '", absl::CHexEscape(config.holder().substr(0, 80)),
                                "' is not an instance id (1-64 letters and digits)"));
  }
  // Logged and sent to clients in step-down messages: printable and short.
  bool printable = config.holder_address().size() <= 300;
  for (char c : config.holder_address()) printable = printable && absl::ascii_isgraph(c);
  if (!printable) {
    return refused(absl::StrCat("its holder address '",
                                absl::CHexEscape(config.holder_address().substr(0, 80)),
                                "' is not a printable host:port"));
  }
  if (config.replicas_size() > kMaxShardReplicas) {
    return refused(absl::StrCat("it lists ", config.replicas_size(), " replicas, more than ",
                                kMaxShardReplicas));
  }
  for (int i = 0; i < config.replicas_size(); ++i) {
    const std::string& replica = config.replicas(i);
    if (!IsId(replica)) {
      return refused(absl::StrCat("replica '", absl::CHexEscape(replica.substr(0, 80)),
                                  "' is not an instance id"));
    }
    if (replica == config.holder()) {
      return refused(absl::StrCat("it lists its holder ", replica, " among its replicas"));
    }
    for (int j = 0; j < i; ++j) {
      if (config.replicas(j) == replica) {
        return refused(absl::StrCat("it lists replica ", replica, " twice"));
      }
    }
  }
  return config;
}

std::string FormatShardConfig(const v1::ShardConfig& config) {
  return FormatJsonRecord(config, /*print_defaults=*/false);
}

namespace {

// `next` (its epoch already set) as the writes of a change over `current`
// (null: absent).
ShardClaim Change(uint32_t shard, const KeyValue* current, v1::ShardConfig next) {
  const std::string key = etcd_keys::ShardKey(shard);
  ShardClaim claim;
  claim.config = std::move(next);
  claim.value = FormatShardConfig(claim.config);
  claim.unchanged = Compare::ModRevisionEquals(key, current == nullptr ? 0 : current->mod_revision);
  claim.put = TxnOp::Put(key, claim.value);
  return claim;
}

// The current config and the next epoch; INVALID_ARGUMENT when the value
// does not parse (ParseShardConfig refuses 2^64-1, so +1 cannot wrap).
absl::StatusOr<v1::ShardConfig> Bumped(uint32_t shard, const KeyValue& current) {
  PS_ASSIGN_OR_RETURN(v1::ShardConfig config, ParseShardConfig(shard, current.value));
  config.set_epoch(config.epoch() + 1);
  return config;
}

// `config`'s replicas without `id`; false if it was not listed.
bool RemoveReplica(v1::ShardConfig* config, absl::string_view id) {
  auto* replicas = config->mutable_replicas();
  auto it = std::find(replicas->begin(), replicas->end(), id);
  if (it == replicas->end()) return false;
  replicas->erase(it);
  return true;
}

absl::Status CheckReplicaCount(uint32_t shard, uint32_t num_servers, uint32_t replicas) {
  if (num_servers == 0 || shard >= num_servers) {
    return absl::InvalidArgumentError(
        absl::StrCat("index ", shard, " is not below the server count ", num_servers));
  }
  if (replicas == 0 || replicas > num_servers ||
      replicas > static_cast<uint32_t>(kMaxShardReplicas) + 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replicas=", replicas, " must be between 1 and the server count ",
                     num_servers, " (at most ", kMaxShardReplicas + 1, ")"));
  }
  return absl::OkStatus();
}

// shard, shard + step, shard + 2 * step, ... (mod num_servers): R of them.
std::vector<uint32_t> Walk(uint32_t start, uint32_t num_servers, uint32_t replicas, bool forward) {
  std::vector<uint32_t> out;
  out.reserve(replicas);
  for (uint32_t k = 0; k < replicas; ++k) {
    const uint64_t n = num_servers;
    out.push_back(static_cast<uint32_t>(forward ? (start + k) % n : (start + n - k) % n));
  }
  return out;
}

}  // namespace

absl::StatusOr<std::vector<uint32_t>> InitialReplicaIndices(uint32_t shard, uint32_t num_servers,
                                                            uint32_t replicas) {
  PS_RETURN_IF_ERROR(CheckReplicaCount(shard, num_servers, replicas));
  return Walk(shard, num_servers, replicas, /*forward=*/true);
}

absl::StatusOr<std::vector<uint32_t>> ShardsStartingOn(uint32_t index, uint32_t num_servers,
                                                       uint32_t replicas) {
  PS_RETURN_IF_ERROR(CheckReplicaCount(index, num_servers, replicas));
  return Walk(index, num_servers, replicas, /*forward=*/false);
}

absl::StatusOr<ShardClaim> NextTakeover(uint32_t shard, const KeyValue& current,
                                        absl::string_view successor,
                                        absl::string_view successor_address,
                                        bool drop_other_backups) {
  PS_ASSIGN_OR_RETURN(v1::ShardConfig next, Bumped(shard, current));
  if (!RemoveReplica(&next, successor)) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", etcd_keys::ShardKey(shard), " at epoch ", next.epoch() - 1,
                     " does not list ", successor, " as a replica: it cannot take over"));
  }
  if (drop_other_backups) next.clear_replicas();
  next.set_holder(std::string(successor));
  next.set_holder_address(std::string(successor_address));
  return Change(shard, &current, std::move(next));
}

namespace {

// FAILED_PRECONDITION unless `holder` holds `next` (one epoch up from the
// config read): only the holder `verb`s ("adds", "drops") a replica.
absl::Status CheckHolder(const std::string& key, const v1::ShardConfig& next,
                         absl::string_view holder, absl::string_view verb) {
  if (next.holder() == holder) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat("etcd ", key, " at epoch ", next.epoch() - 1,
                                                    " is held by ", next.holder(), ", not ",
                                                    holder, ": only the holder ", verb,
                                                    " a replica"));
}

}  // namespace

absl::StatusOr<ShardClaim> NextWithoutReplicas(uint32_t shard, const KeyValue& current,
                                               absl::string_view holder,
                                               const std::vector<std::string>& backups) {
  PS_ASSIGN_OR_RETURN(v1::ShardConfig next, Bumped(shard, current));
  const std::string key = etcd_keys::ShardKey(shard);
  PS_RETURN_IF_ERROR(CheckHolder(key, next, holder, "drops"));
  for (const std::string& backup : backups) {
    if (!RemoveReplica(&next, backup)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd ", key, " at epoch ", next.epoch() - 1, " does not list replica ", backup));
    }
  }
  return Change(shard, &current, std::move(next));
}

absl::StatusOr<ShardClaim> NextWithoutReplica(uint32_t shard, const KeyValue& current,
                                              absl::string_view holder,
                                              absl::string_view backup) {
  return NextWithoutReplicas(shard, current, holder, {std::string(backup)});
}

absl::StatusOr<ShardClaim> NextWithReplica(uint32_t shard, const KeyValue& current,
                                           absl::string_view holder, absl::string_view backup) {
  PS_ASSIGN_OR_RETURN(v1::ShardConfig next, Bumped(shard, current));
  const std::string key = etcd_keys::ShardKey(shard);
  PS_RETURN_IF_ERROR(CheckHolder(key, next, holder, "adds"));
  if (!IsId(backup) || backup == holder) {
    return absl::InvalidArgumentError(absl::StrCat(
        "'", absl::CHexEscape(backup), "' is not an instance id of a backup of ", key));
  }
  for (const std::string& replica : next.replicas()) {
    if (replica == backup) {
      return absl::FailedPreconditionError(absl::StrCat(
          "etcd ", key, " at epoch ", next.epoch() - 1, " already lists replica ", backup));
    }
  }
  if (next.replicas_size() >= kMaxShardReplicas) {
    return absl::FailedPreconditionError(absl::StrCat("etcd ", key, " already lists ",
                                                      kMaxShardReplicas, " replicas"));
  }
  next.add_replicas(std::string(backup));
  return Change(shard, &current, std::move(next));
}

absl::StatusOr<ShardClaim> NextShardClaim(uint32_t shard, const KeyValue* current,
                                          absl::string_view holder,
                                          absl::string_view holder_address, uint64_t floor) {
  uint64_t epoch = 0;
  if (current != nullptr) {
    PS_ASSIGN_OR_RETURN(v1::ShardConfig old, ParseShardConfig(shard, current->value));
    epoch = old.epoch();
  }
  if (!IsId(holder)) {
    return absl::InvalidArgumentError(
        absl::StrCat("'", absl::CHexEscape(holder), "' is not an instance id"));
  }
  epoch = std::max(epoch, floor);
  if (epoch == std::numeric_limits<uint64_t>::max()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard, " is at epoch 2^64-1: it cannot be claimed again"));
  }
  v1::ShardConfig next;
  next.set_epoch(epoch + 1);
  next.set_holder(std::string(holder));
  next.set_holder_address(std::string(holder_address));
  return Change(shard, current, std::move(next));
}

}  // namespace pserver
