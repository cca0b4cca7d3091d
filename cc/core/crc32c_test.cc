#include "cc/core/crc32c.h"

#include <cstdint>
#include <string>

#include "gtest/gtest.h"

namespace pserver {
namespace {

// A bitwise reference implementation of CRC-32C, independent of ISA-L.
uint32_t ReferenceCrc32c(const std::string& data, uint32_t crc = 0) {
  crc = ~crc;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
  }
  return ~crc;
}

TEST(Crc32cTest, CheckValue) {
  EXPECT_EQ(Crc32c("123456789"), 0xE3069283u);
}

TEST(Crc32cTest, EmptyIsZero) {
  EXPECT_EQ(Crc32c(""), 0u);
  EXPECT_EQ(Crc32c("", 0x12345678u), 0x12345678u);
}

// Published test vectors (RFC 3720 appendix B.4).
TEST(Crc32cTest, Rfc3720Vectors) {
  EXPECT_EQ(Crc32c(std::string(32, '\0')), 0x8A9136AAu);
  EXPECT_EQ(Crc32c(std::string(32, '\xff')), 0x62A8AB43u);
  std::string ascending, descending;
  for (int i = 0; i < 32; ++i) {
    ascending.push_back(static_cast<char>(i));
    descending.push_back(static_cast<char>(31 - i));
  }
  EXPECT_EQ(Crc32c(ascending), 0x46DD794Eu);
  EXPECT_EQ(Crc32c(descending), 0x113FDB5Cu);
}

TEST(Crc32cTest, MatchesReferenceOnManyLengths) {
  std::string data;
  uint32_t x = 1;
  for (int len = 0; len < 1100; ++len) {
    EXPECT_EQ(Crc32c(data), ReferenceCrc32c(data)) << "length " << len;
    x = x * 1103515245u + 12345u;
    data.push_back(static_cast<char>(x >> 16));
  }
}

TEST(Crc32cTest, Chaining) {
  const std::string a = "The quick brown fox ";
  const std::string b = "jumps over the lazy dog";
  EXPECT_EQ(Crc32c(b, Crc32c(a)), Crc32c(a + b));
  EXPECT_EQ(Crc32c(a + b), ReferenceCrc32c(a + b));
  // Split at every point.
  const std::string s = a + b;
  for (size_t i = 0; i <= s.size(); ++i) {
    EXPECT_EQ(Crc32c(s.substr(i), Crc32c(s.substr(0, i))), Crc32c(s)) << "split at " << i;
  }
}

TEST(Crc32cTest, DetectsOneFlippedBit) {
  std::string data(4096, 'x');
  const uint32_t good = Crc32c(data);
  data[1234] ^= 0x04;
  EXPECT_NE(Crc32c(data), good);
}

}  // namespace
}  // namespace pserver
