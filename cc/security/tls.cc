#include "cc/security/tls.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <utility>
#include <vector>

#include <openssl/bio.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "cc/core/status_macros.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"
#include "grpcpp/security/tls_certificate_provider.h"
#include "grpcpp/security/tls_certificate_verifier.h"
#include "grpcpp/security/tls_credentials_options.h"
#include "grpcpp/support/channel_arguments.h"

namespace pserver {
namespace {

struct TlsFile {
  const char* option;        // "cert"
  const std::string* path;   // the file named
  const char* pem_marker;    // what it must hold
  const char* what;          // in messages
};

// NOT_FOUND / INVALID_ARGUMENT naming the option and the file when it cannot
// be read or holds no `pem_marker` block.
absl::Status CheckPemFile(const TlsFile& file, const std::string& prefix) {
  std::ifstream in(*file.path, std::ios::binary);
  if (!in) {
    const int error = errno;
    const std::string why = std::strerror(error);
    const std::string message = absl::StrCat("--", prefix, file.option, " '", *file.path,
                                             "' cannot be read: ", why);
    return error == ENOENT ? absl::NotFoundError(message) : absl::InvalidArgumentError(message);
  }
  std::stringstream contents;
  contents << in.rdbuf();
  if (!absl::StrContains(contents.str(), file.pem_marker)) {
    return absl::InvalidArgumentError(absl::StrCat("--", prefix, file.option, " '", *file.path,
                                                   "' holds no PEM ", file.what, " (no '",
                                                   file.pem_marker, "' line)"));
  }
  return absl::OkStatus();
}

struct X509Free {
  void operator()(X509* x) const { X509_free(x); }
};
struct PkeyFree {
  void operator()(EVP_PKEY* k) const { EVP_PKEY_free(k); }
};
struct BioFree {
  void operator()(BIO* b) const { BIO_free(b); }
};

// "Nov 24 07:00:00 2026 GMT"
std::string AsnTimeText(const ASN1_TIME* time) {
  std::unique_ptr<BIO, BioFree> bio(BIO_new(BIO_s_mem()));
  if (bio == nullptr || ASN1_TIME_print(bio.get(), time) != 1) return "?";
  char* data = nullptr;
  const long size = BIO_get_mem_data(bio.get(), &data);
  return std::string(data, size > 0 ? size : 0);
}

// The certificate must be valid now and `key` must be its private key:
// either mistake would otherwise surface only as a failed handshake.
absl::Status CheckCertificateAndKey(const TlsOptions& options, const std::string& prefix) {
  std::unique_ptr<BIO, BioFree> cert_bio(BIO_new_file(options.cert.c_str(), "r"));
  std::unique_ptr<X509, X509Free> cert(
      cert_bio ? PEM_read_bio_X509(cert_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (cert == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", prefix, "cert '", options.cert, "' is not a PEM certificate"));
  }
  if (X509_cmp_current_time(X509_get0_notAfter(cert.get())) <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("--", prefix, "cert '", options.cert,
                                                   "' expired on ",
                                                   AsnTimeText(X509_get0_notAfter(cert.get()))));
  }
  if (X509_cmp_current_time(X509_get0_notBefore(cert.get())) > 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", prefix, "cert '", options.cert, "' is not valid before ",
                     AsnTimeText(X509_get0_notBefore(cert.get()))));
  }
  std::unique_ptr<BIO, BioFree> key_bio(BIO_new_file(options.key.c_str(), "r"));
  std::unique_ptr<EVP_PKEY, PkeyFree> key(
      key_bio ? PEM_read_bio_PrivateKey(key_bio.get(), nullptr, nullptr, nullptr) : nullptr);
  if (key == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", prefix, "key '", options.key, "' is not an unencrypted PEM private key"));
  }
  if (X509_check_private_key(cert.get(), key.get()) != 1) {
    return absl::InvalidArgumentError(absl::StrCat("--", prefix, "key '", options.key,
                                                   "' is not the private key of --", prefix,
                                                   "cert '", options.cert, "'"));
  }
  return absl::OkStatus();
}

unsigned int ReloadSeconds(const TlsOptions& options) {
  return static_cast<unsigned int>(
      std::clamp<int64_t>(absl::ToInt64Seconds(options.reload_interval), 1, 86400));
}

std::shared_ptr<grpc::experimental::CertificateProviderInterface> FileWatcher(
    const TlsOptions& options) {
  return std::make_shared<grpc::experimental::FileWatcherCertificateProvider>(
      options.key, options.cert, options.ca, ReloadSeconds(options));
}

}  // namespace

absl::Status CheckTlsOptions(const TlsOptions& options, const std::string& prefix) {
  if (!options.enabled()) {
    if (!options.server_name.empty()) {
      return absl::InvalidArgumentError(absl::StrCat("--", prefix, "server_name is set but TLS "
                                                     "is off: also set --", prefix, "cert, --",
                                                     prefix, "key and --", prefix, "ca"));
    }
    return absl::OkStatus();
  }
  const TlsFile files[] = {
      {"cert", &options.cert, "-----BEGIN CERTIFICATE-----", "certificate"},
      {"key", &options.key, "PRIVATE KEY-----", "private key"},
      {"ca", &options.ca, "-----BEGIN CERTIFICATE-----", "CA certificate"}};
  std::vector<std::string> missing;
  for (const TlsFile& file : files) {
    if (file.path->empty()) missing.push_back(absl::StrCat("--", prefix, file.option));
  }
  if (!missing.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "TLS needs --", prefix, "cert, --", prefix, "key and --", prefix,
        "ca together; missing: ", absl::StrJoin(missing, ", ")));
  }
  for (const TlsFile& file : files) {
    if (absl::Status status = CheckPemFile(file, prefix); !status.ok()) return status;
  }
  PS_RETURN_IF_ERROR(CheckCertificateAndKey(options, prefix));
  if (options.reload_interval < absl::Seconds(1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--", prefix, "reload_interval must be at least 1s, got ",
                     absl::FormatDuration(options.reload_interval)));
  }
  return absl::OkStatus();
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const TlsOptions& options) {
  grpc::experimental::TlsServerCredentialsOptions tls(FileWatcher(options));
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_cert_request_type(GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  return grpc::experimental::TlsServerCredentials(tls);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const TlsOptions& options) {
  if (!options.enabled()) return grpc::InsecureChannelCredentials();
  grpc::experimental::TlsChannelCredentialsOptions tls;
  tls.set_certificate_provider(FileWatcher(options));
  tls.watch_root_certs();
  tls.watch_identity_key_cert_pairs();
  tls.set_verify_server_certs(true);
  tls.set_certificate_verifier(
      std::make_shared<grpc::experimental::HostNameCertificateVerifier>());
  return grpc::experimental::TlsCredentials(tls);
}

void AddTlsChannelArguments(const TlsOptions& options, grpc::ChannelArguments* args) {
  if (options.enabled() && !options.server_name.empty()) {
    args->SetSslTargetNameOverride(options.server_name);
  }
}

std::string DescribeTlsFailure(absl::string_view grpc_message, bool tls) {
  const bool connecting = absl::StrContains(grpc_message, "failed to connect");
  const bool closed = absl::StrContains(grpc_message, "Socket closed") ||
                      absl::StrContains(grpc_message, "Connection reset");
  if (!tls) {
    if (connecting && closed) {
      return "the server closed the connection at once: if it requires TLS, give this client "
             "a TLS certificate, key and CA";
    }
    return "";
  }
  if (absl::StrContains(grpc_message, "wrong version number")) {
    return "TLS handshake failed: the server does not speak TLS (plaintext server)";
  }
  if (absl::StrContains(grpc_message, "Hostname Verification Check failed")) {
    return "TLS: the server's certificate does not name the host dialled (set the client's "
           "TLS server name to one it carries)";
  }
  if (absl::StrContains(grpc_message, "certificate verify failed")) {
    return "TLS: the server's certificate is not signed by this client's CA, or has expired";
  }
  if (connecting && closed) {
    return "TLS: the server refused this client's certificate (signed by a CA the server "
           "does not trust, expired or not yet valid)";
  }
  return "";
}

}  // namespace pserver
