// e2e's `hosts` group: scaling across hosts. Servers and workers each live in
// a network namespace of their own (cc/testing/netns.h), every host's link
// limited by `tc tbf` (--hosts_rate_mbit, 1000 by default), and aggregate
// dense push+pull is measured with 1, 2 and 4 servers (and
// --hosts_workers_per_server workers per server, 2 by default, each running
// bench/hosts_worker on a 4 MiB parameter cut over all servers), reported as
// "% of linear": the aggregate over `servers` times the 1-server aggregate
// of the same run, next to how busy the machine's cores were meanwhile, and
// "% of line": the payload against the servers' links' rate, and every
// link's bytes each way over the measured rounds (NetnsCluster::Counters:
// wire bytes, headers included, as tbf counts them) against its rate, with
// the packets the links dropped.
// Without the rights to create namespaces it records why (Harness::Skip).
//
//   PS_RETURN_IF_ERROR(Hosts(h, pserver_binary, argv0));
#ifndef PSERVER_BENCH_HOSTS_GROUP_H_
#define PSERVER_BENCH_HOSTS_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "harness.h"

namespace pserver::bench {

absl::Status Hosts(Harness& h, const std::string& pserver_binary, const std::string& argv0);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_HOSTS_GROUP_H_
