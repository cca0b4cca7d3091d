#include "cc/security/bulk_aead_choice.h"

#include <cstdio>

#include "absl/base/call_once.h"
#include "cc/security/bulk_aead.h"

namespace pserver {

bool UseBulkAead(const TlsOptions& options, const char* side) {
  if (!options.enabled() || !options.bulk_aead) return false;
  if (BulkAeadAvailable()) return true;
  static absl::once_flag logged;
  absl::call_once(logged, [side] {
    std::fprintf(stderr,
                 "pserver %s: the bulk channel's AEAD layer needs AES-NI (ipsec-mb finds no "
                 "usable arch here): TLS records are used instead\n",
                 side);
  });
  return false;
}

}  // namespace pserver
