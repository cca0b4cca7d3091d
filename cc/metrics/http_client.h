// Test and tool helpers: one HTTP/1.1 exchange with a MetricsHttpListener
// (or any server that closes after its reply), bounded by a deadline.
//
//   PS_ASSIGN_OR_RETURN(std::string page,
//                       HttpGet("127.0.0.1", port, "/metrics", absl::Now() + absl::Seconds(30)));
//
// Thread-safe (no shared state).
#ifndef PSERVER_CC_METRICS_HTTP_CLIENT_H_
#define PSERVER_CC_METRICS_HTTP_CLIENT_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace pserver {
namespace metrics {

// Sends `request` as is and returns every byte of the reply up to the
// server's close. UNAVAILABLE when it cannot connect, DEADLINE_EXCEEDED at
// `deadline`.
absl::StatusOr<std::string> HttpExchange(const std::string& host, int port,
                                         absl::string_view request, absl::Time deadline);

// GET `path`: the body of a 200 reply; UNAVAILABLE quoting any other status
// line.
absl::StatusOr<std::string> HttpGet(const std::string& host, int port, const std::string& path,
                                    absl::Time deadline);

}  // namespace metrics
}  // namespace pserver

#endif  // PSERVER_CC_METRICS_HTTP_CLIENT_H_
