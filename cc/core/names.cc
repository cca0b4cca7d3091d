#include "cc/core/names.h"

#include <cstdint>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pserver {
namespace {

// Error messages quote at most this many bytes of a name.
constexpr size_t kQuotedNameBytes = 64;

std::string Quote(absl::string_view name) {
  if (name.size() <= kQuotedNameBytes) return absl::StrCat("\"", absl::CEscape(name), "\"");
  return absl::StrCat("\"", absl::CEscape(name.substr(0, kQuotedNameBytes)), "...\"");
}

// The length of the well-formed UTF-8 sequence at the start of `s` (not
// empty), or 0 if there is none (RFC 3629, table 3-7 of the Unicode standard).
size_t Utf8SequenceLength(absl::string_view s) {
  const auto byte = [&](size_t i) { return static_cast<uint8_t>(s[i]); };
  const auto continuation = [&](size_t i, uint8_t low = 0x80, uint8_t high = 0xbf) {
    return i < s.size() && byte(i) >= low && byte(i) <= high;
  };
  const uint8_t lead = byte(0);
  if (lead < 0x80) return 1;
  if (lead >= 0xc2 && lead <= 0xdf) return continuation(1) ? 2 : 0;
  if (lead >= 0xe0 && lead <= 0xef) {
    // E0 needs A0..BF (no overlong form); ED needs 80..9F (no surrogate).
    const uint8_t low = lead == 0xe0 ? 0xa0 : 0x80;
    const uint8_t high = lead == 0xed ? 0x9f : 0xbf;
    return continuation(1, low, high) && continuation(2) ? 3 : 0;
  }
  if (lead >= 0xf0 && lead <= 0xf4) {
    // F0 needs 90..BF (no overlong form); F4 needs 80..8F (at most U+10FFFF).
    const uint8_t low = lead == 0xf0 ? 0x90 : 0x80;
    const uint8_t high = lead == 0xf4 ? 0x8f : 0xbf;
    return continuation(1, low, high) && continuation(2) && continuation(3) ? 4 : 0;
  }
  return 0;
}

}  // namespace

size_t FirstInvalidUtf8(absl::string_view bytes) {
  size_t i = 0;
  while (i < bytes.size()) {
    const size_t n = Utf8SequenceLength(bytes.substr(i));
    if (n == 0) return i;
    i += n;
  }
  return bytes.size();
}

absl::Status ValidateName(absl::string_view kind, absl::string_view name) {
  const auto invalid = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat(kind, " name ", Quote(name), ": ", why));
  };
  if (name.empty()) return invalid("name is empty");
  if (name.size() > kMaxNameBytes) {
    return invalid(absl::StrCat("name is ", name.size(), " bytes long, the limit is ",
                                kMaxNameBytes, " bytes"));
  }
  if (const size_t nul = name.find('\0'); nul != absl::string_view::npos) {
    return invalid(absl::StrCat("name holds a NUL byte at offset ", nul));
  }
  if (const size_t bad = FirstInvalidUtf8(name); bad != name.size()) {
    return invalid(absl::StrFormat("name is not valid UTF-8 (byte 0x%02x at offset %d)",
                                   static_cast<uint8_t>(name[bad]), bad));
  }
  return absl::OkStatus();
}

}  // namespace pserver
