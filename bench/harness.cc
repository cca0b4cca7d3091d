#include "harness.h"

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
                              const std::function<absl::StatusOr<double>()>& one) {
  result->set_unit(unit);
  for (int i = 0; i < options_.warmup; ++i) {
    absl::StatusOr<double> v = one();
    if (!v.ok()) return v.status();
  }
  std::vector<double> values;
  for (int i = 0; i < options_.repetitions; ++i) {
    absl::StatusOr<double> v = one();
    if (!v.ok()) return v.status();
    values.push_back(*v);
  }
  *result->mutable_value() = Summarize(values);
  result->set_repetitions(options_.repetitions);
  return absl::OkStatus();
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

double ProcessCpuSeconds(pid_t pid) {
  std::ifstream file(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat;
  std::getline(file, stat);
  // The command name (field 2) may hold spaces: count fields after its ')'.
  const size_t close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  const std::vector<std::string> fields =
      absl::StrSplit(stat.substr(close + 1), ' ', absl::SkipEmpty());
  // fields[0] is field 3 (state); utime and stime are fields 14 and 15.
  if (fields.size() < 13) return 0;
  double utime = 0, stime = 0;
  if (!absl::SimpleAtod(fields[11], &utime) || !absl::SimpleAtod(fields[12], &stime)) return 0;
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
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
