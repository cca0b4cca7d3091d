#include "cc/client/placement.h"

#include <algorithm>

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

}  // namespace pserver
