#include "compression_group.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <map>
#include <random>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "bench/compression_step.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/testing/child_process.h"
#include "cc/testing/netns.h"

namespace pserver::bench {
namespace {

constexpr uint64_t kMiB = uint64_t{1} << 20;
constexpr double kGB = 1e9;
constexpr char kRate[] = "1gbit";  // each host's link, both ways

// Top-k as ErrorFeedback selected it before the sampled threshold: every
// magnitude copied and nth_element over all of them. The reference the
// codec rows compare the selection with, in the same run.
void FullSortTopK(std::vector<float>& residual, const float* grad, size_t k) {
  const size_t n = residual.size();
  for (size_t i = 0; i < n; ++i) residual[i] += grad[i];
  std::vector<float> magnitudes(n);
  for (size_t i = 0; i < n; ++i) magnitudes[i] = std::fabs(residual[i]);
  std::nth_element(magnitudes.begin(), magnitudes.begin() + (k - 1), magnitudes.end(),
                   std::greater<float>());
  const float threshold = magnitudes[k - 1];
  size_t taken = 0;
  for (size_t i = 0; i < n && taken < k; ++i) {
    if (std::fabs(residual[i]) >= threshold) {
      residual[i] = 0.0f;
      ++taken;
    }
  }
}

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
  PS_RETURN_IF_ERROR(
      timed("topk1% select", [&] { feedback.AddAndSelect(values.data(), 0, n, n / 100); }));
  std::vector<float> residual(n, 0.0f);
  return timed("topk1% select, full nth_element (before)",
               [&] { FullSortTopK(residual, values.data(), n / 100); });
}

// One result per encoding from per-step seconds (warm-up first), in ms per
// step, with the payload it moved and its speed-up over float32.
// `wire_bytes(e)`: the payload bytes of a step with encoding e.
absl::Status AddSteps(Harness& h, const std::string& where, uint64_t payload_bytes,
                      const Steps& seconds,
                      const std::function<uint64_t(const v1::WireCompression&)>& wire_bytes) {
  const std::vector<Encoding> encodings = Encodings();
  std::vector<double> medians;
  for (size_t e = 0; e < encodings.size(); ++e) {
    std::deque<double> left(seconds[e].begin(), seconds[e].end());
    Result& r = h.Add("compression", absl::StrCat(where, " ", encodings[e].name));
    r.set_payload_bytes(payload_bytes);
    PS_RETURN_IF_ERROR(h.Measure(&r, "ms/step", [&]() -> absl::StatusOr<double> {
      if (left.empty()) return absl::InternalError("fewer steps measured than repetitions");
      const double s = left.front();
      left.pop_front();
      return s * 1e3;
    }));
    medians.push_back(r.value().median());
    (*r.mutable_extra())["wire_MB_per_step"] =
        static_cast<double>(wire_bytes(encodings[e].compression)) / 1e6;
    (*r.mutable_extra())["speedup_vs_float32"] = medians[0] / medians.back();
  }
  return absl::OkStatus();
}

// The dense and sparse rows of one place ("loopback", "1gbit").
absl::Status AddPlace(Harness& h, const std::string& where, uint64_t model, uint64_t rows,
                      const Steps& dense, const Steps& sparse) {
  PS_RETURN_IF_ERROR(AddSteps(h, where, model, dense, [&](const v1::WireCompression& c) {
    return WireBytesPerStep(c, model, kMiB);
  }));
  return AddSteps(h, absl::StrCat(where, " sparse"), rows * kSparseDim * sizeof(float), sparse,
                  [&](const v1::WireCompression& c) { return SparseWireBytesPerStep(c, rows); });
}

// The driver's lines "<kind> <encoding> <s> <s> ..." of `kind`, in
// Encodings() order.
absl::StatusOr<Steps> ParseSteps(const std::string& out, const std::string& kind) {
  std::map<std::string, std::vector<double>> by_name;
  for (absl::string_view line : absl::StrSplit(out, '\n', absl::SkipEmpty())) {
    std::vector<std::string> fields = absl::StrSplit(line, ' ', absl::SkipEmpty());
    if (fields.size() < 3 || fields[0] != kind) continue;
    std::vector<double>& s = by_name[fields[1]];
    for (size_t i = 2; i < fields.size(); ++i) s.push_back(std::atof(fields[i].c_str()));
  }
  Steps seconds;
  for (const Encoding& e : Encodings()) {
    auto it = by_name.find(e.name);
    if (it == by_name.end()) {
      return absl::InternalError(absl::StrCat("no ", kind, " figures for ", e.name, " in: ", out));
    }
    seconds.push_back(it->second);
  }
  return seconds;
}

// The driver on host 1 of a two-host NetnsCluster, the server on host 0,
// every link `rate`: its output.
absl::StatusOr<std::string> RunAcrossLink(const std::string& pserver_binary,
                                          const std::string& driver, uint64_t model, uint64_t rows,
                                          int steps) {
  NetnsOptions options;
  options.hosts = 2;
  options.rate = kRate;
  options.command_timeout = absl::Seconds(300);  // the driver's whole run
  PS_ASSIGN_OR_RETURN(auto cluster, NetnsCluster::Create(options));
  PS_ASSIGN_OR_RETURN(
      ChildProcess * server,
      cluster->Spawn(0, pserver_binary,
                     {absl::StrCat("--host=", cluster->address(0)), "--port=0", "--index=0"}));
  PS_ASSIGN_OR_RETURN(std::string address,
                      WaitForPserverAddress(*server, 0, absl::Now() + absl::Seconds(20)));
  return cluster->Run(1, driver,
                      {absl::StrCat("--server=", address), absl::StrCat("--model_bytes=", model),
                       absl::StrCat("--sparse_rows=", rows), absl::StrCat("--steps=", steps)});
}

}  // namespace

absl::Status CompressionGroup(Harness& h, const std::string& pserver_binary,
                              const std::string& argv0) {
  PS_RETURN_IF_ERROR(Codec(h));
  const uint64_t model = h.quick() ? 4 * kMiB : 16 * kMiB;
  const uint64_t rows = h.quick() ? 4096 : 16384;
  const int steps = h.options().warmup + h.options().repetitions;
  PS_ASSIGN_OR_RETURN(Steps dense, MeasureSteps("", model, steps));
  PS_ASSIGN_OR_RETURN(Steps sparse, MeasureSparseSteps("", rows, steps));
  PS_RETURN_IF_ERROR(AddPlace(h, "loopback", model, rows, dense, sparse));

  const absl::StatusOr<std::string> out = RunAcrossLink(
      pserver_binary, RunfilesPath("bench/compression_link", argv0), model, rows, steps);
  if (!out.ok()) {
    std::printf("compression: 1 Gbit/s link skipped (needs CAP_NET_ADMIN and iproute2): %s\n",
                out.status().ToString().c_str());
  } else {
    PS_ASSIGN_OR_RETURN(Steps link_dense, ParseSteps(*out, "dense"));
    PS_ASSIGN_OR_RETURN(Steps link_sparse, ParseSteps(*out, "sparse"));
    PS_RETURN_IF_ERROR(AddPlace(h, "1gbit", model, rows, link_dense, link_sparse));
  }
  h.PrintGroup("compression");
  return absl::OkStatus();
}

}  // namespace pserver::bench
