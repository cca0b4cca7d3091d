// A primary's host partitioned away (docs/replication.md, "Failure cases"):
// etcd, the primary with a trainer beside it, its standby, and a second
// trainer, each host a network namespace (cc/testing/netns.h); every process
// a real binary started and stopped by PID. The primary's host is cut off
// (its link down): the trainer beside it still reaches it, nothing else
// does. The trainers keep ledgers (tests/multihost_trainer.cc: step s adds 1
// at element s of the trainer's own parameter), so the final state says,
// push by push, what was applied: every push a trainer saw acknowledged must
// be there exactly once, wherever it was acknowledged. Every wait is on a
// condition with a generous deadline; nothing asserts on time. Needs
// CAP_NET_ADMIN (root); skips with the reason otherwise.
#include <signal.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/child_process.h"
#include "cc/testing/netns.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::EtcdProcess;
using ::pserver::testing::EtcdProcessOptions;
using ::testing::ContainsRegex;
using ::testing::HasSubstr;

// Hosts. The primary and the trainer beside it share host kPrimaryHost: the
// cut leaves them reaching each other and nothing else.
constexpr int kEtcdHost = 0;
constexpr int kPrimaryHost = 1;
constexpr int kStandbyHost = 2;
constexpr int kHealthyHost = 3;  // the other trainer, and the test's observer
constexpr int kHosts = 4;
constexpr int kServerPort = 7000;
constexpr int kEtcdClientPort = 2379;
constexpr int kEtcdPeerPort = 2380;
constexpr char kCluster[] = "partition";
constexpr char kLedgerWidth[] = "--width=16384";
// Every wait: long enough for a loaded machine, short enough to fail clearly.
constexpr absl::Duration kWait = absl::Seconds(120);

std::string Absolute(const std::string& runfile) {
  return std::filesystem::absolute(RunfilesPath(runfile)).string();
}

// "key=value" fields of a line printed by `multihost_trainer --mode=shard`.
std::string Field(const std::string& line, const std::string& key) {
  for (absl::string_view field : absl::StrSplit(absl::StripAsciiWhitespace(line), ' ')) {
    if (absl::ConsumePrefix(&field, key + "=")) return std::string(field);
  }
  return "";
}

// The steps of the ledger trainer's output lines "<kind> <s>..." (kind "ack"
// or "fail").
std::set<int> Steps(const ChildProcess& trainer, absl::string_view kind) {
  std::set<int> steps;
  for (absl::string_view line : absl::StrSplit(trainer.out(), '\n')) {
    if (!absl::ConsumePrefix(&line, kind) || !absl::ConsumePrefix(&line, " ")) continue;
    int step = 0;
    if (absl::SimpleAtoi(line.substr(0, line.find(':')), &step)) steps.insert(step);
  }
  return steps;
}

// Every file under `dir`.
std::set<std::string> FilesUnder(const std::string& dir) {
  std::set<std::string> files;
  std::error_code ec;
  for (auto it = std::filesystem::recursive_directory_iterator(dir, ec);
       !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec)) {
    files.insert(it->path().string());
  }
  return files;
}

class ReplicationPartitionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (absl::Status supported = NetnsSupported(); !supported.ok()) {
      GTEST_SKIP() << "network namespaces unavailable: " << supported.message();
    }
    NetnsOptions options;
    options.hosts = kHosts;
    options.command_timeout = kWait;
    ASSERT_OK_AND_ASSIGN(net_, NetnsCluster::Create(options));
    ASSERT_OK_AND_ASSIGN(const std::string ip, FindProgram("ip"));
    trainer_ = Absolute("tests/multihost_trainer");
    const char* tmp = std::getenv("TEST_TMPDIR");
    files_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", net_->prefix());
    endpoint_ = absl::StrCat(net_->address(kEtcdHost), ":", kEtcdClientPort);
    EtcdProcessOptions etcd;
    etcd.name = "e0";
    etcd.host = net_->address(kEtcdHost);
    etcd.client_port = kEtcdClientPort;
    etcd.peer_port = kEtcdPeerPort;
    etcd.exec_prefix = {ip, "netns", "exec", net_->name(kEtcdHost)};
    etcd.cluster_token = net_->prefix();
    etcd.wait_until_serving = false;  // this process cannot reach its address
    ASSERT_OK_AND_ASSIGN(etcd_, EtcdProcess::Start(etcd));
    // etcd serves (seen from the healthy host): an empty membership.
    ASSERT_OK(Observe(kHealthyHost, {"--mode=wait_members", "--expect_workers=",
                                     "--expect_servers=", "--wait_seconds=100"})
                  .status())
        << etcd_->LogTail();
  }

  // Runs the trainer binary on `host` with `args` (and etcd's endpoint, the
  // cluster): its stdout.
  absl::StatusOr<std::string> Observe(int host, std::vector<std::string> args) {
    args.push_back("--etcd=" + endpoint_);
    args.push_back(absl::StrCat("--cluster=", kCluster));
    return net_->Run(host, trainer_, args);
  }

  // A pserver on `host`, one shard, lease 2 s, checkpoints every 0.5 s in a
  // directory of its own (`name`), accepting standbys; `extra` flags after.
  absl::StatusOr<ChildProcess*> StartServer(int host, const std::string& name,
                                            const std::vector<std::string>& extra) {
    std::vector<std::string> flags = {
        "--host=" + net_->address(host),    absl::StrCat("--port=", kServerPort),
        "--etcd=" + endpoint_,              absl::StrCat("--cluster=", kCluster),
        "--num_servers=1",                  "--lease_ttl=2",
        "--register_timeout=60",            "--accept_standbys",
        "--checkpoint_dir=" + CheckpointDir(name), "--checkpoint_interval=0.5"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    return net_->Spawn(host, Absolute("cc/server/pserver"), flags);
  }

  std::string CheckpointDir(const std::string& name) const {
    return absl::StrCat(files_, "-", name);
  }

  // A ledger trainer on `host` pushing to `param` until the stop file exists.
  absl::StatusOr<ChildProcess*> StartLedger(int host, const std::string& param,
                                            const std::vector<std::string>& extra) {
    std::vector<std::string> args = {"--mode=ledger", "--param=" + param, kLedgerWidth,
                                     "--stop_file=" + StopFile(), "--min_steps=0",
                                     "--etcd=" + endpoint_, absl::StrCat("--cluster=", kCluster)};
    args.insert(args.end(), extra.begin(), extra.end());
    return net_->Spawn(host, trainer_, args);
  }

  std::string StopFile() const { return files_ + "-stop"; }

  // Reads what each child has written so far (until a read brings nothing
  // more, at most 100 reads each).
  static void Pump(const std::vector<ChildProcess*>& children) {
    for (ChildProcess* child : children) {
      for (int i = 0; i < 100; ++i) {
        const size_t before = child->output().size();
        // No line starts with a NUL byte: this reads, waiting up to 20 ms.
        (void)child->WaitForLine(std::string(1, '\0'), absl::Now() + absl::Milliseconds(20));
        if (child->output().size() == before) break;
      }
    }
  }

  // Reads the children's output until `done()` holds; false at kWait.
  static bool PumpUntil(const std::vector<ChildProcess*>& children,
                        const std::function<bool()>& done) {
    const absl::Time deadline = absl::Now() + kWait;
    for (Pump(children); !done(); Pump(children)) {
      if (absl::Now() >= deadline) return false;
      absl::SleepFor(absl::Milliseconds(10));  // in case every child has exited
    }
    return true;
  }

  // The ledger `param` holds every step of `acked` exactly once, maybe
  // those of `maybe` (calls that failed: applied once or never), and
  // nothing else.
  void ExpectLedger(const std::string& param, const std::set<int>& acked,
                    const std::set<int>& maybe) {
    ASSERT_OK_AND_ASSIGN(std::string out,
                         Observe(kHealthyHost, {"--mode=ledger_values", "--param=" + param,
                                                kLedgerWidth}));
    std::vector<std::string> values = absl::StrSplit(absl::StripAsciiWhitespace(out), ' ');
    ASSERT_EQ(values.size(), 16385u) << out.substr(0, 200);
    ASSERT_EQ(values[0], "values");
    int lost = 0, doubled = 0, stray = 0;
    for (int s = 0; s < 16384; ++s) {
      const std::string& v = values[s + 1];
      if (acked.count(s) > 0) {
        if (v == "0") ++lost;
        if (v != "0" && v != "1") ++doubled;
      } else if (maybe.count(s) > 0) {
        if (v != "0" && v != "1") ++doubled;
      } else if (v != "0") {
        ++stray;
      }
    }
    EXPECT_EQ(lost, 0) << param << ": acknowledged pushes lost";
    EXPECT_EQ(doubled, 0) << param << ": pushes applied more than once";
    EXPECT_EQ(stray, 0) << param << ": pushes applied that no trainer made";
  }

  // Declared first, destroyed last: the namespaces outlive etcd, which the
  // EtcdProcess destructor stops by PID; the children die with net_.
  std::unique_ptr<NetnsCluster> net_;
  std::unique_ptr<EtcdProcess> etcd_;
  std::string trainer_, endpoint_, files_;
};

// The primary's host is cut off while a trainer beside it pushes: the
// primary can reach neither its standby nor etcd, so it acknowledges no
// write (its fence refuses once its lease is unconfirmed; a write it holds
// cannot reach the standby nor drop it); the standby takes over when the
// lease expires; the trainer on the healthy side goes on against it. When
// the link returns, the old primary steps down saying why and writes no
// checkpoint, the trainer beside it follows /ps/0 to the new primary, and
// each ledger holds every acknowledged push exactly once.
TEST_F(ReplicationPartitionTest, ACutOffPrimaryAcknowledgesNothingAndItsStandbyTakesOver) {
  ASSERT_OK_AND_ASSIGN(ChildProcess * primary, StartServer(kPrimaryHost, "primary", {}));
  ASSERT_OK_AND_ASSIGN(const std::string old_address,
                       WaitForPserverAddress(*primary, 0, absl::Now() + kWait));
  ASSERT_OK(Observe(kHealthyHost, {"--mode=init_ledger", "--params=a,b", kLedgerWidth}).status());
  ASSERT_OK_AND_ASSIGN(ChildProcess * standby,
                       StartServer(kStandbyHost, "standby", {"--standby"}));
  absl::StatusOr<std::string> attached =
      Observe(kHealthyHost, {"--mode=shard", "--expect_replicas=1", "--wait_seconds=100"});
  ASSERT_OK(attached.status()) << standby->output();
  const std::string standby_id = Field(*attached, "replicas");
  uint64_t epoch_before = 0;
  ASSERT_TRUE(absl::SimpleAtoi(Field(*attached, "epoch"), &epoch_before)) << *attached;

  // Trainer a beside the primary gives a call up after 4 s (then records
  // the step as failed and goes on); trainer b on the healthy side never.
  ASSERT_OK_AND_ASSIGN(ChildProcess * beside,
                       StartLedger(kPrimaryHost, "a", {"--fail_ok", "--timeout_seconds=4"}));
  ASSERT_OK_AND_ASSIGN(ChildProcess * healthy,
                       StartLedger(kHealthyHost, "b", {"--timeout_seconds=110"}));
  const std::vector<ChildProcess*> trainers = {beside, healthy};
  // Read with the trainers' output, so that their logs never fill a pipe.
  const std::vector<ChildProcess*> everyone = {beside, healthy, primary, standby};
  ASSERT_TRUE(PumpUntil(everyone, [&] {
    return Steps(*beside, "ack").size() >= 20 && Steps(*healthy, "ack").size() >= 20;
  })) << beside->output() << healthy->output();

  ASSERT_OK(net_->SetLinkUp(kPrimaryHost, false));

  // The lease runs out; the standby takes over and /ps/0 names it.
  absl::StatusOr<std::string> took_over =
      Observe(kHealthyHost, {"--mode=shard", "--expect_holder=" + standby_id,
                             "--wait_seconds=100"});
  ASSERT_OK(took_over.status()) << standby->output() << primary->output();
  uint64_t epoch_after = 0;
  ASSERT_TRUE(absl::SimpleAtoi(Field(*took_over, "epoch"), &epoch_after)) << *took_over;
  EXPECT_GT(epoch_after, epoch_before);
  EXPECT_EQ(Field(*took_over, "ps"), absl::StrCat(net_->address(kStandbyHost), ":", kServerPort));

  // The cut-off side acknowledges nothing: a push straight to the old
  // primary from beside it is refused, and trainer a's pushes fail while
  // trainer b's go on against the new primary.
  auto raw_push = [&] {
    return net_->Run(kPrimaryHost, trainer_,
                     {"--mode=raw_push", "--address=" + old_address, "--param=a", kLedgerWidth});
  };
  ASSERT_OK_AND_ASSIGN(std::string refused, raw_push());
  EXPECT_THAT(refused, HasSubstr("raw_push: error")) << "the cut-off primary acknowledged a push";
  Pump(everyone);
  const size_t beside_acks = Steps(*beside, "ack").size();
  const size_t beside_fails = Steps(*beside, "fail").size();
  const size_t healthy_acks = Steps(*healthy, "ack").size();
  ASSERT_TRUE(PumpUntil(everyone, [&] {
    return Steps(*beside, "fail").size() > beside_fails &&
           Steps(*healthy, "ack").size() >= healthy_acks + 20;
  })) << beside->output() << healthy->output();
  EXPECT_EQ(Steps(*beside, "ack").size(), beside_acks)
      << "a push was acknowledged on the cut-off side after the takeover";
  ASSERT_OK_AND_ASSIGN(refused, raw_push());
  EXPECT_THAT(refused, HasSubstr("raw_push: error")) << "the cut-off primary acknowledged a push";
  const std::set<std::string> checkpoints_when_cut = FilesUnder(CheckpointDir("primary"));

  ASSERT_OK(net_->SetLinkUp(kPrimaryHost, true));

  // The old primary learns of the new epoch and steps down (a push to it
  // says so, or its process says it replaced the server by a fresh
  // standby); no push to it is acknowledged meanwhile.
  bool stepped_down = false;
  for (const absl::Time deadline = absl::Now() + kWait; !stepped_down && absl::Now() < deadline;) {
    ASSERT_OK_AND_ASSIGN(refused, raw_push());
    ASSERT_THAT(refused, HasSubstr("raw_push: error")) << "the old primary acknowledged a push";
    stepped_down = absl::StrContains(refused, "stepped down from shard 0") ||
                   primary
                       ->WaitForLine("pserver 0: its server of shard 0 stepped down",
                                     absl::Now() + absl::Milliseconds(10))
                       .ok();
  }
  EXPECT_TRUE(stepped_down) << refused << primary->output();
  // Its process rejoins as the new primary's backup (listed one epoch up):
  // the shard has two copies again.
  ASSERT_OK(Observe(kHealthyHost, {"--mode=shard", "--expect_holder=" + standby_id,
                                   "--expect_replicas=1", "--wait_seconds=100"})
                .status());
  // Trainer a follows /ps/0 to the new primary and is acknowledged again.
  const size_t beside_acks_back = Steps(*beside, "ack").size();
  ASSERT_TRUE(PumpUntil(everyone, [&] {
    return Steps(*beside, "ack").size() >= beside_acks_back + 20;
  })) << beside->output();

  // Both stop cleanly; every push they saw acknowledged is in the new
  // primary's state once (the unacknowledged ones of trainer a once or
  // never), and nothing else.
  std::ofstream(StopFile()).close();
  for (ChildProcess* trainer : trainers) {
    ASSERT_OK_AND_ASSIGN(int status, trainer->WaitForExit(absl::Now() + kWait));
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << DescribeWaitStatus(status) << trainer->output();
  }
  EXPECT_FALSE(Steps(*beside, "fail").empty());
  EXPECT_TRUE(Steps(*healthy, "fail").empty());
  ExpectLedger("a", Steps(*beside, "ack"), Steps(*beside, "fail"));
  ExpectLedger("b", Steps(*healthy, "ack"), {});

  // The old primary's stepped-down server saved nothing, having said why
  // it stepped down (the new epoch), and the process went on as a fresh
  // standby (docs/replication.md), which saves nothing either and stops
  // cleanly at SIGTERM; no checkpoint was written after the takeover.
  ASSERT_EQ(kill(primary->pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(int status, primary->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << DescribeWaitStatus(status);
  EXPECT_THAT(primary->out(), HasSubstr("pserver 0: its server of shard 0 stepped down"));
  // Why: etcd names the new holder at the new epoch, a periodic checkpoint
  // begun before the fence lapsed had its publish refused, or its backup,
  // already the new primary, refused a write of the old epoch (whichever
  // the old primary hears first).
  EXPECT_THAT(primary->err(),
              ContainsRegex(absl::StrCat("stepping down: (etcd [^\n]* is at epoch ", epoch_after,
                                         "|publishing checkpoint [^\n]* was refused",
                                         "|a backup of shard 0 refused a write: [^\n]* older than "
                                         "this replica's epoch ",
                                         epoch_after, ")")));
  EXPECT_THAT(primary->err(), HasSubstr("no final checkpoint"));
  // The shard's published checkpoint is the new primary's (its periodic
  // ones, at the epoch that listed its new backup).
  EXPECT_OK(Observe(kHealthyHost, {"--mode=shard", "--expect_holder=" + standby_id,
                                   absl::StrCat("--expect_checkpoint_epoch=", epoch_after + 1),
                                   "--wait_seconds=100"})
                .status());
  // (A periodic save begun before the fence lapsed may have written one
  // more, unpublished; its publish is refused once etcd answers, and it is
  // deleted.)
  for (const std::string& file : FilesUnder(CheckpointDir("primary"))) {
    EXPECT_EQ(checkpoints_when_cut.count(file), 1u) << "written after the takeover: " << file;
  }
  // The new primary stops cleanly (a final checkpoint of its own).
  ASSERT_EQ(kill(standby->pid(), SIGTERM), 0);
  ASSERT_OK_AND_ASSIGN(status, standby->WaitForExit(absl::Now() + kWait));
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << DescribeWaitStatus(status) << standby->err();
  EXPECT_THAT(standby->err(), HasSubstr("saved checkpoint"));
}

}  // namespace
}  // namespace pserver
