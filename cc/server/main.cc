// pserver: one parameter server process.
//
//   bazel run //:pserver                          # 127.0.0.1, a free port
//   bazel run //:pserver -- --port=7000 --index=1
//
// Prints "pserver <index> listening on <host:port>" once it serves, and stops
// cleanly (exit 0) on SIGINT or SIGTERM.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "cc/server/server.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one.");
ABSL_FLAG(uint32_t, index, 0, "This server's shard index.");
ABSL_FLAG(int, num_threads, 0, "Request threads; 0 means two per core (at least 4).");
ABSL_FLAG(double, shutdown_grace_seconds, 5,
          "On SIGINT/SIGTERM, how long calls in flight may take to finish.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A pserver parameter server.\nUsage: pserver [--host=127.0.0.1] [--port=0] "
      "[--index=0] [--num_threads=0]");
  absl::ParseCommandLine(argc, argv);

  // Block the stop signals in every thread (gRPC's threads inherit this mask),
  // then wait for them here.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  pserver::ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.index = absl::GetFlag(FLAGS_index);
  options.num_threads = absl::GetFlag(FLAGS_num_threads);
  absl::StatusOr<std::unique_ptr<pserver::Server>> server = pserver::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "pserver: %s\n", server.status().ToString().c_str());
    return 1;
  }
  std::printf("pserver %u listening on %s\n", options.index, (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("pserver %u: %s received, shutting down\n", options.index,
              strsignal(signal_number));
  std::fflush(stdout);
  (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds)));
  std::printf("pserver %u: stopped\n", options.index);
  return 0;
}
