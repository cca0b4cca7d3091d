#include "cc/security/bulk_aead_choice.h"

#include <atomic>
#include <cstdio>

#include "absl/base/call_once.h"
#include "cc/security/bulk_aead.h"

namespace pserver {
namespace {

std::atomic<bool> simulate_absent{false};

}  // namespace

void SimulateNoBulkAeadForTesting(bool absent) { simulate_absent.store(absent); }

bool UseBulkAead(const TlsOptions& options, const char* side) {
  if (!options.enabled() || !options.bulk_aead) return false;
  if (!simulate_absent.load() && BulkAeadAvailable()) return true;
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
