#include "cc/core/placement.h"

#include <algorithm>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"

namespace pserver {

uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t hash = 14695981039346656037ull;
  for (unsigned char c : bytes) {
    hash ^= c;
    hash *= 1099511628211ull;
  }
  return hash;
}

uint64_t Mix64(uint64_t x) {
  uint64_t z = x + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

int JumpConsistentHash(uint64_t key, int num_buckets) {
  int64_t b = -1;
  int64_t j = 0;
  while (j < num_buckets) {
    b = j;
    key = key * 2862933555777941757ULL + 1;
    j = static_cast<int64_t>(static_cast<double>(b + 1) *
                             (static_cast<double>(1LL << 31) /
                              static_cast<double>((key >> 33) + 1)));
  }
  return static_cast<int>(b);
}

absl::Status CheckPlacementSpec(const v1::Placement& spec) {
  if (!v1::Placement::Kind_IsValid(spec.kind())) {
    return absl::InvalidArgumentError(
        absl::StrCat("placement kind ", static_cast<int>(spec.kind()), " is not known"));
  }
  if (spec.num_servers() < 1 || spec.num_servers() > kMaxPlacementServers) {
    return absl::InvalidArgumentError(absl::StrCat("placement num_servers must be in [1, ",
                                                   kMaxPlacementServers, "], got ",
                                                   spec.num_servers()));
  }
  return absl::OkStatus();
}

bool SameMapping(const v1::Placement& a, const v1::Placement& b) {
  if (a.num_servers() != b.num_servers()) return false;
  return a.num_servers() <= 1 || a.kind() == b.kind();
}

Placement::Placement(int num_servers, size_t block_bytes)
    : Placement(num_servers, block_bytes, v1::Placement::JUMP, 0) {}

Placement::Placement(int num_servers, size_t block_bytes, v1::Placement::Kind kind,
                     uint64_t version)
    : num_servers_(std::max(1, num_servers)),
      block_bytes_(std::max<size_t>(1, block_bytes)),
      kind_(kind),
      version_(version) {}

absl::StatusOr<Placement> Placement::FromSpec(const v1::Placement& spec, size_t block_bytes) {
  if (absl::Status status = CheckPlacementSpec(spec); !status.ok()) return status;
  return Placement(static_cast<int>(spec.num_servers()), block_bytes, spec.kind(),
                   spec.version());
}

v1::Placement Placement::spec() const {
  v1::Placement spec;
  spec.set_version(version_);
  spec.set_kind(kind_);
  spec.set_num_servers(static_cast<uint32_t>(num_servers_));
  return spec;
}

int Placement::HomeServer(absl::string_view name) const { return ServerOf(name, 0); }

int Placement::ServerOf(absl::string_view name, uint32_t block) const {
  const uint64_t n = static_cast<uint64_t>(num_servers_);
  if (kind_ == v1::Placement::MODULO) {
    return static_cast<int>((Fnv1a64(name) % n + block) % n);
  }
  return JumpConsistentHash(Mix64(Fnv1a64(name) + block), num_servers_);
}

int Placement::HashKeyServer(uint64_t key) const {
  if (kind_ == v1::Placement::MODULO) {
    return static_cast<int>(Mix64(key) % static_cast<uint64_t>(num_servers_));
  }
  return JumpConsistentHash(Mix64(key), num_servers_);
}

uint64_t Placement::BlockElements(size_t element_size) const {
  return std::max<uint64_t>(1, block_bytes_ / std::max<size_t>(1, element_size));
}

uint32_t Placement::BlockCount(uint64_t elements, size_t element_size) const {
  const uint64_t per_block = BlockElements(element_size);
  return static_cast<uint32_t>(std::max<uint64_t>(1, (elements + per_block - 1) / per_block));
}

std::vector<BlockSpec> Placement::Blocks(absl::string_view name, uint64_t elements,
                                         size_t element_size) const {
  const uint64_t per_block = BlockElements(element_size);
  const uint32_t count = BlockCount(elements, element_size);
  std::vector<BlockSpec> blocks(count);
  for (uint32_t i = 0; i < count; ++i) {
    BlockSpec& b = blocks[i];
    b.index = i;
    b.count = count;
    b.offset = static_cast<uint64_t>(i) * per_block;
    b.elements = std::min(per_block, elements - b.offset);
    b.server = ServerOf(name, i);
  }
  return blocks;
}

absl::StatusOr<int> KeyServer(uint64_t key, const v1::Partitioning& partitioning,
                              const Placement& placement) {
  const int num_servers = placement.num_servers();
  if (partitioning.kind() == v1::Partitioning::RANGE) {
    using u128 = unsigned __int128;
    const u128 begin = partitioning.range_begin();
    const u128 end = partitioning.range_end() == 0 ? (u128{1} << 64) : partitioning.range_end();
    if (key < begin || key >= end) {
      return absl::InvalidArgumentError(absl::StrCat(
          "key ", key, " is outside the table's key range [", partitioning.range_begin(), ", ",
          partitioning.range_end() == 0 ? std::string("2^64")
                                        : absl::StrCat(partitioning.range_end()),
          ")"));
    }
    const u128 width = (end - begin + num_servers - 1) / num_servers;
    return static_cast<int>((key - begin) / width);
  }
  return placement.HashKeyServer(key);
}

absl::Status PlacementMoved(uint64_t version, absl::string_view what, int owner, int self) {
  return absl::FailedPreconditionError(absl::StrCat(
      kPlacementMovedPrefix, version, ": ", what, " is on server ", owner,
      " under it, not on this server ", self,
      "; nothing of the request was applied; re-read /placement and re-route"));
}

std::optional<uint64_t> PlacementMovedVersion(const absl::Status& status) {
  if (!absl::IsFailedPrecondition(status)) return std::nullopt;
  absl::string_view message = status.message();
  if (!absl::ConsumePrefix(&message, kPlacementMovedPrefix)) return std::nullopt;
  const size_t end = message.find(':');
  uint64_t version = 0;
  if (end == absl::string_view::npos || !absl::SimpleAtoi(message.substr(0, end), &version)) {
    return std::nullopt;
  }
  return version;
}

uint32_t KeyBucket(uint64_t key) {
  // Salted: the top bits of Mix64(key) alone also seed the key's server.
  return static_cast<uint32_t>(Mix64(key ^ 0x6a09e667f3bcc909ULL) >> 56);
}

}  // namespace pserver
