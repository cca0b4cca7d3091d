// The address a server publishes: what other hosts dial to reach it.
//
//   PS_ASSIGN_OR_RETURN(std::string host, AdvertisedHost("0.0.0.0", "10.0.0.7"));
//   JoinHostPort(host, 7000);   // "10.0.0.7:7000"; IPv6: "[fd00::7]:7000"
//
// A server bound to every address (0.0.0.0 or ::) has no address of its own
// to publish: it needs an advertise host (pserver --advertise_host, as etcd's
// --advertise-client-urls), and one that is itself unspecified is refused.
#ifndef PSERVER_CC_SERVER_ADVERTISED_ADDRESS_H_
#define PSERVER_CC_SERVER_ADVERTISED_ADDRESS_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace pserver {

// True for 0.0.0.0, :: (in any spelling) and the empty host.
bool IsUnspecifiedHost(absl::string_view host);

// The host to publish for a server listening on `listen_host`:
// `advertise_host` when given (brackets around an IPv6 address dropped), else
// `listen_host`. INVALID_ARGUMENT, naming --advertise_host, when the result
// is unspecified, holds a port or a character no host name has, or looks like
// IPv6 and is not.
absl::StatusOr<std::string> AdvertisedHost(absl::string_view listen_host,
                                           absl::string_view advertise_host);

// "host:port", or "[host]:port" when host is an IPv6 address.
std::string JoinHostPort(absl::string_view host, int port);

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_ADVERTISED_ADDRESS_H_
