#include "cc/core/crc32c.h"

#include <algorithm>
#include <cstddef>

#include "isa-l/crc.h"

namespace pserver {

uint32_t Crc32c(absl::string_view data, uint32_t crc) {
  // crc32_iscsi neither inverts its seed nor its result: it carries the raw
  // register. Inverting on the way in and out gives the standard CRC-32C and
  // lets a finished value be continued. Its length is an int, so large
  // buffers go in pieces.
  constexpr size_t kPiece = size_t{1} << 30;
  uint32_t state = ~crc;
  const char* p = data.data();
  size_t left = data.size();
  while (left > 0) {
    const size_t n = std::min(left, kPiece);
    state = crc32_iscsi(reinterpret_cast<unsigned char*>(const_cast<char*>(p)),
                        static_cast<int>(n), state);
    p += n;
    left -= n;
  }
  return ~state;
}

}  // namespace pserver
