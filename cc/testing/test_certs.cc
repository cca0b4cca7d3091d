#include "cc/testing/test_certs.h"

#include <stdio.h>
#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/core/status_macros.h"
#include "cc/testing/run_program.h"

namespace pserver {
namespace {

constexpr absl::Duration kOpensslTimeout = absl::Seconds(60);

// `openssl ca` needs a config naming its database; every leaf may be a
// server and a client.
constexpr char kCaConfig[] = R"([ca]
default_ca = ca_default
[ca_default]
database = index.txt
new_certs_dir = .
serial = serial
default_md = sha256
policy = policy_any
unique_subject = no
[policy_any]
commonName = supplied
)";

bool IsPlainName(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos && name != "." && name != "..";
}

absl::Status WriteText(const std::string& path, const std::string& contents) {
  std::ofstream out(path, std::ios::trunc);
  out << contents;
  out.close();
  if (!out) return absl::InternalError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// openssl's date format: 20200101000000Z.
std::string OpensslDate(absl::Time t) {
  return absl::FormatTime("%Y%m%d%H%M%SZ", t, absl::UTCTimeZone());
}

std::string SubjectAltNames(const CertRequest& request) {
  std::vector<std::string> names;
  for (const std::string& dns : request.dns_names) names.push_back(absl::StrCat("DNS:", dns));
  for (const std::string& ip : request.ip_addresses) names.push_back(absl::StrCat("IP:", ip));
  for (const std::string& uri : request.uris) names.push_back(absl::StrCat("URI:", uri));
  return absl::StrJoin(names, ",");
}

absl::Status RunOpenssl(const std::string& openssl, const std::vector<std::string>& args) {
  return RunProgram(openssl, args, absl::Now() + kOpensslTimeout).status();
}

// openssl resolves the config's relative paths against the working
// directory, so every `openssl ca` runs through `sh -c "cd dir && ..."`.
absl::Status RunOpensslIn(const std::string& dir, const std::string& openssl,
                          const std::vector<std::string>& args) {
  std::vector<std::string> quoted;
  for (const std::string& arg : args) quoted.push_back(absl::StrCat("'", arg, "'"));
  const std::string script = absl::StrCat("cd '", dir, "' && '", openssl, "' ",
                                          absl::StrJoin(quoted, " "));
  PS_ASSIGN_OR_RETURN(std::string sh, FindProgram("sh"));
  return RunProgram(sh, {"-c", script}, absl::Now() + kOpensslTimeout).status();
}

const std::vector<std::string> kNewEcKey = {"-newkey", "ec", "-pkeyopt",
                                            "ec_paramgen_curve:prime256v1", "-nodes"};

}  // namespace

CertRequest CertRequest::Expired(const std::string& common_name) {
  CertRequest request;
  request.common_name = common_name;
  request.not_before = absl::Now() - absl::Hours(48);
  request.valid_for = absl::Hours(24);
  return request;
}

TestCa::TestCa(std::string dir, std::string name, std::string openssl)
    : dir_(std::move(dir)),
      name_(std::move(name)),
      openssl_(std::move(openssl)),
      cert_path_(dir_ + "/ca.pem"),
      key_path_(dir_ + "/ca.key"),
      config_path_(dir_ + "/ca.cnf") {}

absl::StatusOr<CertFiles> TestCa::Issue(const std::string& stem, const CertRequest& request) {
  if (!IsPlainName(stem)) {
    return absl::InvalidArgumentError(absl::StrCat("certificate stem '", stem,
                                                   "' must be a plain file name"));
  }
  if (request.common_name.empty()) {
    return absl::InvalidArgumentError("a certificate request needs a common_name");
  }
  CertFiles files{absl::StrCat(dir_, "/", stem, ".pem"), absl::StrCat(dir_, "/", stem, ".key")};
  const std::string csr = absl::StrCat(dir_, "/", stem, ".csr");
  const std::string ext = absl::StrCat(dir_, "/", stem, ".ext");
  std::vector<std::string> req = {"req", "-new"};
  req.insert(req.end(), kNewEcKey.begin(), kNewEcKey.end());
  req.insert(req.end(), {"-keyout", files.key, "-out", csr, "-subj",
                         absl::StrCat("/CN=", request.common_name)});
  PS_RETURN_IF_ERROR(RunOpenssl(openssl_, req));
  std::string extensions =
      "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
      "extendedKeyUsage=serverAuth,clientAuth\n";
  const std::string sans = SubjectAltNames(request);
  if (!sans.empty()) absl::StrAppend(&extensions, "subjectAltName=", sans, "\n");
  PS_RETURN_IF_ERROR(WriteText(ext, extensions));
  const absl::Time not_before = request.not_before.value_or(absl::Now() - absl::Hours(1));
  PS_RETURN_IF_ERROR(RunOpensslIn(
      dir_, openssl_,
      {"ca", "-batch", "-config", config_path_, "-cert", cert_path_, "-keyfile", key_path_,
       "-in", csr, "-out", files.cert, "-notext", "-startdate", OpensslDate(not_before),
       "-enddate", OpensslDate(not_before + request.valid_for), "-extfile", ext}));
  return files;
}

absl::StatusOr<std::unique_ptr<TestCerts>> TestCerts::Create() {
  PS_ASSIGN_OR_RETURN(std::string openssl, FindProgram("openssl"));
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string pattern = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/certs-XXXXXX");
  if (mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("mkdtemp ", pattern, ": ", std::strerror(errno)));
  }
  return std::unique_ptr<TestCerts>(new TestCerts(pattern, openssl));
}

absl::StatusOr<std::unique_ptr<TestCerts>> TestCerts::InDirectory(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(std::string openssl, FindProgram("openssl"));
  std::error_code error;
  if (!std::filesystem::is_directory(dir, error)) {
    return absl::NotFoundError(absl::StrCat(dir, " is not a directory"));
  }
  return std::unique_ptr<TestCerts>(new TestCerts(dir, openssl, /*owned=*/false));
}

TestCerts::~TestCerts() {
  std::error_code ignored;
  if (owned_) std::filesystem::remove_all(dir_, ignored);
}

absl::StatusOr<TestCa*> TestCerts::FindCa(const std::string& name) {
  for (const std::unique_ptr<TestCa>& ca : cas_) {
    if (ca->name() == name) return ca.get();
  }
  const std::string dir = absl::StrCat(dir_, "/", name);
  std::error_code error;
  if (!IsPlainName(name) || !std::filesystem::is_regular_file(dir + "/ca.cnf", error)) {
    return absl::NotFoundError(absl::StrCat("no CA '", name, "' in ", dir_));
  }
  cas_.push_back(std::unique_ptr<TestCa>(new TestCa(dir, name, openssl_)));
  return cas_.back().get();
}

absl::StatusOr<TestCa*> TestCerts::AddCa(const std::string& name, absl::Duration valid_for) {
  if (!IsPlainName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("CA name '", name,
                                                   "' must be a plain file name"));
  }
  const std::string dir = absl::StrCat(dir_, "/", name);
  std::error_code error;
  if (!std::filesystem::create_directory(dir, error)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot make CA directory ", dir, " (name used already?) ", error.message()));
  }
  auto ca = std::unique_ptr<TestCa>(new TestCa(dir, name, openssl_));
  PS_RETURN_IF_ERROR(WriteText(ca->config_path_, kCaConfig));
  PS_RETURN_IF_ERROR(WriteText(dir + "/index.txt", ""));
  PS_RETURN_IF_ERROR(WriteText(dir + "/serial", "01\n"));
  std::vector<std::string> req = {"req", "-x509"};
  req.insert(req.end(), kNewEcKey.begin(), kNewEcKey.end());
  // Valid from now: peers check each certificate's own window, so leaves
  // dated before it are still accepted.
  req.insert(req.end(),
             {"-keyout", ca->key_path_, "-out", ca->cert_path_, "-days",
              absl::StrCat(std::max<int64_t>(1, absl::ToInt64Hours(valid_for) / 24)), "-subj",
              absl::StrCat("/CN=", name), "-addext", "basicConstraints=critical,CA:TRUE",
              "-addext", "keyUsage=critical,keyCertSign,cRLSign"});
  PS_RETURN_IF_ERROR(RunOpenssl(openssl_, req));
  cas_.push_back(std::move(ca));
  return cas_.back().get();
}

absl::StatusOr<std::string> TestCerts::WriteFile(const std::string& name,
                                                 const std::string& contents) {
  if (!IsPlainName(name)) {
    return absl::InvalidArgumentError(absl::StrCat("file name '", name, "' must be plain"));
  }
  const std::string path = absl::StrCat(dir_, "/", name);
  PS_RETURN_IF_ERROR(WriteText(path, contents));
  return path;
}

absl::Status ReplaceFile(const std::string& from, const std::string& to) {
  const std::string temporary = to + ".replacing";
  std::error_code error;
  std::filesystem::copy_file(from, temporary, std::filesystem::copy_options::overwrite_existing,
                             error);
  if (!error) std::filesystem::rename(temporary, to, error);
  if (error) {
    return absl::InternalError(
        absl::StrCat("cannot replace ", to, " with ", from, ": ", error.message()));
  }
  return absl::OkStatus();
}

}  // namespace pserver
