// pserver: one parameter server process.
//
//   bazel run //:pserver                          # 127.0.0.1, a free port
//   bazel run //:pserver -- --port=7000 --index=1
//
//   bazel run //:pserver -- --etcd=127.0.0.1:2379 --num_servers=3
//       --checkpoint_dir=/var/lib/pserver --checkpoint_interval=60   (one line)
//
// Prints "pserver <index> listening on <host:port>" once it serves (with
// --etcd, after claiming its index and loading its checkpoint), and stops
// cleanly (exit 0) on SIGINT or SIGTERM, saving a last checkpoint first when
// it has a --checkpoint_dir (exit 1 if that save fails). docs/operations.md
// describes every flag.
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <cstring>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_split.h"
#include "cc/core/checkpoint.h"
#include "cc/cuda/device.h"
#include "cc/rpc/allocator.h"
#include "cc/server/server.h"

ABSL_FLAG(std::string, host, "127.0.0.1", "Address to listen on.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one.");
ABSL_FLAG(uint32_t, index, 0, "This server's shard index.");
ABSL_FLAG(int, num_threads, 0, "Request threads; 0 means two per core (at least 4).");
ABSL_FLAG(double, shutdown_grace_seconds, 5,
          "On SIGINT/SIGTERM, how long calls in flight may take to finish.");
ABSL_FLAG(std::string, etcd, "",
          "etcd endpoints host:port[,host:port...]; the server then claims the lowest free "
          "index (--index is ignored) and registers there. Empty: no etcd.");
ABSL_FLAG(std::string, cluster, "default",
          "Cluster name: etcd keys live under /pserver/<cluster>.");
ABSL_FLAG(uint32_t, num_servers, 0,
          "Desired number of servers, written to etcd /ps_desired if that is absent.");
ABSL_FLAG(double, lease_ttl, 5, "Seconds of the etcd lease the registration lives under.");
ABSL_FLAG(double, register_timeout, 60,
          "Seconds to wait for etcd and for a free index at startup.");
ABSL_FLAG(
    std::string, checkpoint_dir, "",
    "Directory for checkpoints (shard i in <dir>/shard-<i>); loaded at startup. Empty: none.");
ABSL_FLAG(double, checkpoint_interval, 0, "Seconds between periodic checkpoints; 0: none.");
ABSL_FLAG(uint32_t, checkpoint_keep, 3, "Checkpoints kept per shard (older ones are deleted).");
ABSL_FLAG(std::string, checkpoint_mode, "0600",
          "Octal permission bits of checkpoint files (they hold the model); the directories "
          "created get the same plus search (0600 -> 0700, 0640 -> 0750). Must include 0600, "
          "at most 0666.");
ABSL_FLAG(std::string, device, "cpu",
          "Where shards live: cpu (host memory), auto (the first CUDA device if there is "
          "one, else host memory), or cuda:<N> (exit non-zero without that device). "
          "docs/cuda.md.");
ABSL_FLAG(uint64_t, max_reply_bytes_in_flight, uint64_t{1} << 30,
          "Bytes of read replies (GetParam, GetParams, PushPull) built but not yet sent to "
          "their clients, over all calls; past it reads get UNAVAILABLE (clients retry), a "
          "single reply larger than it RESOURCE_EXHAUSTED. Must be > 0.");
ABSL_FLAG(uint64_t, max_collective_bytes, uint64_t{1} << 30,
          "Bytes held by collectives waiting for their other participants (AllReduce chunks, "
          "unread Broadcast data), over all rounds; past it a contribution gets UNAVAILABLE "
          "(clients retry), one larger than it RESOURCE_EXHAUSTED. Must be > 0.");
ABSL_FLAG(uint64_t, drop_reply_after_apply_every_n, 0,
          "Testing only: answer every n-th applied push UNAVAILABLE as if its reply were lost.");

int main(int argc, char** argv) {
  absl::SetProgramUsageMessage(
      "A pserver parameter server.\nUsage: pserver [--host=127.0.0.1] [--port=0] "
      "[--index=0] [--num_threads=0]");
  absl::ParseCommandLine(argc, argv);
  pserver::KeepFreedMemoryForReuse();  // before any thread starts

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
  for (absl::string_view endpoint :
       absl::StrSplit(absl::GetFlag(FLAGS_etcd), ',', absl::SkipWhitespace())) {
    options.etcd_endpoints.emplace_back(endpoint);
  }
  options.cluster = absl::GetFlag(FLAGS_cluster);
  options.num_servers = absl::GetFlag(FLAGS_num_servers);
  options.lease_ttl = absl::Seconds(absl::GetFlag(FLAGS_lease_ttl));
  options.register_timeout = absl::Seconds(absl::GetFlag(FLAGS_register_timeout));
  options.checkpoint_dir = absl::GetFlag(FLAGS_checkpoint_dir);
  options.checkpoint_interval = absl::Seconds(absl::GetFlag(FLAGS_checkpoint_interval));
  options.checkpoint_keep = absl::GetFlag(FLAGS_checkpoint_keep);
  absl::StatusOr<uint32_t> checkpoint_mode =
      pserver::ParseCheckpointFileMode(absl::GetFlag(FLAGS_checkpoint_mode));
  if (!checkpoint_mode.ok()) {
    std::fprintf(stderr, "pserver: --checkpoint_mode: %s\n",
                 checkpoint_mode.status().ToString().c_str());
    return 1;
  }
  options.checkpoint_file_mode = *checkpoint_mode;
  options.drop_reply_after_apply_every_n = absl::GetFlag(FLAGS_drop_reply_after_apply_every_n);
  options.max_reply_bytes_in_flight = absl::GetFlag(FLAGS_max_reply_bytes_in_flight);
  options.max_collective_bytes = absl::GetFlag(FLAGS_max_collective_bytes);
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  absl::StatusOr<pserver::cuda::DeviceChoice> device = pserver::cuda::ChooseDevice(device_flag);
  if (!device.ok()) {
    std::fprintf(stderr, "pserver: --device=%s: %s\n", device_flag.c_str(),
                 device.status().ToString().c_str());
    return 1;
  }
  options.device = device->name;
  if (device_flag != "cpu") {
    std::printf("pserver: --device=%s: using %s: %s%s\n", device_flag.c_str(), device->name.c_str(),
                device->reason.c_str(),
                device->cuda ? " (dense float32 shards with sgd, adagrad, adam or adamw live "
                               "on the device; other blocks and tables in host memory)"
                             : "");
    std::fflush(stdout);
  }
  absl::StatusOr<std::unique_ptr<pserver::Server>> server = pserver::Server::Start(options);
  if (!server.ok()) {
    std::fprintf(stderr, "pserver: %s\n", server.status().ToString().c_str());
    return 1;
  }
  const uint32_t index = (*server)->index();
  std::printf("pserver %u listening on %s\n", index, (*server)->address().c_str());
  std::fflush(stdout);

  int signal_number = 0;
  sigwait(&stop_signals, &signal_number);
  std::printf("pserver %u: %s received, shutting down\n", index, strsignal(signal_number));
  std::fflush(stdout);
  (*server)->Shutdown(absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds)));
  // A last checkpoint that failed loses every update since the one before:
  // say so in the exit status, for supervisors and scripts.
  const absl::Status final_save = (*server)->final_save_status();
  if (!final_save.ok()) {
    std::fprintf(stderr, "pserver %u: stopped, but the final checkpoint failed: %s\n", index,
                 final_save.ToString().c_str());
    return 1;
  }
  std::printf("pserver %u: stopped\n", index);
  return 0;
}
