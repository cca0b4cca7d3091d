// RequestId: identifies a push for exactly-once application (service.proto
// SendGradsRequest.client_id/sequence): a random non-zero client id and
// that client's sequence number for one server. A retried push carries the
// same id. client 0: not tracked. Shared by client and server.
#ifndef PSERVER_CC_CORE_REQUEST_ID_H_
#define PSERVER_CC_CORE_REQUEST_ID_H_

#include <cstdint>

namespace pserver {

struct RequestId {
  uint64_t client = 0;
  uint64_t sequence = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_REQUEST_ID_H_
