// The C ABI's view of the etcd key layout (pserver_etcd_key*): forwards to
// cc/etcd/keys.h, so C, Go and Python spell keys as the servers do.
#include <algorithm>
#include <cstring>
#include <utility>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "cc/capi/pserver.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/keys.h"

namespace {

namespace keys = pserver::etcd_keys;

// Runs `fn` (returning absl::StatusOr<T>) and stores its status in `status`
// through the public setter; `failed` when it fails or throws.
template <typename T, typename Fn>
T Run(pserver_status_t* status, T failed, Fn&& fn) {
  try {
    absl::StatusOr<T> result = fn();
    if (result.ok()) {
      pserver_status_set(status, PSERVER_OK, "");
      return *result;
    }
    pserver_status_set(status, static_cast<int32_t>(result.status().code()),
                       std::string(result.status().message()).c_str());
  } catch (...) {
    pserver_status_set(status, PSERVER_INTERNAL, "pserver: unexpected exception");
  }
  return failed;
}

// Writes `text` NUL-terminated and truncated to fit `out` (out_size bytes);
// its full length, as snprintf does.
size_t WriteTruncated(const std::string& text, char* out, size_t out_size) {
  if (out != nullptr && out_size > 0) {
    const size_t n = std::min(text.size(), out_size - 1);
    std::memcpy(out, text.data(), n);
    out[n] = '\0';
  }
  return text.size();
}

absl::StatusOr<std::string> KeyOf(int32_t kind, const char* cluster, absl::string_view arg) {
  const std::string prefix = keys::ClusterPrefix(cluster);
  auto without_arg = [&](const std::string& key) -> absl::StatusOr<std::string> {
    if (!arg.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("etcd key kind ", kind, " takes no argument, got '", arg, "'"));
    }
    return prefix + key;
  };
  switch (kind) {
    case PSERVER_ETCD_KEY_CLUSTER:
      return without_arg("/");
    case PSERVER_ETCD_KEY_DESIRED:
      return without_arg(keys::DesiredKey());
    case PSERVER_ETCD_KEY_SERVERS:
      return without_arg(keys::ServersPrefix());
    case PSERVER_ETCD_KEY_CHECKPOINTS:
      return without_arg(keys::CheckpointsPrefix());
    case PSERVER_ETCD_KEY_WORKERS:
      return without_arg(keys::WorkersPrefix());
    case PSERVER_ETCD_KEY_SHARDS:
      return without_arg(keys::ShardsPrefix());
    case PSERVER_ETCD_KEY_SHARD: {
      PS_ASSIGN_OR_RETURN(uint32_t shard, keys::ParseIndex(arg));
      return prefix + keys::ShardKey(shard);
    }
    case PSERVER_ETCD_KEY_SERVER: {
      PS_ASSIGN_OR_RETURN(uint32_t index, keys::ParseIndex(arg));
      return prefix + keys::ServerKey(index);
    }
    case PSERVER_ETCD_KEY_CHECKPOINT: {
      PS_ASSIGN_OR_RETURN(uint32_t shard, keys::ParseIndex(arg));
      return prefix + keys::CheckpointKey(shard);
    }
    case PSERVER_ETCD_KEY_WORKER:
      if (arg.empty()) return absl::InvalidArgumentError("a worker key needs a worker id");
      return prefix + keys::WorkerKey(arg);
    default:
      return absl::InvalidArgumentError(absl::StrCat("unknown etcd key kind ", kind));
  }
}

// The kind and argument of a full key of `cluster`.
absl::StatusOr<std::pair<int32_t, std::string>> KindOf(const char* cluster,
                                                       absl::string_view key) {
  absl::string_view relative = key;
  const std::string prefix = keys::ClusterPrefix(cluster);
  if (!absl::ConsumePrefix(&relative, prefix)) {
    return absl::InvalidArgumentError(
        absl::StrCat("etcd key '", key, "' is not under cluster prefix ", prefix, "/"));
  }
  PS_ASSIGN_OR_RETURN(keys::ParsedKey parsed, keys::Parse(relative));
  switch (parsed.kind) {
    case keys::KeyKind::kDesired:
      return std::make_pair(int32_t{PSERVER_ETCD_KEY_DESIRED}, std::string());
    case keys::KeyKind::kServer:
      return std::make_pair(int32_t{PSERVER_ETCD_KEY_SERVER}, absl::StrCat(parsed.index));
    case keys::KeyKind::kCheckpoint:
      return std::make_pair(int32_t{PSERVER_ETCD_KEY_CHECKPOINT}, absl::StrCat(parsed.index));
    case keys::KeyKind::kWorker:
      return std::make_pair(int32_t{PSERVER_ETCD_KEY_WORKER}, parsed.worker_id);
    case keys::KeyKind::kShard:
      return std::make_pair(int32_t{PSERVER_ETCD_KEY_SHARD}, absl::StrCat(parsed.index));
  }
  return absl::InternalError("unknown key kind");
}

absl::Status CheckString(const char* value, const char* what) {
  if (value == nullptr) return absl::InvalidArgumentError(absl::StrCat(what, " is NULL"));
  return absl::OkStatus();
}

}  // namespace

size_t pserver_etcd_key(int32_t kind, const char* cluster, const char* arg, char* out,
                        size_t out_size, pserver_status_t* status) {
  return Run(status, size_t{0}, [&]() -> absl::StatusOr<size_t> {
    PS_RETURN_IF_ERROR(CheckString(cluster, "cluster"));
    PS_ASSIGN_OR_RETURN(std::string key, KeyOf(kind, cluster, arg == nullptr ? "" : arg));
    return WriteTruncated(key, out, out_size);
  });
}

int32_t pserver_etcd_key_parse(const char* cluster, const char* key, char* out, size_t out_size,
                               pserver_status_t* status) {
  return Run(status, int32_t{-1}, [&]() -> absl::StatusOr<int32_t> {
    PS_RETURN_IF_ERROR(CheckString(cluster, "cluster"));
    PS_RETURN_IF_ERROR(CheckString(key, "key"));
    PS_ASSIGN_OR_RETURN(auto parsed, KindOf(cluster, key));
    if (out == nullptr || out_size <= parsed.second.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("out holds ", out == nullptr ? 0 : out_size, " bytes; the argument of '",
                       key, "' needs ", parsed.second.size() + 1));
    }
    WriteTruncated(parsed.second, out, out_size);
    return parsed.first;
  });
}

int32_t pserver_etcd_server_value_parse(const char* value, char* address, size_t address_size,
                                        char* instance, size_t instance_size, char* metrics,
                                        size_t metrics_size, pserver_status_t* status) {
  return Run(status, int32_t{-1}, [&]() -> absl::StatusOr<int32_t> {
    PS_RETURN_IF_ERROR(CheckString(value, "value"));
    PS_ASSIGN_OR_RETURN(keys::ServerEntry entry, keys::ParseServerValue(value));
    const std::pair<const std::string*, std::pair<char*, size_t>> fields[] = {
        {&entry.address, {address, address_size}},
        {&entry.instance_id, {instance, instance_size}},
        {&entry.metrics_address, {metrics, metrics_size}},
    };
    for (const auto& [text, out] : fields) {
      if (out.first == nullptr || out.second <= text->size()) {
        return absl::InvalidArgumentError(
            absl::StrCat("a buffer of ", out.first == nullptr ? 0 : out.second,
                         " bytes is too small for '", *text, "' of server entry '", value, "'"));
      }
    }
    for (const auto& [text, out] : fields) WriteTruncated(*text, out.first, out.second);
    return 0;
  });
}
