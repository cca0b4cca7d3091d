#include "cc/auth/token_file.h"

#include <openssl/crypto.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iostream>
#include <sstream>
#include <utility>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

absl::Status BadLine(int line, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("line ", line, ": ", why));
}

}  // namespace

std::string TokenProblem(absl::string_view token) {
  if (token.size() < kMinTokenBytes || token.size() > kMaxTokenBytes) {
    return absl::StrCat("a token has ", kMinTokenBytes, " to ", kMaxTokenBytes,
                        " characters, this one ", token.size());
  }
  for (char c : token) {
    if (!absl::ascii_isgraph(c)) return "a token has printable characters only";
  }
  return "";
}

bool ConstantTimeEquals(absl::string_view a, absl::string_view b) {
  // Every byte of `b` is compared, whatever `a` is.
  if (a.size() != b.size()) {
    CRYPTO_memcmp(b.data(), b.data(), b.size());
    return false;
  }
  return CRYPTO_memcmp(a.data(), b.data(), b.size()) == 0;
}

absl::StatusOr<std::vector<TokenEntry>> ParseTokens(absl::string_view text) {
  std::vector<TokenEntry> entries;
  absl::flat_hash_set<std::string> seen;
  int number = 0;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    ++number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || line[0] == '#') continue;
    std::vector<absl::string_view> fields = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    if (fields.size() != 3) return BadLine(number, "expected 'role job token'");
    absl::StatusOr<Role> role = ParseRole(fields[0]);
    if (!role.ok()) return BadLine(number, role.status().message());
    const std::string problem = TokenProblem(fields[2]);
    if (!problem.empty()) return BadLine(number, problem);
    if (!seen.insert(std::string(fields[2])).second) {
      return BadLine(number, "the token is given twice");
    }
    TokenEntry entry;
    entry.principal.role = *role;
    entry.principal.job = std::string(fields[1]);
    entry.principal.source = "token";
    entry.token = std::string(fields[2]);
    entries.push_back(std::move(entry));
  }
  return entries;
}

absl::StatusOr<std::unique_ptr<TokenFile>> TokenFile::Load(const std::string& path,
                                                          Clock clock) {
  std::unique_ptr<TokenFile> file(new TokenFile(path, std::move(clock)));
  PS_ASSIGN_OR_RETURN(Signature signature, file->Stat());
  absl::MutexLock lock(&file->mu_);
  PS_RETURN_IF_ERROR(file->Read(signature));
  file->next_check_ = file->clock_() + kTokenFileCheckInterval;
  return file;
}

absl::StatusOr<TokenFile::Signature> TokenFile::Stat() const {
  struct stat st;
  if (stat(path_.c_str(), &st) != 0) {
    return absl::NotFoundError(
        absl::StrCat("auth tokens file ", path_, ": ", std::strerror(errno)));
  }
  Signature signature;
  signature.mtime_nanos = int64_t{st.st_mtim.tv_sec} * 1000000000 + st.st_mtim.tv_nsec;
  signature.size = st.st_size;
  signature.inode = st.st_ino;
  return signature;
}

absl::Status TokenFile::Read(const Signature& signature) {
  std::ifstream in(path_);
  std::stringstream text;
  text << in.rdbuf();
  if (!in) {
    return absl::NotFoundError(absl::StrCat("auth tokens file ", path_, " cannot be read"));
  }
  absl::StatusOr<std::vector<TokenEntry>> entries = ParseTokens(text.str());
  if (!entries.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("auth tokens file ", path_, ": ", entries.status().message()));
  }
  entries_ = *std::move(entries);
  signature_ = signature;
  ++reads_;
  return absl::OkStatus();
}

void TokenFile::Refresh() {
  {
    // One caller per interval looks at the file; the others go on with the
    // tokens in force.
    const absl::Time time = clock_();
    absl::MutexLock lock(&mu_);
    if (time < next_check_) return;
    next_check_ = time + kTokenFileCheckInterval;
    ++checks_;
  }
  absl::StatusOr<Signature> now = Stat();
  absl::MutexLock lock(&mu_);
  if (!now.ok()) return;  // gone for a moment (being replaced): keep the tokens
  if (*now == signature_) return;
  absl::Status read = Read(*now);
  if (!read.ok()) {
    // Keep the tokens read before; do not read the file again until it
    // changes once more.
    signature_ = *now;
    std::cerr << "pserver: " << read.message() << "; keeping the tokens read before\n";
  }
}

absl::StatusOr<Principal> TokenFile::Find(absl::string_view token) {
  Refresh();
  absl::MutexLock lock(&mu_);
  const TokenEntry* found = nullptr;
  for (const TokenEntry& entry : entries_) {
    // No early exit: every token is compared.
    if (ConstantTimeEquals(token, entry.token)) found = &entry;
  }
  if (found == nullptr) {
    return absl::UnauthenticatedError("the bearer token is not one this server accepts");
  }
  return found->principal;
}

int TokenFile::reads() const {
  absl::MutexLock lock(&mu_);
  return reads_;
}

int TokenFile::checks() const {
  absl::MutexLock lock(&mu_);
  return checks_;
}

}  // namespace pserver
