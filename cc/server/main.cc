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
// it has a --checkpoint_dir (exit 1 if that save fails, and 1 without a save
// when it stepped down from its shard: docs/replication.md; with
// --accept_standbys a server that steps down is replaced at once by a fresh
// standby in this process, which copies a shard again). A signal while
// starting (waiting for etcd or a free index) stops it there, exit 1, with a
// line saying so. --help lists pserver's flags; docs/operations.md and
// docs/limits.md describe them. Every flag can also come from the
// environment as PSERVER_<FLAG IN UPPER CASE> (PSERVER_ETCD for --etcd); a
// flag on the command line wins (docs/deploy.md).
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <iterator>
#include <memory>
#include <optional>
#include <thread>

#include "absl/flags/flag.h"
#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "cc/core/checkpoint.h"
#include "cc/cuda/device.h"
#include "cc/log/log.h"
#include "cc/rpc/allocator.h"
#include "cc/rpc/buffer_pool.h"
#include "cc/server/advertised_address.h"
#include "cc/server/applied_sequences.h"
#include "cc/server/env_flags.h"
#include "cc/server/server.h"
#include "cc/server/standby_slots.h"

ABSL_FLAG(std::string, host, "127.0.0.1",
          "Address to listen on; 0.0.0.0 or :: (every address) needs --advertise_host.");
// --- the published address (docs/multihost.md) ---
ABSL_FLAG(std::string, advertise_host, "",
          "Address other hosts reach this server at: published in etcd (/ps/<index>) and used "
          "for the bulk channel's TCP port (as etcd's --advertise-client-urls). Empty: --host, "
          "which must then be a specific address. An IPv6 address is published as "
          "[addr]:port.");
ABSL_FLAG(int, port, 0, "Port to listen on; 0 picks a free one.");
ABSL_FLAG(uint32_t, index, 0, "This server's shard index.");
ABSL_FLAG(int, num_threads, 0,
          "Idle threads kept waiting for calls; 0 means two per core (at least 4). More start "
          "under load, up to --max_threads.");
ABSL_FLAG(double, shutdown_grace_seconds, 5,
          "On SIGINT/SIGTERM, how long calls in flight may take to finish.");
ABSL_FLAG(double, depart_linger_seconds, 5,
          "With --placement_redirects: once a stable /placement leaves this server out (a "
          "move to fewer servers), how long it keeps answering every request with a redirect "
          "to the block's new owner before it stops as on SIGTERM, for clients that have not "
          "seen the new placement yet. 0 .. 3600.");
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
ABSL_FLAG(uint64_t, max_exactly_once_clients, pserver::AppliedSequences::kDefaultMaxClients,
          "Clients whose applied push sequences a server remembers (exactly-once pushes); past "
          "it the client idle the longest is forgotten, so a late retry of its last push would "
          "be applied again. Must be >= 1.");
ABSL_FLAG(uint64_t, max_workers_per_table, pserver::WorkerClocks::kDefaultMaxWorkers,
          "Workers joined to one table's clocks (SSP/BSP) at once; past it a join is refused "
          "(RESOURCE_EXHAUSTED) until one leaves. Must be >= 1.");
ABSL_FLAG(uint64_t, max_tables, pserver::TablesOptions::kDefaultMaxTables,
          "Tables CreateTable may make on this server; past it CreateTable is refused "
          "(RESOURCE_EXHAUSTED), nothing created. Must be >= 1.");
ABSL_FLAG(uint64_t, max_held_add_bytes, uint64_t{1} << 30,
          "Bytes (keys and values) of BSP adds one table holds back for slower workers; past "
          "it a push gets UNAVAILABLE (clients retry), one add larger than it "
          "RESOURCE_EXHAUSTED. Must be > 0.");
ABSL_FLAG(uint64_t, max_param_bytes, 0,
          "Bytes of dense parameters (values and optimizer state, all together) InitParam may "
          "bring this server to; past it InitParam is refused (RESOURCE_EXHAUSTED), nothing "
          "stored. 0: half of this machine's physical memory (said at start). What a "
          "checkpoint, a live move or a standby's copy brings in is taken whole.");
ABSL_FLAG(uint64_t, max_table_row_bytes, 0,
          "Bytes of table rows (all tables together) pushes may create; past it a push is "
          "refused (RESOURCE_EXHAUSTED), nothing of it applied. 0: half of this machine's "
          "physical memory (said at start). Evicted rows give their bytes back; rows a "
          "checkpoint, a live move or a standby's copy brings in are taken whole.");
ABSL_FLAG(uint64_t, max_message_bytes, pserver::kDefaultMaxMessageBytes,
          "Largest request accepted, in bytes after decompression; a bigger one is refused "
          "(RESOURCE_EXHAUSTED) before it is read. The default fits every request a client "
          "sends.");
ABSL_FLAG(bool, allow_compressed_requests, false,
          "Accept gzip/deflate-compressed requests. Off: they are refused (UNIMPLEMENTED), "
          "since a small compressed request can inflate to far more memory.");
ABSL_FLAG(int, max_threads, pserver::kDefaultMaxThreads,
          "Most threads running calls at once; a call finding none free fails "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(int, reserve_fds, 32,
          "File descriptors kept free for etcd, checkpoints and calls in flight: a new "
          "connection that would leave fewer is closed at once (clients retry). Connections "
          "are bounded by ulimit -n minus this.");
ABSL_FLAG(int, max_concurrent_streams, 256,
          "Most calls in flight on one connection; more wait in the client.");
ABSL_FLAG(double, max_connection_idle_seconds, 300,
          "A connection without calls for this long is closed; clients reconnect on their "
          "next call. 0: never.");
ABSL_FLAG(double, handshake_timeout_seconds, 10,
          "A connection whose client sends nothing for this long after connecting is closed.");
ABSL_FLAG(double, keepalive_seconds, 60,
          "Seconds of silence on a connection with calls in flight before the server pings "
          "it.");
ABSL_FLAG(double, keepalive_timeout_seconds, 20,
          "Seconds the server waits for a ping's answer before closing the connection.");
// "on" or "off" (a bool flag would take true/false).
struct OnOff {
  bool on = true;
};
bool AbslParseFlag(absl::string_view text, OnOff* out, std::string* error) {
  if (text == "on" || text == "off") {
    out->on = text == "on";
    return true;
  }
  *error = "must be 'on' or 'off'";
  return false;
}
std::string AbslUnparseFlag(OnOff value) { return value.on ? "on" : "off"; }

ABSL_FLAG(bool, standby, false,
          "Start as a standby (needs --etcd): claim no index, copy a shard whose primary has no "
          "backup, apply its writes, serve no client; take the shard over when its primary's "
          "/ps/<i> is gone (docs/replication.md). With TLS and roles it presents its own "
          "certificate or --peer_token_file to the primary.");
ABSL_FLAG(uint64_t, max_standby_copy_bytes, uint64_t{1} << 30,
          "A standby's bound on the copy of the shard it receives from the primary named in "
          "etcd (one message: at most 2147483647); a larger copy fails the attach with "
          "RESOURCE_EXHAUSTED, nothing loaded.");
ABSL_FLAG(bool, accept_standbys, false,
          "Let a standby attach to this server's shard: once one did, a write is acknowledged "
          "only after the standby has it (docs/replication.md).");
ABSL_FLAG(int, replicas, 1,
          "Copies of every shard (1-65; needs --etcd): besides its own server this process "
          "runs replicas-1 standby slots, each on a port of its own, that back up other "
          "processes' shards (never one this process holds or backs up) and take them over "
          "when their primary dies; its own server accepts standbys. Start at least 'replicas' "
          "processes, so that every shard finds its backups (docs/replication.md).");
ABSL_FLAG(uint64_t, max_standbys, 2,
          "The most standbys attached to this server's shard at once (1-64; with "
          "--accept_standbys): one more is refused with FAILED_PRECONDITION naming this flag "
          "and attaches to another shard. Every write waits for each attached standby.");
ABSL_FLAG(uint64_t, max_joining_bytes, uint64_t{256} << 20,
          "With --accept_standbys: the most bytes of writes queued for a standby joining this "
          "server's shard while it loads its copy (1024 .. 2^40); past it the standby is let go "
          "unlisted, told why at its next check, and copies again (docs/replication.md).");
ABSL_FLAG(int64_t, join_timeout, 120,
          "Seconds (1-3600). With --accept_standbys: how long a standby joining this server's "
          "shard may take to load its copy and apply the first write made since; then it is let "
          "go unlisted, told why, and copies again. A standby not listed within this and a "
          "minute more of its copy copies again.");
ABSL_FLAG(int64_t, replicate_timeout, 10,
          "Seconds (1-3600). With --accept_standbys: how long a write may take to reach a "
          "backup, retries included; then the backup is dropped from its shard before the "
          "write is acknowledged. A backup whose address refuses connections, or that answers "
          "that it left its shard, is dropped at once (docs/replication.md).");
ABSL_FLAG(uint64_t, catch_up_bytes, uint64_t{256} << 20,
          "With --accept_standbys: bytes of this server's last writes kept in memory so that a "
          "standby rejoining with the shard's state up to an earlier LSN (dropped while cut "
          "off, let go, or the other backup after a takeover) is sent only the writes after it "
          "instead of a copy of the shard (default 256 MiB; 0: off; else 1024 .. 2^40). Writes "
          "are kept only while a standby may be away (fewer backups listed than this primary "
          "had, one joining); a write every backup acknowledged is let go at once. With it "
          "every write is numbered, also while no standby is attached (docs/replication.md).");
ABSL_FLAG(bool, placement_redirects, false,
          "Check every dense block of a push or read against etcd's /placement (watched): a "
          "block this server does not own under the newest version is refused with "
          "'placement moved' (FAILED_PRECONDITION), nothing applied (docs/elastic.md; needs "
          "--etcd). Also takes part in live moves (psctl scale): hands blocks to their new "
          "owners when asked, and a server left out by a stable /placement exits as on SIGTERM.");
ABSL_FLAG(uint64_t, move_batch_bytes, pserver::kDefaultMoveBatchBytes,
          "With --placement_redirects: the most bytes of values and optimizer state one "
          "server-to-server copy of a live move carries (1024 .. --max_message_bytes / 2; a "
          "larger block goes alone). Writes to the blocks of a batch wait while it is copied.");
ABSL_FLAG(uint32_t, testing_move_stall_after_batches, 0,
          "Testing only: with --placement_redirects, a live move stops on this server after it "
          "handed over (or before it takes one more than) this many batches, printing "
          "'pserver <i>: testing: live move stalled', until the process is killed or stopped. "
          "0: off.");
ABSL_FLAG(OnOff, bulk_channel, OnOff{},
          "on: push, pull and push+pull may also travel over a framed TCP stream (a Unix socket "
          "for clients on this host) beside gRPC, offered through OpenChannel; off: gRPC only.");
ABSL_FLAG(bool, bulk_unix_socket, true,
          "With --bulk_channel=on, also offer an abstract Unix socket to clients on this host "
          "(same network namespace).");
ABSL_FLAG(int, max_bulk_connections, 256,
          "Bulk channel connections served at once; more are refused (those clients use "
          "gRPC).");
ABSL_FLAG(uint64_t, max_bulk_request_bytes_in_flight, uint64_t{1} << 30,
          "Bulk channel request bytes read or being served at once, over all connections; a "
          "request that does not fit waits (UNAVAILABLE, retried by clients).");
ABSL_FLAG(double, bulk_frame_receive_timeout_seconds, 60,
          "A bulk channel frame's payload must be all in by this long after its header, else "
          "the connection is closed and the frame's bytes of "
          "--max_bulk_request_bytes_in_flight given back (clients retry on a new connection). "
          "0: no deadline.");
ABSL_FLAG(int, bulk_read_spin_micros, 50,
          "A plain bulk channel connection polls for its next request this many microseconds "
          "before its thread sleeps, only while the machine has a core free, backing off on "
          "idle connections (cc/rpc/byte_stream.h ReadSpin); 0: never. 0 .. 1000.");
ABSL_FLAG(uint64_t, bulk_buffer_pool_bytes, uint64_t{256} << 20,
          "Free large buffers (bulk request payloads and pulled blocks of 256 KiB or more) kept "
          "for reuse, so that their pages stay faulted in (cc/rpc/buffer_pool.h); beyond it the "
          "least recently freed go back to the kernel. 0: none kept.");
// --- TLS (cc/security/tls.h) ---
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate (chain) this server presents; with --tls_key and --tls_ca turns on "
          "mutual TLS: clients must present a certificate signed by --tls_ca. The bulk channel "
          "is then mutual TLS too (TCP only).");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls_cert.");
ABSL_FLAG(bool, tls_bulk_aead, true,
          "With TLS: offer the bulk channel's AEAD layer (AES-128-GCM from ipsec-mb keyed by "
          "the TLS exporter, docs/security.md) to clients that ask for it (they do by "
          "default); false: TLS records for every client. A CPU without AES-NI keeps TLS "
          "records and says so once.");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate(s) a client's certificate must chain to.");
ABSL_FLAG(double, tls_reload_seconds, 60,
          "How often the --tls_* files are re-read; replacing them rotates the certificates "
          "without a restart (new connections get the new ones).");

// --- roles and tokens (docs/security.md) ---
ABSL_FLAG(std::string, job, "",
          "This server's job: with --auth_tokens_file or --auth_cert_rule, a principal of "
          "another job is refused.");
ABSL_FLAG(std::string, auth_tokens_file, "",
          "Bearer tokens this server accepts, lines 'role job token' (role: reader, trainer, "
          "admin); re-read when the file changes. Clients send 'authorization: Bearer <token>'.");
ABSL_FLAG(std::string, auth_cert_rule, "",
          "How a verified client certificate names its role and job, e.g. cn:<role>.<job> or "
          "san:spiffe://<job>/<role> (needs mTLS).");
ABSL_FLAG(std::string, peer_token_file, "",
          "A file holding the bearer token (of an admin of --job) this server presents when it "
          "dials another server to replicate (--standby, --accept_standbys) or to hand blocks "
          "over in a live move (--placement_redirects); with TLS it also presents its own "
          "certificate (--tls_cert). Needed when roles come from --auth_tokens_file only.");
ABSL_FLAG(std::string, etcd_tls_ca, "",
          "etcd over TLS: the CA (PEM) that signed etcd's certificate.");
ABSL_FLAG(std::string, etcd_tls_cert, "",
          "etcd over TLS: this server's client certificate (PEM), for etcd --client-cert-auth.");
ABSL_FLAG(std::string, etcd_tls_key, "", "etcd over TLS: the key of --etcd_tls_cert (PEM).");

// --- the log (cc/log) ---
ABSL_FLAG(std::string, log_format, "text",
          "Log lines on stderr: text (time, level, server index, message) or json (one object "
          "per line: time, level, server, message[, suppressed]).");
ABSL_FLAG(int, v, 0, "Log verbosity: 0 writes ERROR, WARNING and INFO lines; 1 adds DEBUG.");
ABSL_FLAG(double, log_repeat_window_seconds, 10,
          "The same message is written at most --log_repeat_burst times per this many seconds; "
          "the next one says how many were suppressed.");
ABSL_FLAG(int, log_repeat_burst, 5, "See --log_repeat_window_seconds.");

// --- Prometheus metrics (docs/operations.md, docs/limits.md) ---
ABSL_FLAG(int, metrics_port, -1,
          "Port serving GET /metrics (Prometheus text format); 0 picks a free one; -1: off.");
ABSL_FLAG(std::string, metrics_host, "127.0.0.1",
          "Address /metrics listens on; a public one (0.0.0.0, ::) only when asked.");
ABSL_FLAG(int, metrics_max_connections, 8,
          "/metrics connections served at once; one more is answered 503 and closed.");
ABSL_FLAG(uint64_t, metrics_max_request_bytes, 8192,
          "Bytes of a /metrics request's line and headers; more is answered 431 and closed.");
ABSL_FLAG(double, metrics_io_timeout_seconds, 10,
          "Seconds a /metrics client may take to send its request, and to read the reply.");

// --- traces (docs/operations.md "Traces") ---
ABSL_FLAG(std::string, trace_file, "",
          "Write every request's stages as Chrome trace / Perfetto JSON to this file at "
          "shutdown; empty: off.");
ABSL_FLAG(uint64_t, trace_max_events, uint64_t{1} << 18,
          "Trace events kept in memory (the newest; older ones are dropped); at least 1.");

ABSL_FLAG(uint64_t, drop_reply_after_apply_every_n, 0,
          "Testing only: answer every n-th applied push UNAVAILABLE as if its reply were lost.");

namespace {

constexpr char kUsage[] =
    "A pserver parameter server.\n"
    "Usage: pserver [--host=127.0.0.1] [--port=0] [--advertise_host=ADDR] "
    "[--etcd=host:port --num_servers=N] [--checkpoint_dir=DIR] ...\n"
    "Every flag can also be set by the environment variable PSERVER_<FLAG> (upper case: "
    "PSERVER_CHECKPOINT_DIR for --checkpoint_dir); a flag given here wins.\n"
    "--help lists pserver's flags, --helpfull also abseil's.";

// pserver's own flags are the ones defined in this file.
bool IsPserverFlagFile(absl::string_view file) { return absl::EndsWith(file, "cc/server/main.cc"); }

// absl's --help lists the flags of files named after the program (this one
// is main.cc) and exits 1; pserver's --help lists its own flags and exits 0.
bool HelpRequested(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const absl::string_view arg = argv[i];
    if (arg == "--") return false;
    if (arg == "--help" || arg == "-help" || arg == "--helpshort" || arg == "-helpshort") {
      return true;
    }
  }
  return false;
}

void LogError(const std::string& server, const std::string& message) {
  pserver::log::Default().Log(pserver::log::Level::kError, server, message);
}

absl::Duration SecondsOrInfinite(double seconds) {
  return seconds <= 0 ? absl::InfiniteDuration() : absl::Seconds(seconds);
}

// Blocks SIGINT and SIGTERM in every thread (gRPC's threads inherit this
// mask) and waits for them on a thread of their own from the start, so
// that a stop signal is honoured while starting as well as while serving.
class StopSignals {
 public:
  StopSignals() {
    sigemptyset(&signals_);
    sigaddset(&signals_, SIGINT);
    sigaddset(&signals_, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &signals_, nullptr);
    thread_ = std::thread([this] {
      int signal_number = 0;
      sigwait(&signals_, &signal_number);
      signal_number_ = signal_number;
      stop_->Notify();
    });
  }
  ~StopSignals() {
    // Wakes the waiting thread when no signal came (pending for it alone).
    {
      absl::MutexLock lock(&raise_mu_);
      if (!raised_ && !stop_->HasBeenNotified()) pthread_kill(thread_.native_handle(), SIGTERM);
      raised_ = true;
    }
    thread_.join();  // stop_ is notified now: a delayed raise ends at once
    std::thread delayed;
    {
      absl::MutexLock lock(&raise_mu_);
      delayed = std::move(delayed_);
    }
    if (delayed.joinable()) delayed.join();
  }

  const std::shared_ptr<absl::Notification>& stop() const { return stop_; }
  // Stops the server as SIGTERM would after `delay`, unless it stopped
  // before (once; later calls do nothing).
  void RaiseAfter(absl::Duration delay) {
    absl::MutexLock lock(&raise_mu_);
    if (raised_ || delayed_.joinable() || stop_->HasBeenNotified()) return;
    delayed_ = std::thread([this, delay] {
      if (!stop_->WaitForNotificationWithTimeout(delay)) Raise();
    });
  }
  // Stops the server as SIGTERM would (once; later calls do nothing).
  void Raise() {
    absl::MutexLock lock(&raise_mu_);
    if (raised_ || stop_->HasBeenNotified()) return;
    raised_ = true;
    pthread_kill(thread_.native_handle(), SIGTERM);
  }
  // After stop() is notified.
  const char* name() const { return strsignal(signal_number_); }

 private:
  sigset_t signals_;
  std::shared_ptr<absl::Notification> stop_ = std::make_shared<absl::Notification>();
  int signal_number_ = 0;  // written before stop_ is notified
  absl::Mutex raise_mu_;
  bool raised_ ABSL_GUARDED_BY(raise_mu_) = false;
  std::thread delayed_ ABSL_GUARDED_BY(raise_mu_);  // RaiseAfter's
  std::thread thread_;
};

pserver::ServerOptions OptionsFromFlags() {
  pserver::ServerOptions options;
  options.host = absl::GetFlag(FLAGS_host);
  options.port = absl::GetFlag(FLAGS_port);
  options.advertise_host = absl::GetFlag(FLAGS_advertise_host);
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
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_bytes);
  options.allow_compressed_requests = absl::GetFlag(FLAGS_allow_compressed_requests);
  options.max_threads = absl::GetFlag(FLAGS_max_threads);
  options.reserve_fds = absl::GetFlag(FLAGS_reserve_fds);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_connection_idle = SecondsOrInfinite(absl::GetFlag(FLAGS_max_connection_idle_seconds));
  options.handshake_timeout = absl::Seconds(absl::GetFlag(FLAGS_handshake_timeout_seconds));
  options.keepalive_time = absl::Seconds(absl::GetFlag(FLAGS_keepalive_seconds));
  options.keepalive_timeout = absl::Seconds(absl::GetFlag(FLAGS_keepalive_timeout_seconds));
  options.drop_reply_after_apply_every_n = absl::GetFlag(FLAGS_drop_reply_after_apply_every_n);
  options.max_reply_bytes_in_flight = absl::GetFlag(FLAGS_max_reply_bytes_in_flight);
  options.max_collective_bytes = absl::GetFlag(FLAGS_max_collective_bytes);
  options.max_exactly_once_clients = absl::GetFlag(FLAGS_max_exactly_once_clients);
  options.max_workers_per_table = absl::GetFlag(FLAGS_max_workers_per_table);
  options.max_tables = absl::GetFlag(FLAGS_max_tables);
  options.max_held_add_bytes = absl::GetFlag(FLAGS_max_held_add_bytes);
  options.max_param_bytes = absl::GetFlag(FLAGS_max_param_bytes);
  options.max_table_row_bytes = absl::GetFlag(FLAGS_max_table_row_bytes);
  options.bulk_channel = absl::GetFlag(FLAGS_bulk_channel).on;
  options.standby = absl::GetFlag(FLAGS_standby);
  options.max_standby_copy_bytes = absl::GetFlag(FLAGS_max_standby_copy_bytes);
  options.accept_standbys = absl::GetFlag(FLAGS_accept_standbys);
  options.max_standbys = absl::GetFlag(FLAGS_max_standbys);
  options.max_joining_bytes = absl::GetFlag(FLAGS_max_joining_bytes);
  options.join_timeout = absl::Seconds(absl::GetFlag(FLAGS_join_timeout));
  options.replicate_timeout = absl::Seconds(absl::GetFlag(FLAGS_replicate_timeout));
  options.catch_up_bytes = absl::GetFlag(FLAGS_catch_up_bytes);
  if (absl::GetFlag(FLAGS_replicas) > 1) {
    options.accept_standbys = true;
    options.process_slots =
        std::make_shared<pserver::ProcessSlots>(absl::GetFlag(FLAGS_replicas) - 1);
  }
  options.placement_redirects = absl::GetFlag(FLAGS_placement_redirects);
  options.move_batch_bytes = absl::GetFlag(FLAGS_move_batch_bytes);
  options.testing_move_stall_after_batches = absl::GetFlag(FLAGS_testing_move_stall_after_batches);
  options.bulk_unix_socket = absl::GetFlag(FLAGS_bulk_unix_socket);
  options.max_bulk_connections = absl::GetFlag(FLAGS_max_bulk_connections);
  options.max_bulk_request_bytes_in_flight = absl::GetFlag(FLAGS_max_bulk_request_bytes_in_flight);
  options.bulk_frame_receive_timeout =
      absl::Seconds(absl::GetFlag(FLAGS_bulk_frame_receive_timeout_seconds));
  options.bulk_read_spin = absl::Microseconds(absl::GetFlag(FLAGS_bulk_read_spin_micros));
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.tls.bulk_aead = absl::GetFlag(FLAGS_tls_bulk_aead);
  options.tls.reload_interval = absl::Seconds(absl::GetFlag(FLAGS_tls_reload_seconds));
  // Roles and tokens.
  options.job = absl::GetFlag(FLAGS_job);
  options.auth_tokens_file = absl::GetFlag(FLAGS_auth_tokens_file);
  options.auth_cert_rule = absl::GetFlag(FLAGS_auth_cert_rule);
  options.peer_token_file = absl::GetFlag(FLAGS_peer_token_file);
  options.etcd_tls.ca = absl::GetFlag(FLAGS_etcd_tls_ca);
  options.etcd_tls.cert = absl::GetFlag(FLAGS_etcd_tls_cert);
  options.etcd_tls.key = absl::GetFlag(FLAGS_etcd_tls_key);
  if (absl::GetFlag(FLAGS_metrics_port) >= 0) {
    pserver::metrics::MetricsHttpOptions http;
    http.host = absl::GetFlag(FLAGS_metrics_host);
    http.port = absl::GetFlag(FLAGS_metrics_port);
    http.max_connections = absl::GetFlag(FLAGS_metrics_max_connections);
    http.max_request_bytes = absl::GetFlag(FLAGS_metrics_max_request_bytes);
    http.io_timeout = absl::Seconds(absl::GetFlag(FLAGS_metrics_io_timeout_seconds));
    options.metrics_http = http;
  }
  options.trace_file = absl::GetFlag(FLAGS_trace_file);
  options.trace_max_events = absl::GetFlag(FLAGS_trace_max_events);
  return options;
}

// Raises the soft descriptor limit to the hard one, as Go's runtime does:
// each connection takes a descriptor, and with TLS gRPC's own listener
// accepts, which in gRPC 1.51 stops for good at the first EMFILE
// (docs/limits.md). Says so when it changed anything.
void RaiseDescriptorLimit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur >= limit.rlim_max) return;
  const rlim_t before = limit.rlim_cur;
  limit.rlim_cur = limit.rlim_max;
  if (setrlimit(RLIMIT_NOFILE, &limit) == 0) {
    pserver::log::Default().Log(
        pserver::log::Level::kInfo, "",
        absl::StrCat("descriptor limit raised from ", before, " to ", limit.rlim_max));
  }
}

}  // namespace

int main(int argc, char** argv) {
  absl::FlagsUsageConfig usage_config;
  usage_config.contains_help_flags = IsPserverFlagFile;
  usage_config.contains_helpshort_flags = IsPserverFlagFile;
  absl::SetFlagsUsageConfig(usage_config);
  absl::SetProgramUsageMessage(kUsage);
  if (HelpRequested(argc, argv)) {
    absl::flags_internal::SetProgramInvocationName(argv[0]);
    absl::flags_internal::FlagsHelp(std::cout, "cc/server/main.cc",
                                    absl::flags_internal::HelpFormat::kHumanReadable, kUsage);
    return 0;
  }
  // The environment first, so that the command line, parsed next, wins.
  absl::StatusOr<pserver::EnvFlagsApplied> from_environment =
      pserver::ApplyFlagsFromEnvironment("PSERVER_", environ, [](const absl::CommandLineFlag& flag) {
        return IsPserverFlagFile(flag.Filename());
      });
  if (!from_environment.ok()) {
    std::fprintf(stderr, "pserver: %s\n", std::string(from_environment.status().message()).c_str());
    return 1;
  }
  absl::ParseCommandLine(argc, argv);
  pserver::KeepFreedMemoryForReuse();  // before any thread starts
  pserver::ProcessBufferPool().SetMaxBytes(absl::GetFlag(FLAGS_bulk_buffer_pool_bytes));
  {
    absl::StatusOr<pserver::log::Format> format =
        pserver::log::ParseFormat(absl::GetFlag(FLAGS_log_format));
    if (!format.ok()) {
      std::fprintf(stderr, "pserver: --log_format: %s\n", format.status().ToString().c_str());
      return 1;
    }
    pserver::log::LogOptions log_options;
    log_options.format = *format;
    log_options.verbosity = absl::GetFlag(FLAGS_v);
    log_options.repeat_window = absl::Seconds(absl::GetFlag(FLAGS_log_repeat_window_seconds));
    log_options.repeat_burst = std::max(1, absl::GetFlag(FLAGS_log_repeat_burst));
    pserver::log::SetDefault(std::move(log_options));  // before any thread logs
  }
  // Variables clients and test helpers read (PSERVER_TRACE: a client's trace
  // file; PSERVER_BINARY: where tests find this binary): not flags, not
  // worth a warning when a server inherits them.
  constexpr absl::string_view kClientVariables[] = {"PSERVER_TRACE", "PSERVER_TRACE_MAX_EVENTS",
                                                    "PSERVER_BINARY"};
  for (const std::string& variable : from_environment->unknown) {
    if (std::find(std::begin(kClientVariables), std::end(kClientVariables), variable) !=
        std::end(kClientVariables)) {
      continue;
    }
    pserver::log::Default().Log(
        pserver::log::Level::kWarning, "",
        absl::StrCat("environment variable ", variable,
                     " names no pserver flag (see --help): ignored"));
  }
  RaiseDescriptorLimit();
  // Debian builds absl without NDEBUG, which leaves absl::Mutex's deadlock
  // detection on: every lock taken then updates a process-wide lock graph
  // under one global spin lock (1.7% of a sparse benchmark's samples, and a
  // point where every serving thread meets). A debugging aid; off here.
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);

  StopSignals stop_signals;
  pserver::ServerOptions options = OptionsFromFlags();
  options.stop = stop_signals.stop();
  // Left out by a stable /placement after a move: answer redirects a while
  // (clients still routing by the moving placement follow them instead of
  // dialling a server that is gone), then stop as on SIGTERM.
  const double linger = absl::GetFlag(FLAGS_depart_linger_seconds);
  if (!(linger >= 0 && linger <= 3600)) {
    LogError("", absl::StrCat("--depart_linger_seconds must be in [0, 3600], got ", linger));
    return 1;
  }
  options.on_departed = [&stop_signals, linger] {
    std::printf("pserver: left out by the placement: answering redirects for %gs, then "
                "stopping (--depart_linger_seconds)\n",
                linger);
    std::fflush(stdout);
    stop_signals.RaiseAfter(absl::Seconds(linger));
  };
  absl::StatusOr<uint32_t> checkpoint_mode =
      pserver::ParseCheckpointFileMode(absl::GetFlag(FLAGS_checkpoint_mode));
  if (!checkpoint_mode.ok()) {
    LogError("", absl::StrCat("--checkpoint_mode: ", checkpoint_mode.status().ToString()));
    return 1;
  }
  options.checkpoint_file_mode = *checkpoint_mode;
  const std::string device_flag = absl::GetFlag(FLAGS_device);
  absl::StatusOr<pserver::cuda::DeviceChoice> device = pserver::cuda::ChooseDevice(device_flag);
  if (!device.ok()) {
    LogError("", absl::StrCat("--device=", device_flag, ": ", device.status().ToString()));
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
  const int replicas = absl::GetFlag(FLAGS_replicas);
  if (replicas < 1 || replicas > 65) {
    LogError("", absl::StrCat("--replicas must be in [1, 65], got ", replicas));
    return 1;
  }
  if (replicas > 1 && options.etcd_endpoints.empty()) {
    LogError("", "--replicas > 1 needs etcd (--etcd): the backups find their shards there");
    return 1;
  }
  // Started first: with --standby the process's own server waits in Start
  // too, until it takes a shard over.
  std::optional<pserver::StandbySlots> slots;
  if (replicas > 1) {
    slots.emplace(
        options, replicas - 1,
        [](const pserver::Server& slot) {
          std::printf("pserver %u listening on %s (a standby slot of this process took shard %u "
                      "over)\n",
                      slot.index(), slot.address().c_str(), slot.index());
          std::fflush(stdout);
        },
        [](const std::string& line) { LogError("", line); }, absl::Seconds(linger));
  }
  absl::StatusOr<std::unique_ptr<pserver::Server>> server = pserver::Server::Start(options);
  if (!server.ok()) {
    if (options.stop->HasBeenNotified()) {
      LogError("", absl::StrCat(stop_signals.name(),
                                " received while starting: stopped before serving (",
                                server.status().ToString(), ")"));
    } else {
      LogError("", server.status().ToString());
    }
    return 1;
  }
  const uint32_t index = (*server)->index();
  std::printf("pserver %u listening on %s\n", index, (*server)->address().c_str());
  if ((*server)->metrics_port() != 0) {
    std::printf("pserver %u metrics on http://%s/metrics\n", index,
                pserver::JoinHostPort(options.metrics_http->host, (*server)->metrics_port()).c_str());
  }
  std::fflush(stdout);

  const absl::Duration grace = absl::Seconds(absl::GetFlag(FLAGS_shutdown_grace_seconds));
  absl::Status final_save;
  if (pserver::RejoinsAfterSteppingDown(options)) {
    // Once it steps down, a fresh standby takes its place (its shard first)
    // and serves again if it takes a shard over (docs/replication.md).
    // Its lines go to stdout with the "listening" ones: "pserver <index>:
    // its server of shard <i> stepped down; ..." when it is replaced.
    pserver::ServerSeat seat(
        options, absl::StrCat("pserver ", index),
        [](const pserver::Server& rejoined) {
          std::printf("pserver %u listening on %s (a standby this process started when its "
                      "server stepped down took shard %u over)\n",
                      rejoined.index(), rejoined.address().c_str(), rejoined.index());
          std::fflush(stdout);
        },
        [](const std::string& line) {
          std::printf("%s\n", line.c_str());
          std::fflush(stdout);
        });
    seat.Run(*std::move(server));  // until a stop signal
    std::printf("pserver %u: %s received, shutting down\n", index, stop_signals.name());
    std::fflush(stdout);
    // A standby still waiting for a shard has nothing to save.
    final_save = seat.Stop(grace);
  } else {
    options.stop->WaitForNotification();
    std::printf("pserver %u: %s received, shutting down\n", index, stop_signals.name());
    std::fflush(stdout);
    (*server)->Shutdown(grace);
    // A last checkpoint that failed loses every update since the one before:
    // say so in the exit status, for supervisors and scripts.
    final_save = (*server)->final_save_status();
  }
  if (slots.has_value()) {
    absl::Status slots_saved = slots->Stop(grace);
    if (final_save.ok()) final_save = slots_saved;
  }
  if (!final_save.ok()) {
    LogError(absl::StrCat(index),
             absl::StrCat("stopped, but the final checkpoint failed: ", final_save.ToString()));
    return 1;
  }
  std::printf("pserver %u: stopped\n", index);
  return 0;
}
