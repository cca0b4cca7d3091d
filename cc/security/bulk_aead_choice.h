// Whether this end of a TLS bulk channel uses the AEAD layer
// (cc/security/bulk_aead.h): on by default (TlsOptions::bulk_aead), used
// only when TLS is on and this CPU runs ipsec-mb's AES-GCM
// (BulkAeadAvailable()). A CPU without it keeps TLS records and says so once
// per process on stderr, naming `side` ("server" or "client").
//
//   if (UseBulkAead(options.tls, "server")) offer.set_bulk_aead(1);
//
// Thread-safe.
#ifndef PSERVER_CC_SECURITY_BULK_AEAD_CHOICE_H_
#define PSERVER_CC_SECURITY_BULK_AEAD_CHOICE_H_

#include "cc/security/tls.h"

namespace pserver {

// options.enabled() && options.bulk_aead && BulkAeadAvailable(); when the
// first two hold but the CPU lacks the layer, logs that once.
bool UseBulkAead(const TlsOptions& options, const char* side);

// Testing only: `absent` true makes UseBulkAead act as on a CPU without the
// layer; false: as this CPU is.
void SimulateNoBulkAeadForTesting(bool absent);

}  // namespace pserver

#endif  // PSERVER_CC_SECURITY_BULK_AEAD_CHOICE_H_
