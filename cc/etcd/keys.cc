#include "cc/etcd/keys.h"

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/random/random.h"

namespace pserver {
namespace etcd_keys {
namespace {

constexpr absl::string_view kRoot = "/pserver/";
constexpr absl::string_view kDesired = "/ps_desired";
constexpr absl::string_view kServers = "/ps/";
constexpr absl::string_view kCheckpoints = "/checkpoints/";
constexpr absl::string_view kWorkers = "/workers/";
constexpr absl::string_view kShards = "/shards/";
constexpr absl::string_view kInstance = " instance=";

absl::Status NotOfTheLayout(absl::string_view key, absl::string_view why) {
  return absl::InvalidArgumentError(
      absl::StrCat("etcd key '", key, "' is not a pserver key: ", why));
}

bool IsCanonicalIndex(absl::string_view digits, uint32_t* index) {
  bool canonical = !digits.empty() && (digits.size() == 1 || digits[0] != '0');
  for (char c : digits) canonical = canonical && absl::ascii_isdigit(c);
  return canonical && absl::SimpleAtoi(digits, index);
}

constexpr absl::string_view kNotAnIndex = "is not an index below 2^32 in canonical decimal";

// The index ending `key` (`digits`); INVALID_ARGUMENT naming the key.
absl::StatusOr<uint32_t> IndexOfKey(absl::string_view key, absl::string_view digits) {
  uint32_t index = 0;
  if (!IsCanonicalIndex(digits, &index)) {
    return NotOfTheLayout(key, absl::StrCat("'", digits, "' ", kNotAnIndex));
  }
  return index;
}

}  // namespace

std::string ClusterPrefix(absl::string_view cluster) { return absl::StrCat(kRoot, cluster); }

std::string DesiredKey() { return std::string(kDesired); }
std::string ServersPrefix() { return std::string(kServers); }
std::string ServerKey(uint32_t index) { return absl::StrCat(kServers, index); }
std::string CheckpointsPrefix() { return std::string(kCheckpoints); }
std::string CheckpointKey(uint32_t shard) { return absl::StrCat(kCheckpoints, shard); }
std::string ShardsPrefix() { return std::string(kShards); }
std::string ShardKey(uint32_t shard) { return absl::StrCat(kShards, shard); }
std::string StandbyKey(uint32_t shard) { return absl::StrCat("/standby/", shard); }
std::string WorkersPrefix() { return std::string(kWorkers); }
std::string WorkerKey(absl::string_view id) { return absl::StrCat(kWorkers, id); }

absl::StatusOr<uint32_t> ParseIndex(absl::string_view text) {
  uint32_t index = 0;
  if (!IsCanonicalIndex(text, &index)) {
    return absl::InvalidArgumentError(absl::StrCat("'", text, "' ", kNotAnIndex));
  }
  return index;
}

absl::StatusOr<ParsedKey> Parse(absl::string_view key) {
  ParsedKey parsed;
  absl::string_view rest = key;
  if (key == kDesired) {
    parsed.kind = KeyKind::kDesired;
  } else if (absl::ConsumePrefix(&rest, kServers)) {
    parsed.kind = KeyKind::kServer;
    auto index = IndexOfKey(key, rest);
    if (!index.ok()) return index.status();
    parsed.index = *index;
  } else if (absl::ConsumePrefix(&rest, kCheckpoints)) {
    parsed.kind = KeyKind::kCheckpoint;
    auto index = IndexOfKey(key, rest);
    if (!index.ok()) return index.status();
    parsed.index = *index;
  } else if (absl::ConsumePrefix(&rest, kShards)) {
    parsed.kind = KeyKind::kShard;
    auto index = IndexOfKey(key, rest);
    if (!index.ok()) return index.status();
    parsed.index = *index;
  } else if (absl::ConsumePrefix(&rest, kWorkers)) {
    if (rest.empty()) return NotOfTheLayout(key, "the worker id is empty");
    parsed.kind = KeyKind::kWorker;
    parsed.worker_id = std::string(rest);
  } else {
    return NotOfTheLayout(
        key, absl::StrCat("expected ", kDesired, ", ", kServers, "<index>, ", kCheckpoints,
                          "<shard>, ", kShards, "<shard> or ", kWorkers, "<id>"));
  }
  return parsed;
}

absl::StatusOr<uint32_t> ParseServerKey(absl::string_view key) {
  absl::string_view rest = key;
  if (!absl::ConsumePrefix(&rest, kServers)) {
    return NotOfTheLayout(key, absl::StrCat("a server key is ", kServers, "<index>"));
  }
  return IndexOfKey(key, rest);
}

std::string FormatServerValue(const ServerEntry& entry) {
  if (entry.instance_id.empty()) return entry.address;
  return absl::StrCat(entry.address, kInstance, entry.instance_id);
}

absl::StatusOr<ServerEntry> ParseServerValue(absl::string_view value) {
  ServerEntry entry;
  const size_t at = value.find(kInstance);
  entry.address = std::string(value.substr(0, at));
  if (at != absl::string_view::npos) {
    entry.instance_id = std::string(value.substr(at + kInstance.size()));
  }
  bool ok = !entry.address.empty() && entry.address.find(' ') == std::string::npos &&
            (at == absl::string_view::npos || !entry.instance_id.empty());
  for (char c : entry.instance_id) ok = ok && absl::ascii_isalnum(c);
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat("server entry '", absl::CHexEscape(value),
                     "' is not 'host:port instance=<id>' nor 'host:port'"));
  }
  return entry;
}

std::string NewInstanceId() {
  absl::BitGen gen;
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}

}  // namespace etcd_keys
}  // namespace pserver
