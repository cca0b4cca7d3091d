#include "elastic_group.h"

#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "cc/core/tensor.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/server/move_coordinator.h"
#include "cc/testing/child_process.h"
#include "params.h"

namespace pserver::bench {
namespace {

constexpr uint64_t kKiB = 1 << 10;
constexpr uint64_t kMiB = 1 << 20;
constexpr char kCluster[] = "elastic";
constexpr absl::Duration kWait = absl::Seconds(180);

struct Model {
  int params = 0;
  uint64_t param_bytes = 0;
  uint64_t block_bytes = 0;
  int steps = 0;  // measured per phase
  uint64_t bytes() const { return static_cast<uint64_t>(params) * param_bytes; }
};

Model ModelFor(const Harness& h) {
  if (h.quick()) return {.params = 16, .param_bytes = kMiB, .block_bytes = 64 * kKiB, .steps = 3};
  return {.params = 64, .param_bytes = 16 * kMiB, .block_bytes = kMiB, .steps = 8};
}

// The peak resident set (VmHWM) of process `pid`; 0 once it is gone.
// A /proc/<pid>/status field in bytes ("VmHWM": peak RSS, "VmRSS": now).
uint64_t StatusBytes(pid_t pid, const std::string& field) {
  std::ifstream status(absl::StrCat("/proc/", pid, "/status"));
  const std::string prefix = field + ":";
  for (std::string line; std::getline(status, line);) {
    if (line.rfind(prefix, 0) == 0) return std::stoull(line.substr(prefix.size())) * 1024;
  }
  return 0;
}
uint64_t PeakRssBytes(pid_t pid) { return StatusBytes(pid, "VmHWM"); }

// pserver processes with --placement_redirects, registered in a fresh etcd.
// Every process left is stopped (SIGTERM, by PID) when this goes.
class ElasticCluster {
 public:
  static absl::StatusOr<std::unique_ptr<ElasticCluster>> Start(const std::string& binary,
                                                               int servers) {
    std::unique_ptr<ElasticCluster> cluster(new ElasticCluster(binary));
    PS_ASSIGN_OR_RETURN(cluster->etcd_, testing::EtcdProcess::Start());
    for (int i = 0; i < servers; ++i) {
      PS_ASSIGN_OR_RETURN(std::unique_ptr<ChildProcess> child,
                          cluster->Spawn(absl::StrCat("--num_servers=", servers)));
      PS_RETURN_IF_ERROR(WaitForPserverAddress(*child, i, absl::Now() + kWait).status());
      cluster->processes_[i] = std::move(child);
    }
    return cluster;
  }

  ~ElasticCluster() {
    for (auto& [index, child] : processes_) kill(child->pid(), SIGTERM);
    for (auto& [index, child] : processes_) {
      (void)child->WaitForExit(absl::Now() + absl::Seconds(30));
    }
  }

  // Starts a server that takes the count from /ps_desired: it waits for a
  // free index, and claims one once a move to more servers began. Call
  // Joined(index) once the move is done.
  absl::Status Join() {
    PS_ASSIGN_OR_RETURN(joining_, Spawn(""));
    return absl::OkStatus();
  }
  absl::Status Joined(uint32_t index) {
    if (joining_ == nullptr) return absl::FailedPreconditionError("no server is joining");
    PS_RETURN_IF_ERROR(WaitForPserverAddress(*joining_, index, absl::Now() + kWait).status());
    processes_[index] = std::move(joining_);
    return absl::OkStatus();
  }
  // Waits for server `index`, left out by a move, to exit by itself.
  absl::Status Departed(uint32_t index) {
    auto it = processes_.find(index);
    if (it == processes_.end()) return absl::NotFoundError(absl::StrCat("no server ", index));
    SamplePeakRss();
    PS_ASSIGN_OR_RETURN(int status, it->second->WaitForExit(absl::Now() + kWait));
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      return absl::InternalError(absl::StrCat("departing server ", index, " ",
                                              DescribeWaitStatus(status), ":\n",
                                              it->second->output()));
    }
    processes_.erase(it);
    return absl::OkStatus();
  }

  // Every running server's RSS now (VmRSS), by index.
  std::map<uint32_t, uint64_t> RssNow() const {
    std::map<uint32_t, uint64_t> rss;
    for (const auto& [index, child] : processes_) rss[index] = StatusBytes(child->pid(), "VmRSS");
    return rss;
  }

  // Records every running server's VmHWM; the largest seen so far.
  uint64_t SamplePeakRss() {
    for (const auto& [index, child] : processes_) {
      peak_rss_ = std::max(peak_rss_, PeakRssBytes(child->pid()));
    }
    return peak_rss_;
  }

  absl::StatusOr<std::unique_ptr<Client>> Connect(const Model& model) const {
    ClientOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.block_bytes = model.block_bytes;
    options.timeout = kWait;
    options.discovery_timeout = kWait;
    return Client::Connect(options);
  }

  ScaleOptions Scale(uint32_t to) const {
    ScaleOptions options;
    options.etcd_endpoints = {etcd_->endpoint()};
    options.cluster = kCluster;
    options.to = to;
    options.timeout = absl::Minutes(10);
    options.progress = [](const std::string& line) { std::printf("elastic: %s\n", line.c_str()); };
    return options;
  }

 private:
  explicit ElasticCluster(std::string binary) : binary_(std::move(binary)) {}

  absl::StatusOr<std::unique_ptr<ChildProcess>> Spawn(const std::string& count_flag) {
    std::vector<std::string> flags = {"--host=127.0.0.1",
                                      "--port=0",
                                      "--etcd=" + etcd_->endpoint(),
                                      absl::StrCat("--cluster=", kCluster),
                                      "--lease_ttl=5",
                                      "--register_timeout=600",
                                      "--placement_redirects"};
    if (!count_flag.empty()) flags.push_back(count_flag);
    return ChildProcess::Spawn(binary_, flags);
  }

  std::string binary_;
  std::unique_ptr<testing::EtcdProcess> etcd_;
  std::map<uint32_t, std::unique_ptr<ChildProcess>> processes_;  // by index
  std::unique_ptr<ChildProcess> joining_;
  uint64_t peak_rss_ = 0;
};

// When one step (SendGrads of the whole model) began and ended (NowSeconds).
struct Step {
  double begin = 0;
  double end = 0;
};

// Steps the model in a thread, one after another, recording each.
class StepTrainer {
 public:
  StepTrainer(Client& client, const Model& model) : client_(client) {
    for (int p = 0; p < model.params; ++p) {
      grads_.push_back({absl::StrCat("elastic", p), Filled(model.param_bytes, 0.5f)});
    }
  }
  ~StepTrainer() { Stop().IgnoreError(); }

  absl::Status Init(const Model& model) {
    for (const NamedTensor& g : grads_) {
      PS_RETURN_IF_ERROR(client_.InitParam(g.name, Filled(model.param_bytes, 1.0f), Sgd()));
    }
    PS_RETURN_IF_ERROR(client_.FinishInitParams());
    thread_ = std::thread([this] {
      while (true) {
        {
          absl::MutexLock lock(&mu_);
          if (stop_) return;
        }
        const double begin = NowSeconds();
        absl::Status step = client_.SendGrads(grads_);
        absl::MutexLock lock(&mu_);
        if (!step.ok()) {
          status_ = step;
          return;
        }
        steps_.push_back({begin, NowSeconds()});
      }
    });
    return absl::OkStatus();
  }

  // Waits until `n` steps that began at or after `after` have ended; returns them.
  absl::StatusOr<std::vector<Step>> StepsFrom(double after, int n) {
    absl::MutexLock lock(&mu_);
    auto count = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return std::count_if(steps_.begin(), steps_.end(),
                           [&](const Step& s) { return s.begin >= after; });
    };
    auto done = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !status_.ok() || count() >= n; };
    if (!mu_.AwaitWithDeadline(absl::Condition(&done), absl::Now() + kWait)) {
      return absl::DeadlineExceededError(absl::StrCat("the trainer made ", count(), " of ", n,
                                                      " steps in ", absl::FormatDuration(kWait)));
    }
    PS_RETURN_IF_ERROR(status_);
    std::vector<Step> out;
    for (const Step& s : steps_) {
      if (s.begin >= after && static_cast<int>(out.size()) < n) out.push_back(s);
    }
    return out;
  }

  // The steps that overlapped [from, to] (all of them have ended).
  std::vector<Step> Overlapping(double from, double to) {
    absl::MutexLock lock(&mu_);
    std::vector<Step> out;
    for (const Step& s : steps_) {
      if (s.begin < to && s.end > from) out.push_back(s);
    }
    return out;
  }

  absl::Status Stop() {
    {
      absl::MutexLock lock(&mu_);
      stop_ = true;
    }
    if (thread_.joinable()) thread_.join();
    absl::MutexLock lock(&mu_);
    return status_;
  }

 private:
  Client& client_;
  std::vector<NamedTensor> grads_;
  std::thread thread_;
  absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<Step> steps_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

// Step times as result `name`: seconds, with p50_s and p99_s.
void AddSteps(Harness& h, const std::string& name, const Model& model, uint32_t servers,
              const std::vector<Step>& steps) {
  std::vector<double> seconds;
  for (const Step& s : steps) seconds.push_back(s.end - s.begin);
  Result& r = h.Add("elastic", name);
  r.set_payload_bytes(model.bytes());
  r.set_servers(servers);
  r.set_workers(1);
  r.set_unit("s");
  r.set_repetitions(static_cast<uint32_t>(seconds.size()));
  *r.mutable_value() = Summarize(seconds);
  (*r.mutable_extra())["p50_s"] = Percentile(seconds, 50);
  (*r.mutable_extra())["p99_s"] = Percentile(seconds, 99);
}

uint64_t SelfPeakRssBytes() {
  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;
}

// One move from `from` to `to` servers under the running trainer, measured:
// the steps before, during and after it, and the move itself (from the
// coordinator's call until every old owner has handed its blocks over).
//
// Shrinking, the trainer steps on throughout: a request it sends under the
// moving placement to a departing server is redirected by that server while
// it lingers (pserver --depart_linger_seconds, 5 s by default).
absl::Status MeasureMove(Harness& h, const Model& model, ElasticCluster& cluster,
                         StepTrainer& trainer, uint32_t from, uint32_t to,
                         const std::string& prefix) {
  PS_ASSIGN_OR_RETURN(std::vector<Step> before, trainer.StepsFrom(NowSeconds(), model.steps));
  if (to > from) PS_RETURN_IF_ERROR(cluster.Join());  // waits for the move to claim its index
  ScaleOptions scale = cluster.Scale(to);
  uint32_t handed = 0;
  double handed_over = 0;
  scale.progress = [&, print = scale.progress](const std::string& line) {
    print(line);
    if (absl::StartsWith(line, "server ") && absl::StrContains(line, ": handed over ") &&
        ++handed == from) {
      handed_over = NowSeconds();
    }
  };
  const double begin = NowSeconds();
  absl::StatusOr<ScaleResult> scaled = ScaleCluster(scale);
  const double end = NowSeconds();
  PS_RETURN_IF_ERROR(scaled.status());
  const ScaleResult& moved = *scaled;
  const uint64_t server_peak = cluster.SamplePeakRss();
  for (uint32_t index = from; index < to; ++index) PS_RETURN_IF_ERROR(cluster.Joined(index));
  PS_ASSIGN_OR_RETURN(std::vector<Step> after, trainer.StepsFrom(end, model.steps));
  for (uint32_t index = to; index < from; ++index) PS_RETURN_IF_ERROR(cluster.Departed(index));
  // After the steps on the stable placement: each old owner dropped what
  // it handed over once it saw it (BlockMover::DropHandedOver).
  const std::map<uint32_t, uint64_t> rss_after = cluster.RssNow();
  const std::vector<Step> during = trainer.Overlapping(begin, handed_over);
  if (!moved.moved || handed != from || during.empty()) {
    return absl::InternalError(absl::StrCat(
        "elastic: the move from ", from, " to ", to, moved.moved ? " moved" : " moved nothing",
        ", ", handed, " servers handed over, ", during.size(), " steps during it"));
  }
  AddSteps(h, prefix + "_step_before", model, from, before);
  AddSteps(h, prefix + "_step_during", model, std::max(from, to), during);
  AddSteps(h, prefix + "_step_after", model, to, after);

  const double seconds = handed_over - begin;
  const double fraction =
      static_cast<double>(moved.bytes_moved) / static_cast<double>(model.bytes());
  const double ideal = static_cast<double>(from > to ? from - to : to - from) /
                       static_cast<double>(std::max(from, to));
  Result& r = h.Add("elastic", prefix + "_move");
  r.set_payload_bytes(model.bytes());
  r.set_servers(to);
  r.set_workers(1);
  r.set_unit("s");
  r.set_repetitions(1);
  r.mutable_value()->set_min(seconds);
  r.mutable_value()->set_median(seconds);
  r.mutable_value()->set_max(seconds);
  auto& extra = *r.mutable_extra();
  extra["from"] = from;
  extra["to"] = to;
  extra["bytes_moved"] = static_cast<double>(moved.bytes_moved);
  extra["blocks_moved"] = static_cast<double>(moved.blocks_moved);
  extra["fraction_moved"] = fraction;
  extra["ideal_fraction"] = ideal;
  extra["x_ideal"] = fraction / ideal;
  extra["moved_GB_per_s"] = static_cast<double>(moved.bytes_moved) / seconds / 1e9;
  extra["call_s"] = end - begin;  // the whole ScaleCluster call
  extra["server_peak_rss_bytes"] = static_cast<double>(server_peak);
  extra["bench_peak_rss_bytes"] = static_cast<double>(SelfPeakRssBytes());
  std::string after_text;
  for (const auto& [index, bytes] : rss_after) {
    extra[absl::StrCat("server", index, "_rss_after_bytes")] = static_cast<double>(bytes);
    absl::StrAppend(&after_text, after_text.empty() ? "" : ", ", "server ", index, " ",
                    FormatBytes(bytes));
  }
  std::printf("elastic %u -> %u: RSS after the move: %s\n", from, to, after_text.c_str());
  std::printf(
      "elastic %u -> %u: %.2f s, moved %s (%.3f of the model, ideal %.3f, %.2fx); "
      "peak RSS: largest server %s, bench %s\n",
      from, to, seconds, FormatBytes(moved.bytes_moved).c_str(), fraction, ideal, fraction / ideal,
      FormatBytes(server_peak).c_str(), FormatBytes(SelfPeakRssBytes()).c_str());
  return absl::OkStatus();
}

}  // namespace

absl::Status ElasticGroup(Harness& h, const std::string& pserver_binary) {
  const Model model = ModelFor(h);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<ElasticCluster> cluster,
                      ElasticCluster::Start(pserver_binary, 2));
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, cluster->Connect(model));
  auto trainer = std::make_unique<StepTrainer>(*client, model);
  PS_RETURN_IF_ERROR(trainer->Init(model));
  PS_RETURN_IF_ERROR(MeasureMove(h, model, *cluster, *trainer, 2, 3, "grow"));
  PS_RETURN_IF_ERROR(MeasureMove(h, model, *cluster, *trainer, 3, 2, "shrink"));
  PS_RETURN_IF_ERROR(trainer->Stop());
  h.PrintGroup("elastic");
  return absl::OkStatus();
}

}  // namespace pserver::bench
