// UseBulkAead: on by default with TLS, off without TLS or when turned off;
// a CPU without the layer (simulated) keeps TLS records and says so once.
#include "cc/security/bulk_aead_choice.h"

#include <string>

#include "cc/security/bulk_aead.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::testing::HasSubstr;

TlsOptions WithTls() {
  TlsOptions tls;
  tls.cert = "c.pem";  // only enabled() is read: the files are not opened
  tls.key = "c.key";
  tls.ca = "ca.pem";
  return tls;
}

TEST(BulkAeadChoiceTest, OnByDefaultWithTlsWhereTheCpuRunsIt) {
  EXPECT_EQ(UseBulkAead(WithTls(), "client"), BulkAeadAvailable());
  TlsOptions off = WithTls();
  off.bulk_aead = false;
  EXPECT_FALSE(UseBulkAead(off, "client"));
  EXPECT_FALSE(UseBulkAead(TlsOptions(), "client"));  // no TLS
}

TEST(BulkAeadChoiceTest, ACpuWithoutTheLayerKeepsTlsRecordsAndSaysSoOnce) {
  SimulateNoBulkAeadForTesting(true);
  TlsOptions off = WithTls();
  off.bulk_aead = false;
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(UseBulkAead(off, "server"));  // not wanted: nothing to say
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
  ::testing::internal::CaptureStderr();
  EXPECT_FALSE(UseBulkAead(WithTls(), "server"));
  EXPECT_FALSE(UseBulkAead(WithTls(), "server"));
  const std::string said = ::testing::internal::GetCapturedStderr();
  SimulateNoBulkAeadForTesting(false);
  EXPECT_THAT(said, HasSubstr("pserver server: the bulk channel's AEAD layer needs AES-NI"));
  EXPECT_THAT(said, HasSubstr("TLS records are used instead"));
  EXPECT_EQ(said.find("needs AES-NI"), said.rfind("needs AES-NI"));  // once
  EXPECT_EQ(UseBulkAead(WithTls(), "server"), BulkAeadAvailable());
}

}  // namespace
}  // namespace pserver
