// test_cert_tool: cc/testing/test_certs.h from the command line, so that
// tests in other languages (python/tests/tls_certs.py) make their
// certificates with the one generator the C++ tests use.
//
//   test_cert_tool ca DIR NAME
//       a CA in DIR/NAME; prints its certificate's path
//   test_cert_tool issue DIR CA STEM CN [--ip=IP]... [--dns=NAME]... [--expired]
//       a certificate CA signs, DIR/CA/STEM.pem and .key; prints both paths
//
// Exit 0 on success; 2 for a usage error; 1 otherwise, the error on stderr.
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "cc/testing/test_certs.h"

namespace pserver {
namespace {

constexpr char kUsage[] =
    "usage: test_cert_tool ca DIR NAME\n"
    "       test_cert_tool issue DIR CA STEM CN [--ip=IP]... [--dns=NAME]... [--expired]\n";

int Fail(const absl::Status& status) {
  std::cerr << "test_cert_tool: " << status << "\n";
  return 1;
}

int Run(const std::vector<std::string>& args) {
  if (args.size() < 3) {
    std::cerr << kUsage;
    return 2;
  }
  absl::StatusOr<std::unique_ptr<TestCerts>> certs = TestCerts::InDirectory(args[1]);
  if (!certs.ok()) return Fail(certs.status());
  if (args[0] == "ca" && args.size() == 3) {
    absl::StatusOr<TestCa*> ca = (*certs)->AddCa(args[2]);
    if (!ca.ok()) return Fail(ca.status());
    std::cout << (*ca)->cert_path() << "\n";
    return 0;
  }
  if (args[0] != "issue" || args.size() < 5) {
    std::cerr << kUsage;
    return 2;
  }
  absl::StatusOr<TestCa*> ca = (*certs)->FindCa(args[2]);
  if (!ca.ok()) return Fail(ca.status());
  CertRequest request;
  request.common_name = args[4];
  for (size_t i = 5; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (absl::ConsumePrefix(&arg, "--ip=")) {
      request.ip_addresses.emplace_back(arg);
    } else if (absl::ConsumePrefix(&arg, "--dns=")) {
      request.dns_names.emplace_back(arg);
    } else if (arg == "--expired") {
      const CertRequest expired = CertRequest::Expired(request.common_name);
      request.not_before = expired.not_before;
      request.valid_for = expired.valid_for;
    } else {
      std::cerr << "test_cert_tool: unknown argument '" << arg << "'\n" << kUsage;
      return 2;
    }
  }
  absl::StatusOr<CertFiles> files = (*ca)->Issue(args[3], request);
  if (!files.ok()) return Fail(files.status());
  std::cout << files->cert << "\n" << files->key << "\n";
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  return pserver::Run(std::vector<std::string>(argv + 1, argv + argc));
}
