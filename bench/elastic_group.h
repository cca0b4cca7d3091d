// bench:e2e's elastic group (docs/elastic.md, "Live moves"; issue 16): what
// a live move costs a running trainer. A trainer steps a dense model (SendGrads
// of every parameter, SGD) on 2 pserver processes found through a real etcd,
// started with --placement_redirects; ScaleCluster (psctl scale) moves it to
// 3 servers (a third process joins) and back to 2 (the third exits by
// itself) while it trains.
//   grow_step_before / grow_step_during / grow_step_after (and shrink_*):
//       the step time in s (min/median/max; extra p50_s, p99_s) of the steps
//       that began before the move (the last ones), overlapped it, and began
//       after ScaleCluster returned
//   grow_move / shrink_move: the move's duration in s, from the call of
//       ScaleCluster until every old owner has handed its blocks over
//       (extra call_s: the whole call, placement writes included); extra
//       bytes_moved, blocks_moved, fraction_moved (bytes moved over the
//       model's), ideal_fraction (|N-M| / max(N,M)), x_ideal, and the peak
//       RSS (VmHWM) of the largest server and of this process
// Shrinking, the trainer pauses between steps from the end of the hand-over
// until its client routes by the stable placement (elastic_group.cc says
// why).
// Model: 64 x 4M float32 (1 GiB) in 1 MiB blocks; --quick: 16 x 256K float32
// (16 MiB) in 64 KiB blocks. Steps per phase: 8 (--quick: 3).
#ifndef PSERVER_BENCH_ELASTIC_GROUP_H_
#define PSERVER_BENCH_ELASTIC_GROUP_H_

#include <string>

#include "absl/status/status.h"
#include "harness.h"

namespace pserver::bench {

absl::Status ElasticGroup(Harness& h, const std::string& pserver_binary);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_ELASTIC_GROUP_H_
