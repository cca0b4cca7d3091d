// Drivers of the `bindings` group: a Python or Go program, run as a child
// process against servers the benchmark started, that times push, pull and
// push+pull through its language's binding and prints one JSON DriverResult
// (results.proto) per line.
//
//   PS_ASSIGN_OR_RETURN(DriverResults results,
//                       RunDriver(RunfilesPath("bench/bindings_python.sh", argv0),
//                                 {"--servers=127.0.0.1:7000", "--params=w:1048576:40"},
//                                 absl::Now() + absl::Minutes(10)));
//   const std::vector<double>& push = results[{"push", 1048576}];
//
// Not thread-safe.
#ifndef PSERVER_BENCH_BINDINGS_DRIVER_H_
#define PSERVER_BENCH_BINDINGS_DRIVER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "cc/testing/child_process.h"

namespace pserver::bench {

// The values of each (op, payload bytes) a driver printed.
using DriverResults = std::map<std::pair<std::string, uint64_t>, std::vector<double>>;

// Runs `program` with `args` until it exits (killed at `deadline`) and
// parses the JSON lines of its stdout. An error names the program and
// quotes its output when it fails or prints a line that is not a
// DriverResult.
// Waits for a driver already started (e.g. in a network namespace) as
// RunDriver does, and parses its output; `program` names it in errors.
absl::StatusOr<DriverResults> WaitForDriver(ChildProcess& child, const std::string& program,
                                            absl::Time deadline);

// The DriverResults in `out`, one JSON line each; an error names `program`
// and quotes the first line that is not a DriverResult.
absl::StatusOr<DriverResults> ParseDriverResults(const std::string& program,
                                                 const std::string& out);

absl::StatusOr<DriverResults> RunDriver(const std::string& program,
                                        const std::vector<std::string>& args,
                                        absl::Time deadline);

}  // namespace pserver::bench

#endif  // PSERVER_BENCH_BINDINGS_DRIVER_H_
