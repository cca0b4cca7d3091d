// The etcd key layout of a pserver cluster, defined once. Every key of a
// cluster lives under ClusterPrefix(cluster) ("/pserver/<cluster>"), which is
// what EtcdClientOptions::prefix is set to; the other functions give keys
// relative to it:
//
//   /ps_desired          the desired server count (decimal)
//   /ps/<index>          server <index>'s "host:port instance=<id>[ metrics=host:port]"
//                        (ServerEntry), under its lease
//   /checkpoints/<shard> the newest good checkpoint of a shard (JSON record)
//   /shards/<shard>      a shard's epoch and holder (ShardConfig JSON, no lease;
//                        cc/etcd/shard_config.h)
//   /workers/<id>        a trainer's registration (JSON), under its lease
//   /placement           the placement: kind, server count, version (JSON of
//                        v1::Placement, no lease; cc/etcd/placement_record.h)
//
//   EtcdClientOptions options;
//   options.prefix = etcd_keys::ClusterPrefix("demo");   // "/pserver/demo"
//   etcd->Put(etcd_keys::ServerKey(3), "10.0.0.1:7000", lease);  // "/ps/3"
//   absl::StatusOr<etcd_keys::ParsedKey> parsed = etcd_keys::Parse(kv.key);
//
// Indices are written in canonical decimal (no sign, no leading zeros);
// Parse accepts only that form, so a key has one spelling. Cluster names and
// worker ids are used as given.
//
// Thread safety: plain functions of their arguments.
#ifndef PSERVER_CC_ETCD_KEYS_H_
#define PSERVER_CC_ETCD_KEYS_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {
namespace etcd_keys {

// "/pserver/<cluster>": the prefix every key of `cluster` lives under
// (without a trailing '/', as EtcdClientOptions::prefix wants it).
std::string ClusterPrefix(absl::string_view cluster);

// Keys relative to ClusterPrefix.
std::string DesiredKey();          // "/ps_desired"
std::string ServersPrefix();       // "/ps/"
std::string ServerKey(uint32_t index);  // "/ps/<index>"
std::string CheckpointsPrefix();   // "/checkpoints/"
std::string CheckpointKey(uint32_t shard);  // "/checkpoints/<shard>"
std::string ShardsPrefix();        // "/shards/"
std::string ShardKey(uint32_t shard);  // "/shards/<shard>"
// "/standby/<shard>/<instance>": a standby of shard <shard> (leased; one key per standby).
std::string StandbyKey(uint32_t shard, absl::string_view instance_id);
std::string StandbyPrefix(uint32_t shard);  // "/standby/<shard>/"
std::string WorkersPrefix();       // "/workers/"
std::string WorkerKey(absl::string_view id);  // "/workers/<id>"
std::string PlacementKey();        // "/placement" (not a KeyKind: Parse refuses it)

// What a relative key names.
enum class KeyKind {
  kDesired,
  kServer,
  kCheckpoint,
  kWorker,
  kShard,
};

struct ParsedKey {
  KeyKind kind = KeyKind::kDesired;
  uint32_t index = 0;     // kServer: the server index; kCheckpoint, kShard: the shard
  std::string worker_id;  // kWorker
};

// The kind and argument of a key relative to ClusterPrefix. INVALID_ARGUMENT,
// naming the key, for one that is not of the layout: another name, an index
// that is not canonical decimal below 2^32, an empty worker id.
absl::StatusOr<ParsedKey> Parse(absl::string_view key);

// An index in canonical decimal ("3" -> 3); INVALID_ARGUMENT for "03", "+3",
// "x" or one not below 2^32.
absl::StatusOr<uint32_t> ParseIndex(absl::string_view text);

// The index of a server key ("/ps/3" -> 3); INVALID_ARGUMENT for any other key.
absl::StatusOr<uint32_t> ParseServerKey(absl::string_view key);

// The value of /ps/<index>: where the server listens and the instance id it
// drew at start (random, per process), "10.0.0.1:7000 instance=9f3a...".
// A client sends the id with every call and the server refuses a call that
// names another instance (registry fencing, docs/security.md).
// A server started with --metrics_port adds where its /metrics page listens,
// "10.0.0.1:7000 instance=9f3a... metrics=10.0.0.1:9100", for psctl top.
struct ServerEntry {
  std::string address;
  std::string instance_id;  // "": the value had none (not written by a server)
  std::string metrics_address;  // "": no metrics page (or not published)
};

std::string FormatServerValue(const ServerEntry& entry);
// "host:port instance=<id>", that followed by " metrics=host:port", or a bare
// "host:port" (the form before instance ids; instance_id is then empty).
// Fields are separated by one space, in that order, each at most once.
// INVALID_ARGUMENT naming the value and what is wrong for anything else
// (etcd's contents are not trusted): an empty or non-alphanumeric id, a
// metrics address that is not host:port with a port in 1..65535, a metrics
// address without an instance id, an unknown or repeated field.
absl::StatusOr<ServerEntry> ParseServerValue(absl::string_view value);

// A new random instance id: 16 lowercase hex digits.
std::string NewInstanceId();

}  // namespace etcd_keys
}  // namespace pserver

#endif  // PSERVER_CC_ETCD_KEYS_H_
