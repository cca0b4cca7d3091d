#include "compression_group.h"

#include <sys/wait.h>

#include <cstdio>
#include <deque>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "bench/compression_step.h"

namespace pserver::bench {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr double kGB = 1e9;
constexpr char kLink[] = "rate 1gbit burst 256kb latency 50ms";

// Encode/decode and top-k selection speed, GB/s of float32 values.
absl::Status Codec(Harness& h) {
  const uint64_t bytes = h.quick() ? 16 * kMiB : 64 * kMiB;
  const size_t n = bytes / sizeof(float);
  std::vector<float> values(n), back(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  std::string wire(n * 2, '\0');
  auto timed = [&](const std::string& name, const std::function<void()>& op) {
    Result& r = h.Add("compression", name);
    r.set_payload_bytes(bytes);
    return h.Measure(&r, "GB/s", [&]() -> absl::StatusOr<double> {
      const double begin = NowSeconds();
      op();
      return static_cast<double>(bytes) / (NowSeconds() - begin) / kGB;
    });
  };
  for (ElementType type : {v1::FLOAT16, v1::BFLOAT16}) {
    const std::string t = ElementTypeName(type);
    PS_RETURN_IF_ERROR(timed(absl::StrCat("encode ", t),
                             [&] { EncodeFloats(type, values.data(), n, wire.data()); }));
    PS_RETURN_IF_ERROR(timed(absl::StrCat("decode ", t),
                             [&] { DecodeFloats(type, wire.data(), n, back.data()); }));
  }
  ErrorFeedback feedback(n);
  return timed("topk1% select", [&] { feedback.AddAndSelect(values.data(), 0, n, n / 100); });
}

// One result per encoding from per-step seconds (warm-up first), in ms per
// step, with the payload it moved and its speed-up over float32.
absl::Status AddSteps(Harness& h, const std::string& where, uint64_t model_bytes,
                      const std::vector<std::vector<double>>& seconds) {
  const std::vector<Encoding> encodings = Encodings();
  std::vector<double> medians;
  for (size_t e = 0; e < encodings.size(); ++e) {
    std::deque<double> left(seconds[e].begin(), seconds[e].end());
    Result& r = h.Add("compression", absl::StrCat(where, " ", encodings[e].name));
    r.set_payload_bytes(model_bytes);
    PS_RETURN_IF_ERROR(h.Measure(&r, "ms/step", [&]() -> absl::StatusOr<double> {
      if (left.empty()) return absl::InternalError("fewer steps measured than repetitions");
      const double s = left.front();
      left.pop_front();
      return s * 1e3;
    }));
    medians.push_back(r.value().median());
    (*r.mutable_extra())["wire_MB_per_step"] =
        static_cast<double>(WireBytesPerStep(encodings[e].compression, model_bytes, kMiB)) / 1e6;
    (*r.mutable_extra())["speedup_vs_float32"] = medians[0] / medians.back();
  }
  return absl::OkStatus();
}

// Runs `command` through the shell; its stdout and stderr, and whether it
// exited 0.
std::pair<std::string, bool> Shell(const std::string& command) {
  std::string out;
  FILE* pipe = popen(absl::StrCat(command, " 2>&1").c_str(), "r");
  if (pipe == nullptr) return {"popen failed", false};
  char buffer[4096];
  size_t got;
  while ((got = fread(buffer, 1, sizeof(buffer), pipe)) > 0) out.append(buffer, got);
  const int status = pclose(pipe);
  return {out, status != -1 && WIFEXITED(status) && WEXITSTATUS(status) == 0};
}

// The driver's lines "<encoding> <s> <s> ..." in Encodings() order.
absl::StatusOr<std::vector<std::vector<double>>> ParseSteps(const std::string& out) {
  std::map<std::string, std::vector<double>> by_name;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 2) continue;
    std::vector<double>& s = by_name[fields[0]];
    for (size_t i = 1; i < fields.size(); ++i) s.push_back(std::atof(fields[i].c_str()));
  }
  std::vector<std::vector<double>> seconds;
  for (const Encoding& e : Encodings()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return absl::InternalError(absl::StrCat("no figures for ", e.name, " in: ", out));
    }
    seconds.push_back(it->second);
  }
  return seconds;
}

}  // namespace

absl::Status CompressionGroup(Harness& h, const std::string& argv0) {
  PS_RETURN_IF_ERROR(Codec(h));
  const uint64_t model = h.quick() ? 4 * kMiB : 16 * kMiB;
  const int steps = h.options().warmup + h.options().repetitions;
  PS_ASSIGN_OR_RETURN(auto loopback, MeasureSteps(model, steps));
  PS_RETURN_IF_ERROR(AddSteps(h, "loopback", model, loopback));

  const std::string driver = RunfilesPath("bench/compression_link", argv0);
  const auto [out, ok] = Shell(absl::StrCat(
      "unshare -n sh -c 'ip link set lo up && tc qdisc add dev lo root tbf ", kLink,
      " && exec \"$0\" --model_bytes=", model, " --steps=", steps, "' ", driver));
  if (!ok) {
    std::printf("compression: 1 Gbit/s link skipped (needs CAP_NET_ADMIN, iproute2's ip and "
                "tc, util-linux's unshare): %s\n",
                out.c_str());
  } else {
    PS_ASSIGN_OR_RETURN(auto link, ParseSteps(out));
    PS_RETURN_IF_ERROR(AddSteps(h, "1gbit", model, link));
  }
  h.PrintGroup("compression");
  return absl::OkStatus();
}

}  // namespace pserver::bench
