// pserver on several hosts: a 3-member etcd cluster, 3 servers and 2 trainers,
// each in its own network namespace (cc/testing/netns.h), every process a
// real binary started by PID. The trainers (tests/multihost_trainer.cc) find
// the servers through etcd and train a deterministic model (w converges to
// its target whatever the interleaving; count is the number of steps
// applied), so each test ends by checking exact values: nothing lost, nothing
// applied twice. Faults are links taken down (NetnsCluster::SetLinkUp);
// every wait is bounded and fails saying what it waited for. Needs
// CAP_NET_ADMIN (root); skips with the reason otherwise.
#include <fcntl.h>
#include <unistd.h>

#include <array>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/testing/etcd_process.h"
#include "cc/testing/child_process.h"
#include "cc/testing/netns.h"
#include "cc/testing/run_program.h"
#include "cc/testing/status_matchers.h"
#include "cc/testing/test_certs.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::EtcdProcess;
using ::pserver::testing::EtcdProcessOptions;
using ::testing::HasSubstr;
using ::testing::Not;

// Hosts: etcd members, servers, trainers, and one observer that creates the
// parameters and reads etcd and the servers for the test.
constexpr int kEtcdHosts[] = {0, 1, 2};
constexpr int kServerHosts[] = {3, 4, 5};
constexpr int kTrainerHosts[] = {6, 7};
constexpr int kObserver = 8;
constexpr int kHosts = 9;
constexpr int kServerPort = 7000;
constexpr int kEtcdClientPort = 2379;
constexpr int kEtcdPeerPort = 2380;
constexpr char kTrainerIds[] = "t0,t1";
constexpr char kAllServers[] = "0,1,2";
// Every wait: long enough for a loaded machine, short enough to fail clearly.
constexpr absl::Duration kWait = absl::Seconds(120);

std::string Absolute(const std::string& runfile) {
  return std::filesystem::absolute(RunfilesPath(runfile)).string();
}

constexpr char kJob[] = "job-j";

class MultihostCluster {
 public:
  // Before Start: everything over mutual TLS with certificates of a test CA
  // (IP SANs of the hosts' addresses): etcd with --client-cert-auth, servers
  // of job kJob with roles from the certificates' CN (<role>.<job>), the
  // trainers and the observer as trainer.<kJob>.
  absl::Status Secure() {
    PS_ASSIGN_OR_RETURN(certs_, TestCerts::Create());
    PS_ASSIGN_OR_RETURN(ca_, certs_->AddCa("ca"));
    PS_ASSIGN_OR_RETURN(client_args_, ClientCertArgs(absl::StrCat("trainer.", kJob)));
    return absl::OkStatus();
  }

  // The trainer flags that present a certificate of `common_name` to the
  // servers and to etcd.
  absl::StatusOr<std::vector<std::string>> ClientCertArgs(const std::string& common_name) {
    CertRequest request;
    request.common_name = common_name;
    PS_ASSIGN_OR_RETURN(CertFiles files, ca_->Issue(common_name, request));
    return std::vector<std::string>{
        "--tls_cert=" + files.cert,      "--tls_key=" + files.key,
        "--tls_ca=" + ca_->cert_path(),  "--etcd_tls_ca=" + ca_->cert_path(),
        "--etcd_tls_cert=" + files.cert, "--etcd_tls_key=" + files.key};
  }

  // ipv6: the servers listen on :: and advertise their IPv6 addresses.
  absl::Status Start(bool ipv6) {
    NetnsOptions options;
    options.hosts = kHosts;
    options.command_timeout = kWait;
    if (ipv6) options.ipv6_prefix = "fd00:214::";
    PS_ASSIGN_OR_RETURN(net_, NetnsCluster::Create(options));
    PS_ASSIGN_OR_RETURN(const std::string ip, FindProgram("ip"));
    trainer_ = Absolute("tests/multihost_trainer");
    const char* tmp = std::getenv("TEST_TMPDIR");
    stop_file_ = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", net_->prefix(), "-stop");
    PS_RETURN_IF_ERROR(StartEtcd(ip));
    // Membership readable (a leader elected) and empty.
    absl::Status members =
        Observe({"--mode=wait_members", "--expect_workers=", "--expect_servers="}).status();
    if (!members.ok()) return WithEtcdLogs(members);
    for (int i = 0; i < 3; ++i) PS_RETURN_IF_ERROR(StartServer(i, ipv6));
    PS_RETURN_IF_ERROR(Observe({"--mode=init"}).status());
    for (int i = 0; i < 2; ++i) {
      PS_ASSIGN_OR_RETURN(
          trainers_[i],
          net_->Spawn(kTrainerHosts[i], trainer_,
                      Concat({"--etcd=" + endpoints_, absl::StrCat("--worker_id=t", i),
                              "--min_steps=300", "--stop_file=" + stop_file_},
                             client_args_)));
    }
    // Both trainers train: each has made its first report.
    for (ChildProcess* trainer : trainers_) {
      absl::StatusOr<std::string> step = trainer->WaitForLine("step ", absl::Now() + kWait);
      if (!step.ok()) return WithOutput(step.status(), "trainer", *trainer);
    }
    return absl::OkStatus();
  }

  NetnsCluster& net() { return *net_; }
  const std::vector<std::string>& server_addresses() const { return server_addresses_; }

  // Runs the trainer binary in the observer host with `args`; its stdout.
  absl::StatusOr<std::string> Observe(std::vector<std::string> args) {
    return ObserveAs(client_args_, std::move(args));
  }

  // Observe, presenting the credentials of `client_args` (ClientCertArgs).
  absl::StatusOr<std::string> ObserveAs(const std::vector<std::string>& client_args,
                                        std::vector<std::string> args) {
    args.push_back("--etcd=" + endpoints_);
    args.insert(args.end(), client_args.begin(), client_args.end());
    absl::StatusOr<std::string> out = net_->Run(kObserver, trainer_, args);
    if (!out.ok()) {
      return absl::Status(out.status().code(),
                          absl::StrCat("multihost_trainer ", absl::StrJoin(args, " "), ": ",
                                       out.status().message()));
    }
    return out;
  }

  // Waits until etcd lists exactly these workers and server indices; with
  // `write`, first writes a key (committed only with a quorum).
  absl::Status WaitMembers(const std::string& workers, const std::string& servers,
                           bool write = false) {
    return Observe({"--mode=wait_members", "--expect_workers=" + workers,
                    "--expect_servers=" + servers, "--wait_seconds=100",
                    write ? "--write_probe=true" : "--write_probe=false"})
        .status();
  }

  // The steps applied so far, as the servers hold them.
  absl::StatusOr<double> Count() {
    PS_ASSIGN_OR_RETURN(std::string out, Observe({"--mode=wait_count", "--count_above=-1"}));
    double count = 0;
    absl::string_view text = absl::StripAsciiWhitespace(out);
    if (!absl::ConsumePrefix(&text, "count=") || !absl::SimpleAtod(text, &count)) {
      return absl::InternalError(absl::StrCat("unexpected wait_count output: ", out));
    }
    return count;
  }

  // Waits until the servers have applied at least `more` steps beyond now:
  // training goes on.
  absl::Status WaitForProgress(int more) {
    PS_ASSIGN_OR_RETURN(double now, Count());
    return Observe({"--mode=wait_count", absl::StrCat("--count_above=", now + more),
                    "--wait_seconds=100"})
        .status();
  }

  // Tells the trainers to stop; both must end without an error. Then the
  // count on the servers is the sum of their steps, exactly, and w has
  // converged. The check's output, "count=<c> uniform=1 maxerr=<e>".
  void StopAndCheck() {
    const int fd = open(stop_file_.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
    ASSERT_GE(fd, 0) << stop_file_;
    close(fd);
    int total = 0;
    for (ChildProcess* trainer : trainers_) {
      ASSERT_OK_AND_ASSIGN(int status, trainer->WaitForExit(absl::Now() + kWait));
      ASSERT_EQ(status, 0) << "trainer " << DescribeWaitStatus(status) << ":\n"
                           << trainer->output();
      ASSERT_OK_AND_ASSIGN(std::string steps, trainer->WaitForLine("done steps=", absl::Now()));
      int n = 0;
      ASSERT_TRUE(absl::SimpleAtoi(steps, &n)) << steps;
      EXPECT_GE(n, 300);
      total += n;
    }
    ASSERT_OK_AND_ASSIGN(std::string check, Observe({"--mode=check"}));
    std::vector<std::string> fields = absl::StrSplit(absl::StripAsciiWhitespace(check), ' ');
    ASSERT_EQ(fields.size(), 3u) << check;
    EXPECT_EQ(fields[0], absl::StrCat("count=", total)) << "steps applied vs. steps made";
    EXPECT_EQ(fields[1], "uniform=1") << "every block of count holds the same value";
    double max_error = 1;
    ASSERT_TRUE(absl::SimpleAtod(absl::StripPrefix(fields[2], "maxerr="), &max_error)) << check;
    EXPECT_LT(max_error, 1e-3) << "w did not converge to its target";
  }

  // After StopAndCheck: every trainer's bulk calls went over the servers'
  // bulk channel, whose TCP port they dialled at the advertised address (the
  // Unix socket is out of reach in another namespace); a client that cannot
  // reach it says so on stderr and uses gRPC.
  void ExpectBulkChannelReached() const {
    for (const ChildProcess* trainer : trainers_) {
      EXPECT_THAT(trainer->err(), Not(HasSubstr("use gRPC"))) << trainer->err();
    }
  }

 private:
  absl::Status StartEtcd(const std::string& ip) {
    std::vector<std::string> members, endpoints;
    for (int i : kEtcdHosts) {
      members.push_back(absl::StrCat("e", i, "=http://", net_->address(i), ":", kEtcdPeerPort));
      endpoints.push_back(absl::StrCat(net_->address(i), ":", kEtcdClientPort));
    }
    endpoints_ = absl::StrJoin(endpoints, ",");
    for (int i : kEtcdHosts) {
      EtcdProcessOptions member;
      member.name = absl::StrCat("e", i);
      member.host = net_->address(i);
      member.client_port = kEtcdClientPort;
      member.peer_port = kEtcdPeerPort;
      member.exec_prefix = {ip, "netns", "exec", net_->name(i)};
      member.initial_cluster = absl::StrJoin(members, ",");
      member.cluster_token = net_->prefix();
      member.wait_until_serving = false;
      if (ca_ != nullptr) {
        PS_ASSIGN_OR_RETURN(CertFiles files, HostCert(absl::StrCat("etcd", i), i));
        member.tls = {files.cert, files.key, ca_->cert_path(), files.cert, files.key};
      }
      PS_ASSIGN_OR_RETURN(etcd_[i], EtcdProcess::Start(member));
    }
    return absl::OkStatus();
  }

  // Server i on its host, bound to every address and advertising the host's.
  // Started one after the other, server i claims index i.
  absl::Status StartServer(int i, bool ipv6) {
    const int host = kServerHosts[i];
    const std::string advertised = ipv6 ? net_->address6(host) : net_->address(host);
    std::vector<std::string> server_args;
    if (ca_ != nullptr) {
      PS_ASSIGN_OR_RETURN(CertFiles files, HostCert(absl::StrCat("pserver", i), host));
      server_args = {"--tls_cert=" + files.cert,      "--tls_key=" + files.key,
                     "--tls_ca=" + ca_->cert_path(),  "--etcd_tls_ca=" + ca_->cert_path(),
                     "--etcd_tls_cert=" + files.cert, "--etcd_tls_key=" + files.key,
                     absl::StrCat("--job=", kJob),    "--auth_cert_rule=cn:<role>.<job>"};
    }
    PS_ASSIGN_OR_RETURN(
        ChildProcess * server,
        net_->Spawn(host, Absolute("cc/server/pserver"),
                    Concat({ipv6 ? "--host=::" : "--host=0.0.0.0", "--advertise_host=" + advertised,
                            absl::StrCat("--port=", kServerPort), "--etcd=" + endpoints_,
                            "--cluster=multihost", "--num_servers=3", "--lease_ttl=2"},
                           server_args)));
    absl::StatusOr<std::string> address =
        WaitForPserverAddress(*server, static_cast<uint32_t>(i), absl::Now() + kWait);
    if (!address.ok()) return address.status();
    server_addresses_.push_back(*address);
    return absl::OkStatus();
  }

  // A certificate naming `host`'s address (a server's and etcd's).
  absl::StatusOr<CertFiles> HostCert(const std::string& name, int host) {
    CertRequest request;
    request.common_name = name;
    request.ip_addresses = {net_->address(host)};
    return ca_->Issue(name, request);
  }

  static std::vector<std::string> Concat(std::vector<std::string> a,
                                         const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  }

  // `status` with the end of every etcd member's log.
  absl::Status WithEtcdLogs(const absl::Status& status) const {
    std::string logs;
    for (size_t i = 0; i < etcd_.size(); ++i) {
      if (etcd_[i] != nullptr) absl::StrAppend(&logs, "\n--- etcd member ", i, ":\n", etcd_[i]->LogTail());
    }
    return absl::Status(status.code(), absl::StrCat(status.message(), logs));
  }

  static absl::Status WithOutput(const absl::Status& status, const std::string& what,
                                 const ChildProcess& child) {
    return absl::Status(status.code(),
                        absl::StrCat(what, ": ", status.message(), "; output:\n", child.output()));
  }

  // Declared first, destroyed last: the namespaces outlive etcd, which the
  // EtcdProcess destructors stop by PID.
  std::unique_ptr<TestCerts> certs_;  // with Secure()
  TestCa* ca_ = nullptr;              // owned by certs_
  std::vector<std::string> client_args_;
  std::unique_ptr<NetnsCluster> net_;
  std::array<std::unique_ptr<EtcdProcess>, 3> etcd_;
  std::array<ChildProcess*, 2> trainers_ = {};  // owned by net_
  std::vector<std::string> server_addresses_;
  std::string trainer_, endpoints_, stop_file_;
};

#define SKIP_WITHOUT_NETNS()                                                   \
  if (absl::Status supported = NetnsSupported(); !supported.ok()) {            \
    GTEST_SKIP() << "network namespaces unavailable: " << supported.message(); \
  }

TEST(MultihostTest, TrainsToConvergenceThroughEtcdDiscovery) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Start(/*ipv6=*/false));
  // Each server publishes its host's address, not the 0.0.0.0 it listens on.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cluster.server_addresses()[i],
              absl::StrCat(cluster.net().address(kServerHosts[i]), ":", kServerPort));
  }
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, kAllServers));
  ASSERT_OK(cluster.WaitForProgress(200));
  cluster.StopAndCheck();
  cluster.ExpectBulkChannelReached();
}

TEST(MultihostTest, ServerHostCutOffAndBackLosesNothing) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Start(/*ipv6=*/false));
  // Server 1's host is cut off for longer than its lease: etcd drops it.
  ASSERT_OK(cluster.net().SetLinkUp(kServerHosts[1], false));
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, "0,2"));
  ASSERT_OK(cluster.net().SetLinkUp(kServerHosts[1], true));
  // It registers again under the same index, and the trainers go on.
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, kAllServers));
  ASSERT_OK(cluster.WaitForProgress(200));
  cluster.StopAndCheck();
}

TEST(MultihostTest, EtcdMemberCutOffKeepsQuorumAndTraining) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Start(/*ipv6=*/false));
  ASSERT_OK(cluster.net().SetLinkUp(kEtcdHosts[0], false));
  // Two of three members keep a quorum: a write is committed, membership
  // stays readable and complete, and the trainers keep training.
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, kAllServers, /*write=*/true));
  ASSERT_OK(cluster.WaitForProgress(200));
  ASSERT_OK(cluster.net().SetLinkUp(kEtcdHosts[0], true));
  ASSERT_OK(cluster.WaitForProgress(100));
  cluster.StopAndCheck();
}

TEST(MultihostTest, TrainerCutOffLongerThanItsLeaseIsGoneThenRejoins) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Start(/*ipv6=*/false));
  ASSERT_OK(cluster.net().SetLinkUp(kTrainerHosts[1], false));
  // t1's lease (2 s) runs out: only t0 is listed; the servers stay.
  ASSERT_OK(cluster.WaitMembers("t0", kAllServers));
  ASSERT_OK(cluster.WaitForProgress(100));  // t0 alone
  ASSERT_OK(cluster.net().SetLinkUp(kTrainerHosts[1], true));
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, kAllServers));
  cluster.StopAndCheck();
}

TEST(MultihostTest, Ipv6ServersAreFoundAtTheirAdvertisedAddresses) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Start(/*ipv6=*/true));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(cluster.server_addresses()[i],
              absl::StrCat("[", cluster.net().address6(kServerHosts[i]), "]:", kServerPort));
  }
  ASSERT_OK(cluster.WaitForProgress(200));
  cluster.StopAndCheck();
  cluster.ExpectBulkChannelReached();
}

// Everything over mutual TLS, roles from the certificates: the trainers
// (trainer.<job>) train to convergence; a reader of the job, and a trainer
// of another job, are refused a push, naming why.
TEST(MultihostTest, SecuredClusterTrains) {
  SKIP_WITHOUT_NETNS();
  MultihostCluster cluster;
  ASSERT_OK(cluster.Secure());
  ASSERT_OK(cluster.Start(/*ipv6=*/false));
  ASSERT_OK(cluster.WaitMembers(kTrainerIds, kAllServers));
  ASSERT_OK(cluster.WaitForProgress(200));

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> reader,
                       cluster.ClientCertArgs(absl::StrCat("reader.", kJob)));
  absl::StatusOr<std::string> push = cluster.ObserveAs(reader, {"--mode=push"});
  EXPECT_FALSE(push.ok());
  EXPECT_THAT(push.status().message(), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(push.status().message(), HasSubstr("role reader"));

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> other, cluster.ClientCertArgs("trainer.job-k"));
  push = cluster.ObserveAs(other, {"--mode=push"});
  EXPECT_FALSE(push.ok());
  EXPECT_THAT(push.status().message(), HasSubstr("PERMISSION_DENIED"));
  EXPECT_THAT(push.status().message(), HasSubstr("job-k"));

  cluster.StopAndCheck();
}

}  // namespace
}  // namespace pserver
