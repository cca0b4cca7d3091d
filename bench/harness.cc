#include "harness.h"

#include <dirent.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <map>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/ascii.h"
#include "absl/time/clock.h"
#include "google/protobuf/util/json_util.h"

namespace pserver::bench {
namespace {

std::string MachineDescription() {
  std::string cpu = "unknown cpu";
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) {
      cpu = line.substr(line.find(':') + 2);
      break;
    }
  }
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGE_SIZE);
  utsname uts{};
  uname(&uts);
  return absl::StrFormat("%s, %u cores, %.0f GiB RAM, Linux %s", cpu,
                         std::thread::hardware_concurrency(),
                         static_cast<double>(pages) * page_size / (1ull << 30), uts.release);
}

}  // namespace

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double Percentile(std::vector<double> values, int percent) {
  std::sort(values.begin(), values.end());
  return values[std::min(values.size() - 1, values.size() * percent / 100)];
}

Stats Summarize(std::vector<double> values) {
  Stats stats;
  if (values.empty()) return stats;
  std::sort(values.begin(), values.end());
  stats.set_min(values.front());
  stats.set_max(values.back());
  const size_t n = values.size();
  stats.set_median(n % 2 == 1 ? values[n / 2] : (values[n / 2 - 1] + values[n / 2]) / 2);
  return stats;
}

absl::StatusOr<double> TimeOps(int ops, const std::function<absl::Status()>& op,
                               std::vector<double>* micros) {
  const double begin = NowSeconds();
  for (int i = 0; i < ops; ++i) {
    const double t = NowSeconds();
    absl::Status status = op();
    if (!status.ok()) return status;
    micros->push_back((NowSeconds() - t) * 1e6);
  }
  return ops / (NowSeconds() - begin);
}

std::string FormatBytes(uint64_t bytes) {
  if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0) return absl::StrCat(bytes >> 30, " GiB");
  if (bytes >= (1ull << 20) && bytes % (1ull << 20) == 0) return absl::StrCat(bytes >> 20, " MiB");
  if (bytes >= (1ull << 10) && bytes % (1ull << 10) == 0) return absl::StrCat(bytes >> 10, " KiB");
  return absl::StrCat(bytes, " B");
}

Harness::Harness(HarnessOptions options) : options_(std::move(options)) {
  report_.set_machine(MachineDescription());
  report_.set_command(options_.command);
  report_.set_date(absl::FormatTime("%Y-%m-%d %H:%M UTC", absl::Now(), absl::UTCTimeZone()));
  report_.set_quick(options_.quick);
}

Result& Harness::Add(const std::string& group, const std::string& name) {
  Result* r = report_.add_results();
  r->set_group(group);
  r->set_name(name);
  r->set_servers(0);
  r->set_workers(0);
  return *r;
}

absl::Status Harness::Measure(Result* result, const std::string& unit,
                              const std::function<absl::StatusOr<double>()>& one,
                              const RepetitionProbe* probe) {
  result->set_unit(unit);
  for (int i = 0; i < options_.warmup; ++i) {
    absl::StatusOr<double> v = one();
    if (!v.ok()) return v.status();
  }
  std::vector<double> values;
  for (int i = 0; i < options_.repetitions; ++i) {
    std::map<std::string, double> before;
    if (probe != nullptr) before = probe->Read();
    absl::StatusOr<double> v = one();
    if (!v.ok()) return v.status();
    values.push_back(*v);
    if (probe != nullptr) {
      Repetition* each = result->add_each();
      each->set_value(*v);
      for (const auto& [key, value] : probe->Read()) {
        (*each->mutable_counters())[key] = value - before[key];
      }
    }
  }
  *result->mutable_value() = Summarize(values);
  result->set_repetitions(options_.repetitions);
  if (probe != nullptr) PrintOffMedian(*result);
  return absl::OkStatus();
}

void Harness::PrintOffMedian(const Result& result) const {
  const double median = result.value().median();
  if (median <= 0) return;
  // The repetition nearest the median, for comparison.
  const Repetition* typical = nullptr;
  for (const Repetition& each : result.each()) {
    if (typical == nullptr ||
        std::abs(each.value() - median) < std::abs(typical->value() - median)) {
      typical = &each;
    }
  }
  auto line = [&](const char* what, int index, const Repetition& each) {
    const std::map<std::string, double> sorted(each.counters().begin(), each.counters().end());
    std::string counters;
    for (const auto& [key, value] : sorted) absl::StrAppend(&counters, " ", key, "=", value);
    std::printf("  %s %s %s %s repetition %d: %.3f %s (%.0f%% of the median);%s\n",
                result.group().c_str(), result.name().c_str(),
                FormatBytes(result.payload_bytes()).c_str(), what, index, each.value(),
                result.unit().c_str(), 100 * each.value() / median, counters.c_str());
  };
  bool printed = false;
  for (int i = 0; i < result.each_size(); ++i) {
    const Repetition& each = result.each(i);
    if (std::abs(each.value() - median) <= 0.25 * median) continue;
    if (!printed && typical != nullptr) {
      line("typical", static_cast<int>(typical - &result.each(0)), *typical);
      printed = true;
    }
    line("OFF-MEDIAN", i, each);
  }
  std::fflush(stdout);
}

const Result* Harness::FindCeiling(const std::string& name, uint64_t bytes) const {
  const Result* best = nullptr;
  double best_distance = 0;
  for (const Result& r : report_.results()) {
    if (r.group() != "ceiling" || r.name() != name) continue;
    const double distance =
        std::abs(std::log2(static_cast<double>(std::max<uint64_t>(1, r.payload_bytes()))) -
                 std::log2(static_cast<double>(std::max<uint64_t>(1, bytes))));
    if (best == nullptr || distance < best_distance) {
      best = &r;
      best_distance = distance;
    }
  }
  return best;
}

void Harness::Compare(Result* result, const std::string& ceiling, double scale) {
  std::vector<std::string> names = {ceiling};
  if (auto it = alternatives_.find(ceiling); it != alternatives_.end()) {
    names.insert(names.end(), it->second.begin(), it->second.end());
  }
  const Result* best = nullptr;
  for (const std::string& name : names) {
    const Result* c = FindCeiling(name, result->payload_bytes());
    if (c != nullptr && (best == nullptr || c->value().median() > best->value().median())) best = c;
  }
  if (best == nullptr || best->value().median() <= 0) return;
  result->set_ceiling(best->name());
  result->set_ratio(result->value().median() / (best->value().median() * scale));
}

void Harness::SetCeilingAlternatives(const std::string& ceiling,
                                     std::vector<std::string> alternatives) {
  alternatives_[ceiling] = std::move(alternatives);
}

double SelfCpuSeconds() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}

namespace {

std::string ReadFirstLine(const std::string& path) {
  std::ifstream file(path);
  std::string line;
  std::getline(file, line);
  return line;
}

// Context switches and run-queue seconds of every thread alive now in
// /proc/<pid>/task (`pid` "self" for this process).
void AddThreadCounters(const std::string& pid, ProcessCounters* counters) {
  const std::string tasks = absl::StrCat("/proc/", pid, "/task");
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return;
  while (const dirent* entry = readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    const std::string task = absl::StrCat(tasks, "/", entry->d_name);
    // schedstat: nanoseconds on a core, nanoseconds waiting for one, slices.
    const std::vector<std::string> sched =
        absl::StrSplit(ReadFirstLine(task + "/schedstat"), ' ', absl::SkipEmpty());
    double waited = 0;
    if (sched.size() >= 2 && absl::SimpleAtod(sched[1], &waited)) counters->runq_s += waited / 1e9;
    if (pid == "self") continue;  // getrusage counts this process's switches
    std::ifstream status(task + "/status");
    for (std::string line; std::getline(status, line);) {
      double n = 0;
      const size_t colon = line.find(':');
      if (colon == std::string::npos ||
          !absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(colon + 1)), &n)) {
        continue;
      }
      if (line.rfind("voluntary_ctxt_switches", 0) == 0) counters->vcsw += n;
      if (line.rfind("nonvoluntary_ctxt_switches", 0) == 0) counters->ivcsw += n;
    }
  }
  closedir(dir);
}

// Page faults and CPU seconds of process `pid` (every thread, those gone
// included) from /proc/<pid>/stat; zeros when it is gone.
ProcessCounters StatOf(pid_t pid) {
  ProcessCounters counters;
  const std::string stat = ReadFirstLine(absl::StrCat("/proc/", pid, "/stat"));
  // The command name (field 2) may hold spaces: count fields after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return counters;
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); minflt and majflt are fields 10 and 12,
  // utime and stime 14 and 15.
  if (fields.size() < 13) return counters;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(fields[7], &counters.minflt) ||
      !absl::SimpleAtod(fields[9], &counters.majflt) || !absl::SimpleAtod(fields[11], &utime) ||
      !absl::SimpleAtod(fields[12], &stime)) {
    return ProcessCounters{};
  }
  counters.cpu_s = (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  return counters;
}

}  // namespace

ProcessCounters SelfCounters() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  auto seconds = [](const timeval& t) { return t.tv_sec + t.tv_usec / 1e6; };
  ProcessCounters counters;
  counters.minflt = usage.ru_minflt;
  counters.majflt = usage.ru_majflt;
  counters.vcsw = usage.ru_nvcsw;
  counters.ivcsw = usage.ru_nivcsw;
  counters.cpu_s = seconds(usage.ru_utime) + seconds(usage.ru_stime);
  AddThreadCounters("self", &counters);
  return counters;
}

ProcessCounters CountersOf(pid_t pid) {
  ProcessCounters counters = StatOf(pid);
  AddThreadCounters(absl::StrCat(pid), &counters);
  return counters;
}

double ProcessCpuSeconds(pid_t pid) { return StatOf(pid).cpu_s; }

double MachineBusySeconds() {
  // "cpu  user nice system idle iowait irq softirq steal ...", in clock ticks.
  const std::vector<std::string> fields =
      absl::StrSplit(ReadFirstLine("/proc/stat"), ' ', absl::SkipEmpty());
  double busy = 0;
  for (size_t i = 1; i < fields.size() && i <= 8; ++i) {
    double ticks = 0;
    if (i == 4 || i == 5 || !absl::SimpleAtod(fields[i], &ticks)) continue;  // idle, iowait
    busy += ticks;
  }
  return busy / static_cast<double>(sysconf(_SC_CLK_TCK));
}

std::map<std::string, double> RepetitionProbe::Read() const {
  std::map<std::string, double> out;
  auto add = [&](const std::string& prefix, const ProcessCounters& c) {
    out[prefix + "minflt"] += c.minflt;
    out[prefix + "majflt"] += c.majflt;
    out[prefix + "vcsw"] += c.vcsw;
    out[prefix + "ivcsw"] += c.ivcsw;
    out[prefix + "cpu_s"] += c.cpu_s;
    out[prefix + "runq_s"] += c.runq_s;
  };
  add("client_", SelfCounters());
  for (pid_t pid : servers_) add("server_", CountersOf(pid));
  // Everything else: what other processes (load) took from the cores.
  out["others_cpu_s"] = MachineBusySeconds() - out["client_cpu_s"] - out["server_cpu_s"];
  return out;
}

double CpuPerGB::Now() const {
  double total = SelfCpuSeconds();
  for (pid_t pid : others_) total += ProcessCpuSeconds(pid);
  return total;
}

void Harness::Skip(const std::string& group, const std::string& reason) {
  report_.add_skipped(absl::StrCat(group, ": ", reason));
  std::printf("\n== %s\nskipped: %s\n", group.c_str(), reason.c_str());
  std::fflush(stdout);
}

void Harness::PrintGroup(const std::string& group) const {
  std::printf("\n== %s\n", group.c_str());
  std::printf("%-14s %9s %3s %3s %10s %10s %10s %-6s %-12s %6s  %s\n", "name", "payload", "S",
              "W", "min", "median", "max", "unit", "vs ceiling", "ratio", "extra");
  for (const Result& r : report_.results()) {
    if (r.group() != group) continue;
    std::string extra;
    const std::map<std::string, double> sorted(r.extra().begin(), r.extra().end());
    for (const auto& [key, value] : sorted) absl::StrAppend(&extra, key, "=", value, " ");
    // Large rates (keys/s) without decimals, so the columns stay aligned.
    const int decimals = r.value().max() >= 1e5 ? 0 : 3;
    std::printf("%-14s %9s %3u %3u %10.*f %10.*f %10.*f %-6s %-12s %6s  %s\n", r.name().c_str(),
                r.payload_bytes() ? FormatBytes(r.payload_bytes()).c_str() : "-", r.servers(),
                r.workers(), decimals, r.value().min(), decimals, r.value().median(), decimals,
                r.value().max(),
                r.unit().c_str(), r.ceiling().c_str(),
                r.ceiling().empty() ? "" : absl::StrFormat("%.0f%%", 100 * r.ratio()).c_str(),
                extra.c_str());
  }
  std::fflush(stdout);
}

absl::Status Harness::WriteJson(const std::string& path) const {
  std::string json;
  google::protobuf::util::JsonPrintOptions print;
  print.add_whitespace = true;
  print.always_print_primitive_fields = true;
  print.preserve_proto_field_names = true;
  auto status = google::protobuf::util::MessageToJsonString(report_, &json, print);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  std::ofstream out(path);
  out << json;
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace pserver::bench
