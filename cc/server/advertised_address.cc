#include "cc/server/advertised_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace pserver {
namespace {

constexpr char kSetAdvertiseHost[] =
    "set --advertise_host (ServerOptions.advertise_host) to the address other hosts reach this "
    "one at";

bool IsIpv6Literal(absl::string_view host, in6_addr* parsed) {
  const std::string text(host);
  return inet_pton(AF_INET6, text.c_str(), parsed) == 1;
}

// A DNS name or an IPv4 address: letters, digits, '-', '.', '_'.
bool IsHostNameOrIpv4(absl::string_view host) {
  if (host.empty() || host.size() > 253) return false;
  for (char c : host) {
    if (!absl::ascii_isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_') {
      return false;
    }
  }
  return true;
}

}  // namespace

bool IsUnspecifiedHost(absl::string_view host) {
  if (host.empty()) return true;
  const std::string text(host);
  in_addr v4{};
  if (inet_pton(AF_INET, text.c_str(), &v4) == 1) return v4.s_addr == htonl(INADDR_ANY);
  in6_addr v6{};
  return IsIpv6Literal(host, &v6) && IN6_IS_ADDR_UNSPECIFIED(&v6);
}

absl::StatusOr<std::string> AdvertisedHost(absl::string_view listen_host,
                                           absl::string_view advertise_host) {
  if (advertise_host.empty()) {
    if (IsUnspecifiedHost(listen_host)) {
      return absl::InvalidArgumentError(
          absl::StrCat("the server listens on '", listen_host,
                       "' (every address), which other hosts cannot dial and so is not published: ",
                       kSetAdvertiseHost));
    }
    return std::string(listen_host);
  }
  absl::string_view host = advertise_host;
  const bool bracketed = absl::ConsumePrefix(&host, "[") && absl::ConsumeSuffix(&host, "]");
  in6_addr v6{};
  const bool ipv6 = IsIpv6Literal(host, &v6);
  if (!ipv6 && (bracketed || absl::StrContains(host, ':'))) {
    return absl::InvalidArgumentError(
        absl::StrCat("advertise_host '", advertise_host,
                     "' is neither a host name nor an IPv4 or IPv6 address (give the host "
                     "alone, without a port: the port is the one the server listens on)"));
  }
  if (!ipv6 && !IsHostNameOrIpv4(host)) {
    return absl::InvalidArgumentError(
        absl::StrCat("advertise_host '", advertise_host, "' is not a host name or an IP address"));
  }
  if (IsUnspecifiedHost(host)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "advertise_host '", advertise_host,
        "' is an unspecified address, which other hosts cannot dial: ", kSetAdvertiseHost));
  }
  return std::string(host);
}

std::string JoinHostPort(absl::string_view host, int port) {
  return absl::StrContains(host, ':') ? absl::StrCat("[", host, "]:", port)
                                      : absl::StrCat(host, ":", port);
}

}  // namespace pserver
