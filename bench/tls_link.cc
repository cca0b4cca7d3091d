// The tls group's client (bench/tls_group.h): push, pull and push+pull of one
// float32 parameter per size against the servers named, over mutual TLS when
// the --tls_* flags are set, plaintext otherwise (with or without the bulk
// channel). Prints one DriverResult (results.proto) JSON line per op and
// size: GB/s of parameter bytes per repetition (warm-up included first).
//
//   tls_link --servers=10.213.0.1:7000 --sizes=4096,1048576 --repetitions=6 \
//            --tls_cert=trainer.pem --tls_key=trainer.key --tls_ca=ca.pem
#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "results.pb.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every server, in index order.");
ABSL_FLAG(std::string, sizes, "4096", "Comma-separated parameter sizes in bytes.");
ABSL_FLAG(int, repetitions, 6, "Repetitions per op and size (warm-up included).");
ABSL_FLAG(uint64_t, bytes_per_repetition, uint64_t{128} << 20,
          "Parameter bytes moved per repetition (at most 2000 operations).");
ABSL_FLAG(bool, bulk_channel, true, "Use the servers' bulk channel (over TLS with --tls_*).");
ABSL_FLAG(std::string, tls_cert, "", "This client's PEM certificate (TLS when set).");
ABSL_FLAG(std::string, tls_key, "", "Its PEM private key.");
ABSL_FLAG(std::string, tls_ca, "", "The PEM CA the servers' certificates chain to.");
ABSL_FLAG(bool, tls_bulk_aead, true,
          "Ask for the bulk channel's AEAD layer (servers offer it unless "
          "--tls_bulk_aead=false); false: TLS records.");
ABSL_FLAG(std::string, ops, "push,pull,pushpull",
          "Comma-separated ops to measure (push, pull, pushpull), e.g. push alone to profile it.");
ABSL_FLAG(int, channels_per_server, 2, "Connections per server (ClientOptions::channels_per_server).");

namespace pserver::bench {
namespace {

constexpr int kMaxOpsPerRepetition = 2000;

absl::Status PrintResult(const std::string& op, uint64_t bytes, const std::vector<double>& gbps) {
  DriverResult result;
  result.set_op(op);
  result.set_payload_bytes(bytes);
  for (double v : gbps) result.add_values(v);
  std::string line;
  if (!google::protobuf::util::MessageToJsonString(result, &line).ok()) {
    return absl::InternalError("cannot print the DriverResult");
  }
  std::printf("%s\n", line.c_str());
  std::fflush(stdout);
  return absl::OkStatus();
}

// GB/s of parameter bytes for each repetition of `op_once`.
absl::StatusOr<std::vector<double>> Repeat(uint64_t bytes,
                                           const std::function<absl::Status()>& op_once) {
  const uint64_t ops = std::clamp<uint64_t>(
      absl::GetFlag(FLAGS_bytes_per_repetition) / bytes, 1, kMaxOpsPerRepetition);
  std::vector<double> gbps;
  for (int rep = 0; rep < absl::GetFlag(FLAGS_repetitions); ++rep) {
    const absl::Time start = absl::Now();
    for (uint64_t i = 0; i < ops; ++i) PS_RETURN_IF_ERROR(op_once());
    const double seconds = absl::ToDoubleSeconds(absl::Now() - start);
    gbps.push_back(static_cast<double>(bytes * ops) / seconds / 1e9);
  }
  return gbps;
}

absl::Status Run() {
  ClientOptions options;
  options.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  options.bulk_channel = absl::GetFlag(FLAGS_bulk_channel);
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls.bulk_aead = absl::GetFlag(FLAGS_tls_bulk_aead);
  options.channels_per_server = absl::GetFlag(FLAGS_channels_per_server);
  options.timeout = absl::Minutes(2);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  std::vector<uint64_t> sizes;
  for (absl::string_view size : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',', absl::SkipEmpty())) {
    uint64_t bytes = 0;
    if (!absl::SimpleAtoi(size, &bytes) || bytes < 4) {
      return absl::InvalidArgumentError(absl::StrCat("bad size '", size, "'"));
    }
    sizes.push_back(bytes);
  }
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(0);
  for (uint64_t bytes : sizes) {
    const absl::Status init = client->InitParam(
        absl::StrCat("p", bytes), Tensor::FromValues<float>({static_cast<int64_t>(bytes / 4)},
                                                            std::vector<float>(bytes / 4, 1.0f)),
        sgd);
    if (!init.ok() && init.code() != absl::StatusCode::kAlreadyExists) return init;
  }
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  const std::vector<std::string> ops = absl::StrSplit(absl::GetFlag(FLAGS_ops), ',', absl::SkipEmpty());
  for (const std::string& op : ops) {
    if (op != "push" && op != "pull" && op != "pushpull") {
      return absl::InvalidArgumentError(absl::StrCat("bad op '", op, "' (push, pull or pushpull)"));
    }
  }
  auto wanted = [&](const char* op) { return std::find(ops.begin(), ops.end(), op) != ops.end(); };
  for (uint64_t bytes : sizes) {
    const std::string name = absl::StrCat("p", bytes);
    const Tensor grad =
        Tensor::FromValues<float>({static_cast<int64_t>(bytes / 4)},
                                  std::vector<float>(bytes / 4, 0.5f));
    Tensor out = grad;
    const std::string names[] = {name};
    if (wanted("push")) {
      PS_ASSIGN_OR_RETURN(auto push, Repeat(bytes, [&] { return client->SendGrad(name, grad); }));
      PS_RETURN_IF_ERROR(PrintResult("push", bytes, push));
    }
    if (wanted("pull")) {
      PS_ASSIGN_OR_RETURN(auto pull, Repeat(bytes, [&] {
                            return client->GetParamsInto(names, absl::MakeSpan(&out, 1));
                          }));
      PS_RETURN_IF_ERROR(PrintResult("pull", bytes, pull));
    }
    if (wanted("pushpull")) {
      PS_ASSIGN_OR_RETURN(auto pushpull,
                          Repeat(bytes, [&] { return client->PushPull(name, grad, &out); }));
      PS_RETURN_IF_ERROR(PrintResult("pushpull", bytes, pushpull));
    }
  }
  return absl::OkStatus();
}

}  // namespace
}  // namespace pserver::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (absl::Status status = pserver::bench::Run(); !status.ok()) {
    std::fprintf(stderr, "tls_link: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
