// CRC32C: the CRC-32C (Castagnoli, iSCSI) checksum that guards checkpoint
// files, computed with Intel ISA-L's crc32_iscsi (SSE4.2 / PCLMUL when the CPU
// has them).
//
//   uint32_t crc = Crc32c("123456789");            // 0xE3069283
//   uint32_t whole = Crc32c(b, Crc32c(a));         // == Crc32c(a + b)
//
// Standard parameters (reflected polynomial 0x82F63B78, initial value
// 0xFFFFFFFF, final xor 0xFFFFFFFF), the same as Go's
// crc32.Checksum(data, crc32.MakeTable(crc32.Castagnoli)) and Python's
// crc32c.crc32c(data). `crc` is a previous result to continue from; 0 starts
// a new checksum. Pure and thread-safe.
#ifndef PSERVER_CC_CORE_CRC32C_H_
#define PSERVER_CC_CORE_CRC32C_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace pserver {

uint32_t Crc32c(absl::string_view data, uint32_t crc = 0);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_CRC32C_H_
