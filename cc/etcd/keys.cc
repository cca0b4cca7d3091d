#include "cc/etcd/keys.h"

#include <algorithm>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
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
constexpr absl::string_view kMetrics = " metrics=";

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
std::string StandbyKey(uint32_t shard, absl::string_view instance_id) {
  return absl::StrCat(StandbyPrefix(shard), instance_id);
}
std::string StandbyPrefix(uint32_t shard) { return absl::StrCat("/standby/", shard, "/"); }
std::string WorkersPrefix() { return std::string(kWorkers); }
std::string WorkerKey(absl::string_view id) { return absl::StrCat(kWorkers, id); }
std::string PlacementKey() { return "/placement"; }

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
  std::string value = entry.address;
  if (!entry.instance_id.empty()) absl::StrAppend(&value, kInstance, entry.instance_id);
  if (!entry.metrics_address.empty()) absl::StrAppend(&value, kMetrics, entry.metrics_address);
  return value;
}

namespace {

// "host:port" or "[v6]:port": a host of no space, '=' or control character
// and a port in 1..65535 in canonical decimal.
bool IsHostPort(absl::string_view text) {
  const size_t colon = text.rfind(':');
  if (colon == absl::string_view::npos || colon == 0) return false;
  absl::string_view host = text.substr(0, colon);
  const absl::string_view port = text.substr(colon + 1);
  if (absl::ConsumePrefix(&host, "[") != absl::ConsumeSuffix(&host, "]")) return false;
  if (host.empty()) return false;
  for (char c : host) {
    if (!absl::ascii_isgraph(c) || c == '=' || c == '[' || c == ']') return false;
  }
  uint32_t number = 0;
  return !port.empty() && port[0] != '0' && port.size() <= 5 &&
         std::all_of(port.begin(), port.end(), absl::ascii_isdigit) &&
         absl::SimpleAtoi(port, &number) && number <= 65535;
}

}  // namespace

absl::StatusOr<ServerEntry> ParseServerValue(absl::string_view value) {
  ServerEntry entry;
  const auto refuse = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "server entry '", absl::CHexEscape(value), "' is not 'host:port instance=<id>' ",
        "(optionally followed by ' metrics=host:port') nor 'host:port': ", why));
  };
  const std::vector<absl::string_view> fields = absl::StrSplit(value, ' ');
  if (fields.size() > 3) return refuse("more than three fields");
  entry.address = std::string(fields[0]);
  if (entry.address.empty()) return refuse("no address");
  for (size_t i = 1; i < fields.size(); ++i) {
    absl::string_view field = fields[i];
    if (i == 1 && absl::ConsumePrefix(&field, kInstance.substr(1))) {
      if (field.empty()) return refuse("an empty instance id");
      if (!std::all_of(field.begin(), field.end(), absl::ascii_isalnum)) {
        return refuse("an instance id is letters and digits");
      }
      entry.instance_id = std::string(field);
    } else if (i == fields.size() - 1 && !entry.instance_id.empty() &&
               absl::ConsumePrefix(&field, kMetrics.substr(1))) {
      if (!IsHostPort(field)) return refuse("metrics= is not host:port");
      entry.metrics_address = std::string(field);
    } else {
      return refuse(absl::StrCat("unexpected field '", absl::CHexEscape(fields[i]), "'"));
    }
  }
  return entry;
}

std::string NewInstanceId() {
  absl::BitGen gen;
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(gen), absl::kZeroPad16));
}

}  // namespace etcd_keys
}  // namespace pserver
