#include "bench/compression_step.h"

#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"

namespace pserver::bench {

constexpr uint64_t kBlockBytes = uint64_t{1} << 20;  // the client's default

std::vector<Encoding> Encodings() {
  std::vector<Encoding> e(5);
  e[0].name = "float32";
  e[1].name = "float16";
  e[1].compression.set_value_type(v1::WireCompression::FLOAT16);
  e[2].name = "bfloat16";
  e[2].compression.set_value_type(v1::WireCompression::BFLOAT16);
  e[3].name = "topk1%";
  e[3].compression.set_topk_fraction(0.01);
  e[4].name = "topk1%+float16";
  e[4].compression.set_topk_fraction(0.01);
  e[4].compression.set_value_type(v1::WireCompression::FLOAT16);
  return e;
}

uint64_t WireBytesPerStep(const v1::WireCompression& compression, uint64_t model_bytes,
                          uint64_t block_bytes) {
  const uint64_t n = model_bytes / sizeof(float);
  const uint64_t value = ElementSize(WireValueType(compression));
  const uint64_t block = block_bytes / sizeof(float);
  uint64_t up = n * value;
  if (TopKCount(compression, 1) > 0) {
    up = 0;
    for (uint64_t at = 0; at < n; at += block) {
      up += TopKCount(compression, std::min(block, n - at)) * (sizeof(uint32_t) + value);
    }
  }
  return up + n * value;
}

absl::StatusOr<std::vector<std::vector<double>>> MeasureSteps(uint64_t model_bytes, int steps) {
  // Bulk data over TCP: the same-host Unix socket of the bulk channel would
  // pass by the tc tbf limit on the namespace's loopback.
  ServerOptions server;
  server.bulk_unix_socket = false;
  PS_ASSIGN_OR_RETURN(auto cluster, LocalCluster::Start(1, server));
  ClientOptions options;
  options.servers = cluster->addresses();
  options.block_bytes = kBlockBytes;
  options.timeout = absl::Seconds(120);
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  const int64_t n = static_cast<int64_t>(model_bytes / sizeof(float));
  const std::vector<Encoding> encodings = Encodings();
  for (const Encoding& e : encodings) {
    v1::ParameterConfig config;
    config.mutable_learning_rate()->set_learning_rate(1e-6);
    *config.mutable_wire_compression() = e.compression;
    PS_RETURN_IF_ERROR(client->InitParam(e.name, *Tensor::Zeros(v1::FLOAT32, {n}), config));
  }
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  std::vector<float> values(n);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  const Tensor grad = Tensor::FromValues<float>({n}, values);
  std::vector<std::vector<double>> seconds(encodings.size());
  for (size_t e = 0; e < encodings.size(); ++e) {
    Tensor out;
    for (int step = -1; step < steps; ++step) {  // step -1: warm-up
      const absl::Time begin = absl::Now();
      PS_RETURN_IF_ERROR(client->PushPull(encodings[e].name, grad, &out));
      if (step >= 0) seconds[e].push_back(absl::ToDoubleSeconds(absl::Now() - begin));
    }
  }
  return seconds;
}

}  // namespace pserver::bench
