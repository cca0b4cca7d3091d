// TokenFile: the bearer tokens a server accepts (--auth_tokens_file), one a
// line:
//
//   # role job token
//   trainer job-a 3f9c0e5b8d7a41f2a6b0c4d9e8f71234
//   reader  job-a 0a1b2c3d4e5f60718293a4b5c6d7e8f9
//
// Blank lines and lines starting with '#' are skipped. A token is at least
// kMinTokenBytes printable characters without spaces; tokens are unique.
// The file is re-read when it changes (its modification time, size or inode:
// write a new file and rename it over the old one), looked at no more than
// once per kTokenFileCheckInterval (not on every call); a changed file that
// does not parse is logged and the tokens read before stay in force.
//
//   PS_ASSIGN_OR_RETURN(auto tokens, TokenFile::Load("/etc/pserver/tokens"));
//   absl::StatusOr<Principal> who = tokens->Find(presented);
//
// Tokens are compared in constant time (OpenSSL's CRYPTO_memcmp): each
// lookup compares the presented token with every token of the file.
//
// Thread-safe.
#ifndef PSERVER_CC_AUTH_TOKEN_FILE_H_
#define PSERVER_CC_AUTH_TOKEN_FILE_H_

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/auth/role.h"

namespace pserver {

inline constexpr size_t kMinTokenBytes = 16;
inline constexpr size_t kMaxTokenBytes = 512;
// How often, at most, Find looks whether the file changed.
inline constexpr absl::Duration kTokenFileCheckInterval = absl::Seconds(1);

struct TokenEntry {
  Principal principal;
  std::string token;
};

// The entries of a tokens file's text; INVALID_ARGUMENT naming the line and
// what is wrong with it (role, token length, a repeated token).
absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text);

// "" when `token` may be a token (kMinTokenBytes to kMaxTokenBytes printable
// characters, no spaces); what is wrong with it otherwise.
std::string TokenProblem(absl::string_view token);

// Whether `a` equals `b`, in time that depends only on `b`'s length.
bool ConstantTimeEquals(absl::string_view a, absl::string_view b);

class TokenFile {
 public:
  using Clock = std::function<absl::Time()>;

  // Reads `path`; NOT_FOUND or INVALID_ARGUMENT naming the file and line.
  // `clock` times the checks for changes (tests pass their own).
  static absl::StatusOr<std::unique_ptr<TokenFile>> Load(const std::string& path,
                                                         Clock clock = absl::Now);

  // The principal `token` belongs to (re-reading the file first if it
  // changed and kTokenFileCheckInterval has passed since the last look);
  // UNAUTHENTICATED when none.
  absl::StatusOr<Principal> Find(absl::string_view token);

  // Times the file was read (1 after Load) and looked at (stat), for tests.
  int reads() const;
  int checks() const;

 private:
  struct Signature {
    int64_t mtime_nanos = 0;
    int64_t size = -1;
    uint64_t inode = 0;
    bool operator==(const Signature& o) const {
      return mtime_nanos == o.mtime_nanos && size == o.size && inode == o.inode;
    }
  };
  TokenFile(std::string path, Clock clock) : path_(std::move(path)), clock_(std::move(clock)) {}
  absl::StatusOr<Signature> Stat() const;
  // Re-reads the file if its signature changed, once the interval since
  // the last look has passed.
  void Refresh();
  absl::Status Read(const Signature& signature) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::string path_;
  const Clock clock_;
  mutable absl::Mutex mu_;
  Signature signature_ ABSL_GUARDED_BY(mu_);
  std::vector<TokenEntry> entries_ ABSL_GUARDED_BY(mu_);
  absl::Time next_check_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  int reads_ ABSL_GUARDED_BY(mu_) = 0;
  int checks_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_AUTH_TOKEN_FILE_H_
