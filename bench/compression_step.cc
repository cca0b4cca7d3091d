#include "bench/compression_step.h"

#include <functional>
#include <memory>
#include <random>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "cc/client/client.h"
#include "cc/client/table.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"

namespace pserver::bench {
namespace {

constexpr uint64_t kBlockBytes = uint64_t{1} << 20;  // the client's default

// A client of `server`, or of a one-server LocalCluster kept in *local.
absl::StatusOr<std::unique_ptr<Client>> Connect(const std::string& server,
                                                std::unique_ptr<LocalCluster>* local) {
  ClientOptions options;
  if (server.empty()) {
    // Bulk data over TCP, as between hosts.
    ServerOptions server_options;
    server_options.bulk_unix_socket = false;
    PS_ASSIGN_OR_RETURN(*local, LocalCluster::Start(1, server_options));
    options.servers = (*local)->addresses();
  } else {
    options.servers = {server};
  }
  options.block_bytes = kBlockBytes;
  options.timeout = absl::Seconds(120);
  return Client::Connect(options);
}

// `count` values from N(0, 1), the same every run.
std::vector<float> Normal(size_t count) {
  std::vector<float> values(count);
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : values) v = normal(rng);
  return values;
}

// `steps` timed calls of step(e) per encoding, after a warm-up call.
absl::StatusOr<Steps> TimeSteps(int steps, const std::function<absl::Status(size_t)>& step) {
  Steps seconds(Encodings().size());
  for (size_t e = 0; e < seconds.size(); ++e) {
    for (int s = -1; s < steps; ++s) {  // s = -1: warm-up
      const absl::Time begin = absl::Now();
      PS_RETURN_IF_ERROR(step(e));
      if (s >= 0) seconds[e].push_back(absl::ToDoubleSeconds(absl::Now() - begin));
    }
  }
  return seconds;
}

}  // namespace

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

uint64_t SparseWireBytesPerStep(const v1::WireCompression& compression, uint64_t rows) {
  const uint64_t row = kSparseDim * ElementSize(WireValueType(compression));
  const uint64_t sent = TopKCount(compression, 1) > 0 ? TopKCount(compression, rows) : rows;
  return sent * (sizeof(uint64_t) + row) + rows * (sizeof(uint64_t) + row);
}

absl::StatusOr<Steps> MeasureSteps(const std::string& server, uint64_t model_bytes, int steps) {
  std::unique_ptr<LocalCluster> local;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, &local));
  const int64_t n = static_cast<int64_t>(model_bytes / sizeof(float));
  const std::vector<Encoding> encodings = Encodings();
  for (const Encoding& e : encodings) {
    v1::ParameterConfig config;
    config.mutable_learning_rate()->set_learning_rate(1e-6);
    *config.mutable_wire_compression() = e.compression;
    PS_RETURN_IF_ERROR(client->InitParam(e.name, *Tensor::Zeros(v1::FLOAT32, {n}), config));
  }
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  const Tensor grad = Tensor::FromValues<float>({n}, Normal(n));
  Tensor out;
  return TimeSteps(steps,
                   [&](size_t e) { return client->PushPull(encodings[e].name, grad, &out); });
}

absl::StatusOr<Steps> MeasureSparseSteps(const std::string& server, uint64_t rows, int steps) {
  std::unique_ptr<LocalCluster> local;
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Connect(server, &local));
  // Tables need the servers open, as a trainer's would be.
  (void)client->FinishInitParams();
  const std::vector<Encoding> encodings = Encodings();
  std::vector<Table> tables;
  for (const Encoding& e : encodings) {
    v1::TableConfig config;
    config.set_dim(kSparseDim);
    config.mutable_optimizer()->mutable_sgd()->set_learning_rate(1e-6);
    *config.mutable_wire_compression() = e.compression;
    PS_ASSIGN_OR_RETURN(Table table, Table::Create(*client, absl::StrCat("t_", e.name), config));
    tables.push_back(table);
  }
  std::vector<uint64_t> keys(rows);
  for (uint64_t i = 0; i < rows; ++i) keys[i] = i * 7919;  // spread over the key space
  const std::vector<float> grads = Normal(rows * kSparseDim);
  std::vector<float> out(rows * kSparseDim);
  return TimeSteps(steps, [&](size_t e) -> absl::Status {
    PS_RETURN_IF_ERROR(tables[e].Push<float>(keys, grads));
    return tables[e].Pull<float>(keys, absl::MakeSpan(out));
  });
}

}  // namespace pserver::bench
