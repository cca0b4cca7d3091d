// The worker of e2e's `hosts` group, run by it inside a network namespace
// (cc/testing/netns.h): push+pull of one dense parameter against servers
// given by address, in time-boxed rounds that every worker of the run shares
// (steady clock, which namespaces do not change), so that the rounds of all
// workers add up to the aggregate throughput.
//
//   hosts_worker --servers=10.213.0.1:7000,... --init --params=a,b --bytes=4194304
//   hosts_worker --servers=... --params=a --bytes=4194304 --start_at=1234.5
//                --round_seconds=2 --rounds=4
//
// With --init it creates the parameters (SGD, tiny learning rate) and
// finishes initialization, then exits. Otherwise it prints one DriverResult
// (bench/results.proto) line: op "pushpull", values = payload GB/s of each
// round (the payload counted once, as the dense group does); an operation
// counts in the round in which it completes.
#include <chrono>
#include <cstdio>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "google/protobuf/util/json_util.h"
#include "results.pb.h"

ABSL_FLAG(std::string, servers, "", "Comma-separated host:port of every server, in index order.");
ABSL_FLAG(std::string, params, "", "Comma-separated parameter names (this worker uses the first).");
ABSL_FLAG(uint64_t, bytes, 4 << 20, "Bytes of each parameter.");
ABSL_FLAG(bool, init, false, "Create the parameters and finish initialization, then exit.");
ABSL_FLAG(double, start_at, 0, "Steady-clock second at which round 0 begins.");
ABSL_FLAG(double, round_seconds, 2, "Length of each round.");
ABSL_FLAG(int, rounds, 4, "Rounds (the caller treats the first as warm-up).");
ABSL_FLAG(int, bulk_unsent_bytes, -1,
          "ClientOptions::bulk_unsent_bytes (0: the kernel's default); -1: the option's default.");

namespace pserver::bench {
namespace {

constexpr int kMaxRounds = 1000;
constexpr double kMaxRoundSeconds = 600;

double SteadySeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Tensor Filled(uint64_t bytes, float value) {
  const int64_t n = static_cast<int64_t>(bytes / sizeof(float));
  return Tensor::FromValues<float>({n}, std::vector<float>(n, value));
}

absl::Status Init(Client& client, const std::vector<std::string>& params, uint64_t bytes) {
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd();
  sgd.mutable_learning_rate()->set_learning_rate(1e-9);
  for (const std::string& name : params) {
    PS_RETURN_IF_ERROR(client.InitParam(name, Filled(bytes, 1.0f), sgd));
  }
  return client.FinishInitParams();
}

absl::Status Rounds(Client& client, const std::string& name, uint64_t bytes) {
  const double start_at = absl::GetFlag(FLAGS_start_at);
  const double round_seconds = absl::GetFlag(FLAGS_round_seconds);
  const int rounds = absl::GetFlag(FLAGS_rounds);
  if (rounds < 1 || rounds > kMaxRounds || round_seconds <= 0 ||
      round_seconds > kMaxRoundSeconds) {
    return absl::InvalidArgumentError(
        absl::StrCat("--rounds must be 1 to ", kMaxRounds, " and --round_seconds in (0, ",
                     kMaxRoundSeconds, "]"));
  }
  const Tensor grad = Filled(bytes, 0.5f);
  Tensor out;
  PS_RETURN_IF_ERROR(client.PushPull(name, grad, &out));  // connected and warm
  // A worker ready late (a loaded machine) starts at once: the rounds it
  // missed count what it moved in them, so the aggregate is a lower bound
  // then; it says so on stderr rather than failing the run.
  const double late = SteadySeconds() - start_at;
  if (late > 0) {
    std::fprintf(stderr, "hosts_worker: ready %.3f s after --start_at; the first rounds "
                 "count less\n", late);
  } else {
    std::this_thread::sleep_for(std::chrono::duration<double>(-late));
  }
  std::vector<double> moved(rounds, 0);
  while (true) {
    PS_RETURN_IF_ERROR(client.PushPull(name, grad, &out));
    const int round = static_cast<int>((SteadySeconds() - start_at) / round_seconds);
    if (round >= rounds) break;
    moved[round] += static_cast<double>(bytes);
  }
  DriverResult result;
  result.set_op("pushpull");
  result.set_payload_bytes(bytes);
  for (double b : moved) result.add_values(b / round_seconds / 1e9);
  std::string line;
  if (!google::protobuf::util::MessageToJsonString(result, &line).ok()) {
    return absl::InternalError("cannot print the DriverResult");
  }
  std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

absl::Status Run() {
  const std::vector<std::string> params =
      absl::StrSplit(absl::GetFlag(FLAGS_params), ',', absl::SkipEmpty());
  ClientOptions options;
  options.servers = absl::StrSplit(absl::GetFlag(FLAGS_servers), ',', absl::SkipEmpty());
  options.timeout = absl::Seconds(60);
  if (const int unsent = absl::GetFlag(FLAGS_bulk_unsent_bytes); unsent >= 0) {
    options.bulk_unsent_bytes = unsent;
  }
  if (params.empty() || options.servers.empty()) {
    return absl::InvalidArgumentError("--servers and --params are required");
  }
  const uint64_t bytes = absl::GetFlag(FLAGS_bytes);
  PS_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
  if (absl::GetFlag(FLAGS_init)) return Init(*client, params, bytes);
  return Rounds(*client, params[0], bytes);
}

}  // namespace
}  // namespace pserver::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pserver::bench::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "hosts_worker: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
