// How a standby tells that its primary is evidently gone (docs/replication.md,
// "Failover"): it holds a long-lived gRPC connection to the primary; once that
// connection breaks, a fresh TCP dial to the primary's address is made, and
// only a refused dial (ECONNREFUSED: the host answers, nothing listens, the
// process is gone) counts as evidence. A paused or cut-off primary (no reset,
// a dial that times out or finds no route) is not evidence: the standby then
// waits for the primary's lease to expire.
#ifndef PSERVER_CC_SERVER_PRIMARY_WATCH_H_
#define PSERVER_CC_SERVER_PRIMARY_WATCH_H_

#include <memory>
#include <string>

#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"

namespace pserver {

// True when a TCP connect to `address` ("host:port", "[v6]:port") is refused
// on every address it resolves to; false when one accepts, or a dial times
// out (after `timeout`), or fails another way, or the address does not parse.
bool DialRefused(const std::string& address, absl::Duration timeout);

class PrimaryWatch {
 public:
  // Starts connecting to `address` (plaintext; standbys are refused with TLS).
  explicit PrimaryWatch(std::string address);

  // Waits up to `wait` for the connection's state to change; true when it
  // is not connected and a fresh dial is refused (at most one dial per
  // kDialInterval, each bounded by kDialTimeout).
  bool Gone(absl::Duration wait);

  static constexpr absl::Duration kDialInterval = absl::Milliseconds(100);
  static constexpr absl::Duration kDialTimeout = absl::Milliseconds(500);

 private:
  std::string address_;
  std::shared_ptr<grpc::Channel> channel_;
  absl::Time next_dial_ = absl::InfinitePast();
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_PRIMARY_WATCH_H_
