#include "cc/core/placement.h"

#include <algorithm>
#include <string>

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

Placement::Placement(int num_servers, size_t block_bytes)
    : num_servers_(std::max(1, num_servers)), block_bytes_(std::max<size_t>(1, block_bytes)) {}

int Placement::HomeServer(absl::string_view name) const {
  return static_cast<int>(Fnv1a64(name) % static_cast<uint64_t>(num_servers_));
}

int Placement::ServerOf(absl::string_view name, uint32_t block) const {
  return static_cast<int>((static_cast<uint64_t>(HomeServer(name)) + block) %
                          static_cast<uint64_t>(num_servers_));
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

absl::StatusOr<int> KeyServer(uint64_t key, const v1::Partitioning& partitioning, int num_servers) {
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
  // splitmix64's finalizer.
  uint64_t z = key + 0x9e3779b97f4a7c15ULL;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  z ^= z >> 31;
  return static_cast<int>(z % static_cast<uint64_t>(num_servers));
}

}  // namespace pserver
