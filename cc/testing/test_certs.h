// Test certificates made at test time with the `openssl` CLI, never committed:
// certificate authorities, and server and client certificates they sign
// (common name, DNS/IP/URI subject alternative names, validity window,
// expired ones). Everything lives in a fresh directory under $TEST_TMPDIR
// (/tmp outside Bazel) that the TestCerts object removes when destroyed.
//
//   PS_ASSIGN_OR_RETURN(auto certs, TestCerts::Create());
//   PS_ASSIGN_OR_RETURN(TestCa* ca, certs->AddCa("ca"));
//   CertRequest server;
//   server.common_name = "pserver-0";
//   server.dns_names = {"localhost"};
//   server.ip_addresses = {"127.0.0.1"};
//   PS_ASSIGN_OR_RETURN(CertFiles files, ca->Issue("server", server));
//   // files.cert, files.key: PEM paths; ca->cert_path(): the CA's PEM
//   PS_ASSIGN_OR_RETURN(CertFiles old, ca->Issue("old", CertRequest::Expired("trainer-1")));
//
// Keys are ECDSA P-256; every leaf certificate may serve as both a TLS server
// and a TLS client (extendedKeyUsage serverAuth, clientAuth). Not thread-safe.
#ifndef PSERVER_CC_TESTING_TEST_CERTS_H_
#define PSERVER_CC_TESTING_TEST_CERTS_H_

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pserver {

// What a certificate says about its holder, and when it is valid.
struct CertRequest {
  std::string common_name;                // the subject's CN; must not be empty
  std::vector<std::string> dns_names;     // subjectAltName DNS:...
  std::vector<std::string> ip_addresses;  // subjectAltName IP:...
  std::vector<std::string> uris;          // subjectAltName URI:... (e.g. "pserver://job-a/trainer")
  // Valid from `not_before` (default: an hour ago) for `valid_for`.
  std::optional<absl::Time> not_before;
  absl::Duration valid_for = absl::Hours(48);

  // A certificate for `common_name` that expired yesterday.
  static CertRequest Expired(const std::string& common_name);
};

// A certificate and its private key, PEM files.
struct CertFiles {
  std::string cert;
  std::string key;
};

// A self-signed certificate authority in its own subdirectory.
class TestCa {
 public:
  // The CA's certificate (PEM): what a peer trusts (--tls_ca).
  const std::string& cert_path() const { return cert_path_; }
  const std::string& name() const { return name_; }

  // Signs a new key and certificate, written to <dir>/<stem>.pem and
  // <dir>/<stem>.key (replacing earlier files of that stem). INVALID_ARGUMENT
  // for an empty CN or a stem that is not a plain file name; INTERNAL quoting
  // openssl's output when it fails.
  absl::StatusOr<CertFiles> Issue(const std::string& stem, const CertRequest& request);

 private:
  friend class TestCerts;
  TestCa(std::string dir, std::string name, std::string openssl);

  std::string dir_;
  std::string name_;
  std::string openssl_;
  std::string cert_path_;
  std::string key_path_;
  std::string config_path_;
};

// The directory, and the CAs made in it.
class TestCerts {
 public:
  // Makes the directory; NOT_FOUND when `openssl` is not installed.
  static absl::StatusOr<std::unique_ptr<TestCerts>> Create();
  // Works in `dir`, an existing directory that is kept when this object
  // goes (the test_cert_tool binary, which Python tests call).
  static absl::StatusOr<std::unique_ptr<TestCerts>> InDirectory(const std::string& dir);
  ~TestCerts();  // removes the directory and everything in it
  TestCerts(const TestCerts&) = delete;
  TestCerts& operator=(const TestCerts&) = delete;

  const std::string& dir() const { return dir_; }

  // A new CA whose certificate has CN `name` (valid for `valid_for` from an
  // hour ago); owned by this object. INVALID_ARGUMENT for a name that is not
  // a plain file name or one already used.
  absl::StatusOr<TestCa*> AddCa(const std::string& name,
                                absl::Duration valid_for = absl::Hours(48));

  // The CA `name` that AddCa made in dir() earlier (by this object or
  // another). NOT_FOUND when there is none.
  absl::StatusOr<TestCa*> FindCa(const std::string& name);

  // Writes `contents` to <dir>/<name> and returns its path (e.g. a file that
  // is not a key, for error tests).
  absl::StatusOr<std::string> WriteFile(const std::string& name, const std::string& contents);

 private:
  TestCerts(std::string dir, std::string openssl, bool owned = true)
      : dir_(std::move(dir)), openssl_(std::move(openssl)), owned_(owned) {}

  std::string dir_;
  std::string openssl_;
  bool owned_;  // removed by the destructor
  std::vector<std::unique_ptr<TestCa>> cas_;
};

// Copies `from` over `to` atomically (write to a temporary file beside it,
// then rename), as a deployment rotating certificates should.
absl::Status ReplaceFile(const std::string& from, const std::string& to);

}  // namespace pserver

#endif  // PSERVER_CC_TESTING_TEST_CERTS_H_
