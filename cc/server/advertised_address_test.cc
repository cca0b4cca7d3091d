#include "cc/server/advertised_address.h"

#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusIs;
using ::testing::HasSubstr;

TEST(AdvertisedAddressTest, UnspecifiedHosts) {
  for (const char* host : {"", "0.0.0.0", "::", "0:0::0", "0000::"}) {
    EXPECT_TRUE(IsUnspecifiedHost(host)) << host;
  }
  for (const char* host : {"127.0.0.1", "::1", "10.0.0.1", "fd00::1", "example.com", "0.0.0.1"}) {
    EXPECT_FALSE(IsUnspecifiedHost(host)) << host;
  }
}

TEST(AdvertisedAddressTest, ListenHostIsPublishedWhenSpecific) {
  EXPECT_EQ(*AdvertisedHost("127.0.0.1", ""), "127.0.0.1");
  EXPECT_EQ(*AdvertisedHost("::1", ""), "::1");
  EXPECT_EQ(*AdvertisedHost("localhost", ""), "localhost");
}

TEST(AdvertisedAddressTest, UnspecifiedListenHostNeedsAdvertiseHost) {
  for (const char* host : {"0.0.0.0", "::"}) {
    EXPECT_THAT(AdvertisedHost(host, ""),
                StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("--advertise_host")))
        << host;
  }
  EXPECT_EQ(*AdvertisedHost("0.0.0.0", "10.0.0.7"), "10.0.0.7");
  EXPECT_EQ(*AdvertisedHost("::", "fd00::7"), "fd00::7");
  EXPECT_EQ(*AdvertisedHost("::", "[fd00::7]"), "fd00::7");
  EXPECT_EQ(*AdvertisedHost("0.0.0.0", "node-3.example.com"), "node-3.example.com");
}

TEST(AdvertisedAddressTest, BadAdvertiseHostsAreRefusedWithTheReason) {
  EXPECT_THAT(AdvertisedHost("0.0.0.0", "0.0.0.0"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unspecified")));
  EXPECT_THAT(AdvertisedHost("::", "[::]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("unspecified")));
  EXPECT_THAT(AdvertisedHost("0.0.0.0", "10.0.0.7:7000"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a port")));
  EXPECT_THAT(AdvertisedHost("0.0.0.0", "[fd00::zz]"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("without a port")));
  EXPECT_THAT(AdvertisedHost("0.0.0.0", "a b"),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("not a host name")));
}

TEST(AdvertisedAddressTest, JoinHostPortBracketsIpv6) {
  EXPECT_EQ(JoinHostPort("10.0.0.7", 7000), "10.0.0.7:7000");
  EXPECT_EQ(JoinHostPort("fd00::7", 7000), "[fd00::7]:7000");
  EXPECT_EQ(JoinHostPort("::1", 1), "[::1]:1");
}

}  // namespace
}  // namespace pserver
