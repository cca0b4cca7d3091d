// The trainer and observer of the multi-host tests (tests/multihost_test.cc),
// run inside a network namespace: a public C++ Client that finds the servers
// through etcd.
//
//   multihost_trainer --etcd=A,B,C --mode=init       # creates w and count
//   multihost_trainer --etcd=... --mode=train --worker_id=t0 --min_steps=200
//                     --stop_file=/tmp/stop           # trains until told to stop
//   multihost_trainer --etcd=... --mode=check         # prints the parameters' state
//   multihost_trainer --etcd=... --mode=wait_count --count_above=500
//   multihost_trainer --etcd=... --mode=wait_members --expect_workers=t0
//                     --expect_servers=0,2            # waits for that membership
//
// The replication partition tests (tests/replication_partition_test.cc) use
// a ledger instead: parameters of --width float32 zeros (SGD, learning rate
// 1), where a trainer's step s pushes -1 at element s alone, so the final
// value of element s says whether step s was applied: 1 once, 0 never,
// anything else twice or lost in part.
//
//   multihost_trainer --etcd=... --mode=init_ledger --params=a,b --width=16384
//   multihost_trainer --etcd=... --mode=ledger --param=a --stop_file=/tmp/stop
//                     [--fail_ok --timeout_seconds=4]  # "ack <s>" / "fail <s>: ..."
//   multihost_trainer --etcd=... --mode=ledger_values --param=a  # "values v0 v1 ..."
//   multihost_trainer --mode=raw_push --address=H:P --param=a  # one gRPC SendGrad
//   multihost_trainer --etcd=... --mode=shard [--expect_replicas=1] [--expect_holder=ID]
//                     [--expect_checkpoint_epoch=E]
//                     # "holder=<id> epoch=<e> replicas=<ids> ps=<address> checkpoint_epoch=<e>"
//
// The model is deterministic: w (kDim floats, several blocks over every
// server) is trained by SGD towards `target` on the loss |w - target|^2 / 2,
// so it converges to target whatever the interleaving of the trainers; count
// gets a gradient of -1 per step (SGD, learning rate 1), so its value is the
// number of steps applied, which shows that no push was applied twice or
// lost. Train prints "step <n>" every kReportEvery steps and "done steps=<n>"
// at the end; check prints "count=<c> uniform=<0|1> maxerr=<e>";
// wait_members prints "members workers=<ids> servers=<indices>" once etcd
// shows exactly the expected sets, exit 1 (with what it saw) if it does not
// within --wait_seconds; wait_count prints "count=<c>" once more than
// --count_above steps are applied (exit 1 if not within --wait_seconds). Errors: a line on stderr,
// exit 1.
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/etcd_client.h"
#include "cc/etcd/json_record.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "grpcpp/grpcpp.h"
#include "pserver/v1/registry.pb.h"
#include "pserver/v1/service.grpc.pb.h"

ABSL_FLAG(std::string, etcd, "", "etcd endpoints host:port,...");
ABSL_FLAG(std::string, cluster, "multihost", "Cluster name in etcd.");
ABSL_FLAG(std::string, mode, "train",
          "init, train, check, wait_members, wait_count, push, init_ledger, ledger, "
          "ledger_values, raw_push or shard.");
ABSL_FLAG(std::string, worker_id, "", "train: the trainer's id in /workers/.");
ABSL_FLAG(double, worker_lease_seconds, 2, "train: the worker registration's lease.");
ABSL_FLAG(int, min_steps, 100, "train: steps before the stop file is looked at.");
ABSL_FLAG(int, max_steps, 5000000, "train: steps after which it gives up (exit 1).");
ABSL_FLAG(std::string, stop_file, "", "train: stop once this file exists (after min_steps).");
ABSL_FLAG(double, timeout_seconds, 120, "Deadline of each call (retried within it).");
ABSL_FLAG(std::string, expect_workers, "", "wait_members: worker ids, comma-separated.");
ABSL_FLAG(std::string, expect_servers, "", "wait_members: server indices, comma-separated.");
ABSL_FLAG(bool, write_probe, false,
          "wait_members: first write a key (/probe), which etcd commits only with a quorum.");
ABSL_FLAG(double, count_above, 0, "wait_count: the count to exceed.");
ABSL_FLAG(double, wait_seconds, 60, "wait_members, wait_count: how long to wait.");
ABSL_FLAG(std::string, tls_cert, "", "This client's certificate (PEM): mTLS to the servers.");
ABSL_FLAG(std::string, tls_key, "", "Its private key (PEM).");
ABSL_FLAG(std::string, tls_ca, "", "The CA the servers' certificates chain to (PEM).");
ABSL_FLAG(std::string, etcd_tls_ca, "", "etcd over TLS: the CA of etcd's certificate.");
ABSL_FLAG(std::string, etcd_tls_cert, "", "etcd over TLS: this client's certificate.");
ABSL_FLAG(std::string, etcd_tls_key, "", "etcd over TLS: its private key.");
ABSL_FLAG(std::string, token, "", "A bearer token for servers with roles.");
ABSL_FLAG(std::string, params, "", "init_ledger: the ledger parameters, comma-separated.");
ABSL_FLAG(std::string, param, "", "ledger, ledger_values, raw_push: the ledger parameter.");
ABSL_FLAG(int64_t, width, 16384, "Ledger parameters' float32 elements (steps a trainer makes).");
ABSL_FLAG(bool, fail_ok, false,
          "ledger: a step whose push fails prints \"fail <s>: <status>\" and training goes on "
          "(otherwise it ends the run, exit 1).");
ABSL_FLAG(int, pause_ms, 5, "ledger: pause between steps (keeps the ledger from filling).");
ABSL_FLAG(std::string, address, "", "raw_push: the server's host:port.");
ABSL_FLAG(int, expect_replicas, -1, "shard: wait until /shards/0 lists this many backups.");
ABSL_FLAG(std::string, expect_holder, "", "shard: wait until /shards/0 names this holder.");
ABSL_FLAG(int64_t, expect_checkpoint_epoch, -1,
          "shard: wait until /checkpoints/0 records a checkpoint of this epoch.");

namespace pserver::multihost {
namespace {

constexpr int64_t kDim = 3000;        // 12,000 bytes: 3 blocks of kBlockBytes
constexpr size_t kBlockBytes = 4096;  // every client of the cluster uses it
constexpr float kTarget = 3.0f;
constexpr float kLearningRate = 0.25f;
constexpr int kReportEvery = 100;

EtcdTlsOptions EtcdTls() {
  EtcdTlsOptions tls;
  tls.ca = absl::GetFlag(FLAGS_etcd_tls_ca);
  tls.cert = absl::GetFlag(FLAGS_etcd_tls_cert);
  tls.key = absl::GetFlag(FLAGS_etcd_tls_key);
  return tls;
}

std::vector<std::string> Endpoints() {
  return absl::StrSplit(absl::GetFlag(FLAGS_etcd), ',', absl::SkipEmpty());
}

absl::StatusOr<std::unique_ptr<Client>> Connect(bool register_worker) {
  ClientOptions options;
  options.etcd_endpoints = Endpoints();
  options.cluster = absl::GetFlag(FLAGS_cluster);
  options.block_bytes = kBlockBytes;
  options.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_seconds));
  options.discovery_timeout = options.timeout;
  options.register_worker = register_worker;
  options.worker_id = absl::GetFlag(FLAGS_worker_id);
  options.worker_lease_ttl = absl::Seconds(absl::GetFlag(FLAGS_worker_lease_seconds));
  options.tls.cert = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca = absl::GetFlag(FLAGS_tls_ca);
  options.etcd_tls = EtcdTls();
  options.token = absl::GetFlag(FLAGS_token);
  return Client::Connect(options);
}

Tensor Filled(float value) {
  return Tensor::FromValues<float>({kDim}, std::vector<float>(kDim, value));
}

v1::ParameterConfig Sgd(float learning_rate) {
  v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_sgd();
  config.mutable_learning_rate()->set_learning_rate(learning_rate);
  return config;
}

// One gradient of "w": OK, or the status the servers answered (printed as
// "push: <status>" so that a test can read the code and the message).
absl::Status PushOnce() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  const absl::Status status = client->SendGrad("w", Filled(0.0f));
  std::printf("push: %s\n", status.ToString().c_str());
  return status;
}

absl::Status Init() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  PS_RETURN_IF_ERROR(client->InitParam("w", Filled(0.0f), Sgd(kLearningRate)));
  PS_RETURN_IF_ERROR(client->InitParam("count", Filled(0.0f), Sgd(1.0f)));
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  std::printf("initialized\n");
  return absl::OkStatus();
}

absl::Status Train() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(true));
  PS_ASSIGN_OR_RETURN(Tensor w, client->GetParam("w"));
  Tensor grad = Filled(0.0f);
  Tensor count = Filled(0.0f);
  const Tensor minus_one = Filled(-1.0f);
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  const int min_steps = absl::GetFlag(FLAGS_min_steps);
  const int max_steps = absl::GetFlag(FLAGS_max_steps);
  int steps = 0;
  while (true) {
    absl::Span<const float> current = w.values<float>();
    absl::Span<float> g = grad.mutable_values<float>();
    for (int64_t i = 0; i < kDim; ++i) g[i] = current[i] - kTarget;
    PS_RETURN_IF_ERROR(client->PushPull("w", grad, &w));
    PS_RETURN_IF_ERROR(client->PushPull("count", minus_one, &count));
    ++steps;
    if (steps % kReportEvery == 0) {
      std::printf("step %d\n", steps);
      std::fflush(stdout);
    }
    if (steps >= min_steps && !stop_file.empty() && access(stop_file.c_str(), F_OK) == 0) break;
    if (steps >= max_steps) {
      return absl::DeadlineExceededError(
          absl::StrCat("no stop file ", stop_file, " after ", steps, " steps"));
    }
  }
  std::printf("done steps=%d\n", steps);
  return absl::OkStatus();
}

absl::Status Check() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  PS_ASSIGN_OR_RETURN(Tensor w, client->GetParam("w"));
  PS_ASSIGN_OR_RETURN(Tensor count, client->GetParam("count"));
  absl::Span<const float> c = count.values<float>();
  const bool uniform = std::all_of(c.begin(), c.end(), [&](float v) { return v == c[0]; });
  float max_error = 0;
  for (float v : w.values<float>()) max_error = std::max(max_error, std::fabs(v - kTarget));
  std::printf("count=%.0f uniform=%d maxerr=%g\n", c[0], uniform ? 1 : 0, max_error);
  return absl::OkStatus();
}

absl::Status WaitCount() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  const double above = absl::GetFlag(FLAGS_count_above);
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_seconds));
  float seen = 0;
  while (absl::Now() < deadline) {
    CallOptions call;
    call.deadline = deadline;
    PS_ASSIGN_OR_RETURN(Tensor count, client->GetParam("count", call));
    seen = count.values<float>()[0];
    if (seen > above) {
      std::printf("count=%.0f\n", seen);
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("count stayed at ", seen, " (not above ", above,
                                                  ") for ", absl::GetFlag(FLAGS_wait_seconds),
                                                  " s: training stopped"));
}

// "workers=<ids> servers=<indices>", both sorted.
absl::StatusOr<std::string> Members(EtcdClient& etcd) {
  PS_ASSIGN_OR_RETURN(std::vector<KeyValue> workers, etcd.GetPrefix(etcd_keys::WorkersPrefix()));
  PS_ASSIGN_OR_RETURN(std::vector<KeyValue> servers, etcd.GetPrefix(etcd_keys::ServersPrefix()));
  std::vector<std::string> ids, indices;
  for (const KeyValue& kv : workers) {
    absl::StatusOr<etcd_keys::ParsedKey> key = etcd_keys::Parse(kv.key);
    if (key.ok()) ids.push_back(key->worker_id);
  }
  for (const KeyValue& kv : servers) {
    absl::StatusOr<uint32_t> index = etcd_keys::ParseServerKey(kv.key);
    if (index.ok()) indices.push_back(absl::StrCat(*index));
  }
  std::sort(ids.begin(), ids.end());
  std::sort(indices.begin(), indices.end());
  return absl::StrCat("workers=", absl::StrJoin(ids, ","),
                      " servers=", absl::StrJoin(indices, ","));
}

absl::Status WaitMembers() {
  EtcdClientOptions options;
  options.endpoints = Endpoints();
  options.prefix = etcd_keys::ClusterPrefix(absl::GetFlag(FLAGS_cluster));
  options.timeout = absl::Seconds(2);
  options.tls = EtcdTls();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(options));
  const std::string expected = absl::StrCat("workers=", absl::GetFlag(FLAGS_expect_workers),
                                            " servers=", absl::GetFlag(FLAGS_expect_servers));
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_seconds));
  std::string seen = "nothing read";
  bool written = !absl::GetFlag(FLAGS_write_probe);
  while (absl::Now() < deadline) {
    if (!written) {
      const absl::Status put = etcd->Put("/probe", absl::FormatTime(absl::Now()));
      written = put.ok();
      if (!written) seen = absl::StrCat("writing /probe: ", put.ToString());
    }
    absl::StatusOr<std::string> members = Members(*etcd);
    if (written) seen = members.ok() ? *members : members.status().ToString();
    if (written && seen == expected) {
      std::printf("members %s\n", seen.c_str());
      return absl::OkStatus();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(absl::StrCat("etcd did not show ", expected, " within ",
                                                  absl::GetFlag(FLAGS_wait_seconds),
                                                  " s; last seen: ", seen));
}

// ---- the ledger (replication partition tests) ----------------------------------

// Step s's gradient: -1 at element s alone (the parameter gains 1 there).
Tensor OneHot(int64_t s) {
  std::vector<float> values(absl::GetFlag(FLAGS_width), 0.0f);
  values[s] = -1.0f;
  return Tensor::FromValues<float>({absl::GetFlag(FLAGS_width)}, values);
}

absl::Status InitLedger() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  const Tensor zeros = Tensor::FromValues<float>(
      {absl::GetFlag(FLAGS_width)}, std::vector<float>(absl::GetFlag(FLAGS_width), 0.0f));
  for (absl::string_view name : absl::StrSplit(absl::GetFlag(FLAGS_params), ',', absl::SkipEmpty())) {
    PS_RETURN_IF_ERROR(client->InitParam(std::string(name), zeros, Sgd(1.0f)));
  }
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  std::printf("initialized\n");
  return absl::OkStatus();
}

// Steps 0, 1, ... until the stop file exists (after min_steps) or the ledger
// is full; each prints "ack <s>" once acknowledged, or with --fail_ok
// "fail <s>: <status>" when the call failed (every retry within
// --timeout_seconds). Ends with "done acks=<n> fails=<n>".
absl::Status Ledger() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  const std::string param = absl::GetFlag(FLAGS_param);
  const std::string stop_file = absl::GetFlag(FLAGS_stop_file);
  const int64_t width = absl::GetFlag(FLAGS_width);
  auto stopped = [&] { return !stop_file.empty() && access(stop_file.c_str(), F_OK) == 0; };
  int64_t step = 0, acks = 0, fails = 0;
  for (; step < width; ++step) {
    if (step >= absl::GetFlag(FLAGS_min_steps) && stopped()) break;
    const absl::Status status = client->SendGrad(param, OneHot(step));
    if (status.ok()) {
      ++acks;
      std::printf("ack %lld\n", static_cast<long long>(step));
    } else if (absl::GetFlag(FLAGS_fail_ok)) {
      ++fails;
      std::printf("fail %lld: %s\n", static_cast<long long>(step), status.ToString().c_str());
    } else {
      return absl::Status(status.code(), absl::StrCat("step ", step, ": ", status.message()));
    }
    std::fflush(stdout);
    absl::SleepFor(absl::Milliseconds(absl::GetFlag(FLAGS_pause_ms)));
  }
  // Full: wait (bounded) for the stop file, so that the test decides when.
  for (int wait = 0; step >= width && !stopped(); ++wait) {
    if (wait >= 3000) return absl::DeadlineExceededError("the ledger is full and no stop file came");
    absl::SleepFor(absl::Milliseconds(100));
  }
  std::printf("done acks=%lld fails=%lld\n", static_cast<long long>(acks),
              static_cast<long long>(fails));
  return absl::OkStatus();
}

absl::Status LedgerValues() {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(false));
  PS_ASSIGN_OR_RETURN(Tensor value, client->GetParam(absl::GetFlag(FLAGS_param)));
  std::string line = "values";
  for (float v : value.values<float>()) absl::StrAppend(&line, " ", v);
  std::printf("%s\n", line.c_str());
  return absl::OkStatus();
}

// One SendGrad of zeros straight to --address over gRPC, no retries, 10 s
// deadline: what a client still holding that address gets. Prints
// "raw_push: <status>" and exits 0 whatever the answer.
absl::Status RawPush() {
  auto stub = v1::ParameterServer::NewStub(
      grpc::CreateChannel(absl::GetFlag(FLAGS_address), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::SendGradRequest request;
  v1::Gradient* grad = request.mutable_gradient();
  grad->set_name(absl::GetFlag(FLAGS_param));
  grad->set_element_type(v1::FLOAT32);
  const Tensor zeros = Tensor::FromValues<float>(
      {absl::GetFlag(FLAGS_width)}, std::vector<float>(absl::GetFlag(FLAGS_width), 0.0f));
  grad->set_content(std::string(zeros.bytes()));
  v1::SendGradResponse response;
  const grpc::Status status = stub->SendGrad(&context, request, &response);
  const std::string answer =
      status.ok() ? "OK"
                  : absl::StrCat("error ", static_cast<int>(status.error_code()), ": ",
                                 status.error_message());
  std::printf("raw_push: %s\n", answer.c_str());
  return absl::OkStatus();
}

// /shards/0, /ps/0 and the epoch of /checkpoints/0 (-1: none), once they
// match --expect_replicas, --expect_holder and --expect_checkpoint_epoch
// (within --wait_seconds).
absl::Status Shard() {
  EtcdClientOptions options;
  options.endpoints = Endpoints();
  options.prefix = etcd_keys::ClusterPrefix(absl::GetFlag(FLAGS_cluster));
  options.timeout = absl::Seconds(2);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<EtcdClient> etcd, EtcdClient::Connect(options));
  const int replicas = absl::GetFlag(FLAGS_expect_replicas);
  const std::string holder = absl::GetFlag(FLAGS_expect_holder);
  const int64_t checkpoint_epoch = absl::GetFlag(FLAGS_expect_checkpoint_epoch);
  const absl::Time deadline = absl::Now() + absl::Seconds(absl::GetFlag(FLAGS_wait_seconds));
  std::string seen = "nothing read";
  while (absl::Now() < deadline) {
    absl::StatusOr<KeyValue> shard = etcd->Get(etcd_keys::ShardKey(0));
    absl::StatusOr<KeyValue> ps = etcd->Get(etcd_keys::ServerKey(0));
    absl::StatusOr<KeyValue> checkpoint = etcd->Get(etcd_keys::CheckpointKey(0));
    v1::CheckpointRecord record;
    const int64_t published =
        checkpoint.ok() && ParseJsonRecord(checkpoint->value, 1 << 16, &record).empty()
            ? static_cast<int64_t>(record.epoch())
            : -1;
    absl::StatusOr<v1::ShardConfig> config =
        shard.ok() ? ParseShardConfig(0, shard->value) : absl::StatusOr<v1::ShardConfig>(shard.status());
    if (config.ok()) {
      std::string address = "none";
      if (ps.ok()) {
        absl::StatusOr<etcd_keys::ServerEntry> entry = etcd_keys::ParseServerValue(ps->value);
        if (entry.ok()) address = entry->address;
      }
      seen = absl::StrCat("holder=", config->holder(), " epoch=", config->epoch(),
                          " replicas=", absl::StrJoin(config->replicas(), ","), " ps=", address,
                          " checkpoint_epoch=", published);
      if ((replicas < 0 || config->replicas_size() == replicas) &&
          (holder.empty() || config->holder() == holder) &&
          (checkpoint_epoch < 0 || published == checkpoint_epoch) && ps.ok()) {
        std::printf("%s\n", seen.c_str());
        return absl::OkStatus();
      }
    } else {
      seen = config.status().ToString();
    }
    absl::SleepFor(absl::Milliseconds(100));
  }
  return absl::DeadlineExceededError(
      absl::StrCat("/shards/0 did not match within ", absl::GetFlag(FLAGS_wait_seconds),
                   " s; last seen: ", seen));
}

absl::Status Run() {
  const std::string mode = absl::GetFlag(FLAGS_mode);
  if (mode == "raw_push") return RawPush();
  if (Endpoints().empty()) return absl::InvalidArgumentError("--etcd is required");
  if (mode == "init") return Init();
  if (mode == "train") return Train();
  if (mode == "check") return Check();
  if (mode == "wait_members") return WaitMembers();
  if (mode == "wait_count") return WaitCount();
  if (mode == "push") return PushOnce();
  if (mode == "init_ledger") return InitLedger();
  if (mode == "ledger") return Ledger();
  if (mode == "ledger_values") return LedgerValues();
  if (mode == "shard") return Shard();
  return absl::InvalidArgumentError(absl::StrCat("unknown --mode=", mode));
}

}  // namespace
}  // namespace pserver::multihost

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const absl::Status status = pserver::multihost::Run();
  if (!status.ok()) {
    std::fprintf(stderr, "multihost_trainer: %s\n", status.ToString().c_str());
    return 1;
  }
  std::fflush(stdout);
  return 0;
}
