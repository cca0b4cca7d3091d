// A real etcd server for tests: one member on free 127.0.0.1 ports, with its
// data directory under $TEST_TMPDIR, started and stopped by PID.
//
//   ASSERT_OK_AND_ASSIGN(std::unique_ptr<EtcdProcess> etcd, EtcdProcess::Start());
//   EtcdClientOptions options;
//   options.endpoints = {etcd->endpoint()};            // "127.0.0.1:<port>"
//   ...
//   ASSERT_OK(etcd->Kill());                            // crash it (SIGKILL)
//   ASSERT_OK(etcd->Restart());                         // same ports, same data
//
// Start and Restart return once etcd answers a linearizable read (it has a
// leader and serves), or fail within options.start_timeout with the tail of
// etcd's log. The destructor stops etcd (SIGTERM, then SIGKILL). etcd is also
// killed if the thread that started it exits first (PR_SET_PDEATHSIG), so a
// crashed test leaves no server behind: start it from the test's main thread.
//
// A member of a multi-member cluster, e.g. in a network namespace
// (cc/testing/netns.h), is started on a given address and ports, under a
// command that execs etcd (`ip netns exec <ns>`), without waiting (the
// cluster serves only once a majority of its members run):
//
//   EtcdProcessOptions member;
//   member.name = "e0";
//   member.host = cluster->address(0);
//   member.client_port = 2379;
//   member.peer_port = 2380;
//   member.exec_prefix = {ip, "netns", "exec", cluster->name(0)};
//   member.initial_cluster = "e0=http://10.213.0.1:2380,e1=...,e2=...";
//   member.cluster_token = "job-1";
//   member.wait_until_serving = false;
//
// Thread safety: not thread-safe; use one EtcdProcess from one thread.
#ifndef PSERVER_CC_ETCD_TESTING_ETCD_PROCESS_H_
#define PSERVER_CC_ETCD_TESTING_ETCD_PROCESS_H_

#include <sys/types.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace pserver::testing {

struct EtcdProcessOptions {
  std::string binary = "/usr/bin/etcd";
  // Empty: a new directory under $TEST_TMPDIR (or /tmp outside Bazel).
  std::string data_dir;
  std::string name = "pserver-test";
  // The address etcd listens on and advertises (client and peer URLs); an
  // IPv6 address is bracketed in the URLs.
  std::string host = "127.0.0.1";
  // 0: free ports of this process's 127.0.0.1 (both or neither must be 0).
  int client_port = 0;
  int peer_port = 0;
  // etcd runs as `exec_prefix... binary args...`; the prefix must exec its
  // command, so that the PID is etcd's (`ip netns exec <ns>` does).
  std::vector<std::string> exec_prefix;
  // --initial-cluster ("name=http://host:peer_port,..."); empty: this member
  // alone.
  std::string initial_cluster;
  // --initial-cluster-token; empty: unique to this process and member.
  std::string cluster_token;
  // Start and Restart wait until this member serves (which a member of a
  // cluster does only with a majority up, and which this process can see
  // only when it reaches `host`); false: they return once etcd is spawned.
  bool wait_until_serving = true;
  // How long Start and Restart wait for etcd to serve.
  absl::Duration start_timeout = absl::Seconds(30);
  // How long Stop waits after SIGTERM before SIGKILL.
  absl::Duration stop_grace = absl::Seconds(10);
  // TLS on the client URL with client-certificate auth (etcd
  // --client-cert-auth --trusted-ca-file --cert-file --key-file): etcd's
  // certificate and key (naming 127.0.0.1), the CA whose client
  // certificates it accepts (and that signed its own), and the client
  // certificate Start's health check presents. Empty server_cert: plaintext.
  struct Tls {
    std::string server_cert, server_key;
    std::string ca;
    std::string client_cert, client_key;
  };
  Tls tls;
};

class EtcdProcess {
 public:
  static absl::StatusOr<std::unique_ptr<EtcdProcess>> Start(EtcdProcessOptions options = {});

  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;
  ~EtcdProcess();

  // The client endpoint, "<host>:<client_port>" ([host] for IPv6).
  std::string endpoint() const;
  // http://<host>:<peer_port>, for EtcdProcessOptions.initial_cluster.
  std::string peer_url() const;
  int client_port() const { return client_port_; }
  int peer_port() const { return peer_port_; }
  const std::string& data_dir() const { return data_dir_; }
  // etcd's stdout and stderr (all runs, appended).
  const std::string& log_path() const { return log_path_; }
  // The log's last 4000 bytes (for failure messages).
  std::string LogTail() const;
  bool running() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }

  // SIGTERM, wait up to options.stop_grace, then SIGKILL. OK if not running.
  absl::Status Stop();
  // SIGKILL at once, as a crash. OK if not running.
  absl::Status Kill();
  // Starts etcd again (it must be stopped) on the same ports and data
  // directory, and waits until it serves.
  absl::Status Restart();

 private:
  explicit EtcdProcess(EtcdProcessOptions options);

  absl::Status Spawn();
  absl::Status WaitServing();
  absl::Status Signal(int signal, absl::Duration wait);

  EtcdProcessOptions options_;
  std::string data_dir_;
  std::string log_path_;
  std::string cluster_token_;
  int client_port_ = 0;
  int peer_port_ = 0;
  pid_t pid_ = -1;
};

}  // namespace pserver::testing

#endif  // PSERVER_CC_ETCD_TESTING_ETCD_PROCESS_H_
