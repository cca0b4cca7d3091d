#include "cc/etcd/shard_config.h"

#include <algorithm>
#include <limits>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/keys.h"
#include "google/protobuf/util/json_util.h"

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
  if (value.size() > kMaxShardConfigBytes) {
    return refused(
        absl::StrCat("it is ", value.size(), " bytes, more than ", kMaxShardConfigBytes));
  }
  v1::ShardConfig config;
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;  // written by a later release: still readable
  auto parsed = google::protobuf::util::JsonStringToMessage(std::string(value), &config, options);
  if (!parsed.ok()) {
    return refused(absl::StrCat("'", absl::CHexEscape(value.substr(0, 200)),
                                "' is not ShardConfig JSON (", std::string(parsed.message()), ")"));
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
  for (const std::string& replica : config.replicas()) {
    if (!IsId(replica)) {
      return refused(absl::StrCat("replica '", absl::CHexEscape(replica.substr(0, 80)),
                                  "' is not an instance id"));
    }
  }
  return config;
}

std::string FormatShardConfig(const v1::ShardConfig& config) {
  std::string json;
  // A ShardConfig always converts (no Any, no maps of odd keys).
  (void)google::protobuf::util::MessageToJsonString(config, &json);
  return json;
}

absl::StatusOr<ShardClaim> NextShardClaim(uint32_t shard, const KeyValue* current,
                                          absl::string_view holder,
                                          absl::string_view holder_address, uint64_t floor) {
  const std::string key = etcd_keys::ShardKey(shard);
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
  ShardClaim claim;
  claim.config.set_epoch(epoch + 1);
  claim.config.set_holder(std::string(holder));
  claim.config.set_holder_address(std::string(holder_address));
  claim.value = FormatShardConfig(claim.config);
  claim.unchanged = Compare::ModRevisionEquals(key, current == nullptr ? 0 : current->mod_revision);
  claim.put = TxnOp::Put(key, claim.value);
  return claim;
}

}  // namespace pserver
