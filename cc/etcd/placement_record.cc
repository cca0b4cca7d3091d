#include "cc/etcd/placement_record.h"

#include "absl/strings/str_cat.h"
#include "cc/core/placement.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/json_record.h"
#include "cc/etcd/keys.h"

namespace pserver {

absl::StatusOr<v1::Placement> ParsePlacementRecord(absl::string_view value) {
  auto refused = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(
        "etcd ", etcd_keys::PlacementKey(), " does not hold a placement: ", why,
        " (fix or delete the key: docs/operations.md)"));
  };
  v1::Placement placement;
  if (std::string why = ParseJsonRecord(value, kMaxPlacementRecordBytes, &placement);
      !why.empty()) {
    return refused(why);
  }
  if (placement.version() == 0) return refused("its version is 0 (versions start at 1)");
  // An unknown kind name parses as the default, MODULO, which etcd never
  // holds: servers write JUMP.
  if (placement.kind() != v1::Placement::JUMP) {
    return refused("its kind is not JUMP (the only kind kept in etcd; MODULO, or one this "
                   "release does not know)");
  }
  if (absl::Status valid = CheckPlacementSpec(placement); !valid.ok()) {
    return refused(valid.message());
  }
  if (placement.moving() && (placement.from_num_servers() < 1 ||
                             placement.from_num_servers() > kMaxPlacementServers ||
                             placement.from_num_servers() == placement.num_servers())) {
    return refused(absl::StrCat("it is moving from ", placement.from_num_servers(),
                                " servers to ", placement.num_servers(), " (from_num_servers must be in [1, ",
                                kMaxPlacementServers, "] and differ from num_servers)"));
  }
  if (!placement.moving() && placement.from_num_servers() != 0) {
    return refused(absl::StrCat("it is not moving but names from_num_servers ",
                                placement.from_num_servers()));
  }
  return placement;
}

std::string FormatPlacementRecord(const v1::Placement& placement) {
  return FormatJsonRecord(placement, /*print_defaults=*/true);
}

absl::StatusOr<std::optional<v1::Placement>> ReadPlacement(EtcdClient& etcd,
                                                           absl::Time deadline) {
  absl::StatusOr<KeyValue> kv = etcd.Get(etcd_keys::PlacementKey(), deadline);
  if (absl::IsNotFound(kv.status())) return std::nullopt;
  PS_RETURN_IF_ERROR(kv.status());
  PS_ASSIGN_OR_RETURN(v1::Placement placement, ParsePlacementRecord(kv->value));
  return placement;
}

absl::StatusOr<v1::Placement> EnsurePlacement(EtcdClient& etcd, uint32_t num_servers,
                                              absl::Time deadline) {
  const std::string key = etcd_keys::PlacementKey();
  v1::Placement want;
  want.set_kind(v1::Placement::JUMP);
  want.set_num_servers(num_servers);
  want.set_version(1);
  PS_RETURN_IF_ERROR(CheckPlacementSpec(want));
  for (int attempt = 0; attempt < 16; ++attempt) {
    absl::StatusOr<KeyValue> kv = etcd.Get(key, deadline);
    int64_t read_revision = 0;  // 0: missing
    if (kv.ok()) {
      PS_ASSIGN_OR_RETURN(v1::Placement held, ParsePlacementRecord(kv->value));
      // A move under way: its coordinator (psctl scale) owns /placement.
      if (held.moving()) return held;
      if (held.kind() == want.kind() && held.num_servers() == num_servers) return held;
      if (held.version() == UINT64_MAX) {
        return absl::InvalidArgumentError(absl::StrCat("etcd ", key, "'s version is 2^64-1"));
      }
      want.set_version(held.version() + 1);
      read_revision = kv->mod_revision;
    } else if (!absl::IsNotFound(kv.status())) {
      return kv.status();
    }
    const Compare guard = read_revision == 0 ? Compare::KeyMissing(key)
                                             : Compare::ModRevisionEquals(key, read_revision);
    PS_ASSIGN_OR_RETURN(TxnResult result,
                        etcd.Txn({guard}, {TxnOp::Put(key, FormatPlacementRecord(want))}));
    if (result.succeeded) return want;
    // Someone else wrote it meanwhile: read theirs.
  }
  return absl::AbortedError(absl::StrCat("etcd ", key, " kept changing: 16 tries"));
}

}  // namespace pserver
