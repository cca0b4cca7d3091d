// What tracing costs a client call: round trips of a 4 KiB SendGrad to one
// pserver in this process (gRPC or the bulk channel, 127.0.0.1), without
// and with ClientOptions::trace_file, and the recorder's own cost per event.
//   bazel run -c opt //bench:trace_bench [-- --calls=20000]
// Figures only: nothing is asserted.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/synchronization/mutex.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "cc/core/tensor.h"
#include "cc/server/server.h"
#include "cc/trace/trace.h"

ABSL_FLAG(int, calls, 20000, "SendGrad calls per measurement.");
ABSL_FLAG(int, rounds, 3, "Measurements per setting (alternating off and on).");
ABSL_FLAG(std::string, trace, "both", "off, on or both (alternating): which settings to measure.");

namespace pserver {
namespace {

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "%s\n", status.ToString().c_str());
  return 1;
}

// Median-free, simple: microseconds per call over `calls` calls.
absl::StatusOr<double> MicrosPerCall(const std::string& address, const std::string& trace_file,
                                     int calls) {
  ClientOptions options;
  options.servers = {address};
  options.trace_file = trace_file;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  const Tensor grad = Tensor::FromValues<float>({1024}, std::vector<float>(1024, 0.0f));
  for (int i = 0; i < 200; ++i) PS_RETURN_IF_ERROR(client->SendGrad("w", grad));  // warm up
  const absl::Time start = absl::Now();
  for (int i = 0; i < calls; ++i) PS_RETURN_IF_ERROR(client->SendGrad("w", grad));
  return absl::ToDoubleMicroseconds(absl::Now() - start) / calls;
}

int Main() {
  const int calls = absl::GetFlag(FLAGS_calls);
  const std::string dir = std::getenv("TMPDIR") != nullptr ? std::getenv("TMPDIR") : "/tmp";
  // The recorder alone: one span with arguments, as a request records it.
  {
    trace::RecorderOptions options;
    options.path = absl::StrCat(dir, "/trace_bench_recorder.json");
    auto recorder = trace::Recorder::Open(options);
    if (!recorder.ok()) return Fail(recorder.status());
    constexpr int kEvents = 1000000;
    const absl::Time start = absl::Now();
    for (int i = 0; i < kEvents; ++i) {
      const int64_t now = trace::NowMicros();
      (*recorder)->Complete("SendGrads", "request", now, now + 1, 7,
                            trace::Args().Add("call", i).Add("server", int64_t{0}).Add("address", "127.0.0.1:1")
                                .Add("status", "OK").json());
    }
    std::printf("recorder: %.0f ns per span with arguments (ring of %zu)\n",
                absl::ToDoubleNanoseconds(absl::Now() - start) / kEvents, options.max_events);
  }
  auto server = Server::Start(ServerOptions());
  if (!server.ok()) return Fail(server.status());
  {
    ClientOptions options;
    options.servers = {(*server)->address()};
    auto client = Client::Connect(options);
    if (!client.ok()) return Fail(client.status());
    absl::Status init = (*client)->InitParam(
        "w", Tensor::FromValues<float>({1024}, std::vector<float>(1024, 0.0f)));
    if (init.ok()) init = (*client)->FinishInitParams();
    if (!init.ok()) return Fail(init);
  }
  const std::string file = absl::StrCat(dir, "/trace_bench_client.json");
  for (int round = 0; round < absl::GetFlag(FLAGS_rounds); ++round) {
    for (const bool on : {false, true}) {
      const std::string which = absl::GetFlag(FLAGS_trace);
      if (which != "both" && which != (on ? "on" : "off")) continue;
      absl::StatusOr<double> us = MicrosPerCall((*server)->address(), on ? file : "", calls);
      if (!us.ok()) return Fail(us.status());
      std::printf("SendGrad 4 KiB, trace %-3s: %.1f us per call\n", on ? "on" : "off", *us);
    }
  }
  return 0;
}

}  // namespace
}  // namespace pserver

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  // As the pserver binary and bench/e2e run: no lock-order graph per lock.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  return pserver::Main();
}
