// Quickstart: logistic regression trained by two trainer threads through an
// in-process cluster of two parameter servers.
//
//   bazel run //examples:quickstart
//   bazel run //examples:quickstart -- --servers=3 --trainers=4 --epochs=8
//   bazel run //examples:quickstart -- --etcd=127.0.0.1:2379   # servers found in etcd
//
// Each trainer owns half of a generated dataset; per mini-batch it pulls the
// weights, computes the log-loss gradient and pushes it; the servers apply
// Adam. The program prints the loss per epoch and exits 1 unless the loss
// falls below half of its starting value.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "cc/client/client.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"
#include "examples/example_main.h"

ABSL_FLAG(int, servers, 2, "Parameter servers in the in-process cluster.");
ABSL_FLAG(int, trainers, 2, "Trainer threads.");
ABSL_FLAG(int, epochs, 6, "Passes over the data.");
ABSL_FLAG(int, samples, 4000, "Generated samples.");
ABSL_FLAG(int, features, 32, "Features per sample.");
ABSL_FLAG(int, batch, 50, "Mini-batch size.");
ABSL_FLAG(std::string, etcd, "",
          "etcd endpoints: train on the servers registered there (docs/operations.md) "
          "instead of an in-process cluster.");
ABSL_FLAG(std::string, cluster, "default", "With --etcd: the cluster name.");

namespace {

using pserver::Client;
using pserver::Tensor;

struct Dataset {
  int features;
  std::vector<float> x;  // samples x features
  std::vector<float> y;  // 0 or 1
  int size() const { return static_cast<int>(y.size()); }
};

// Labels drawn from a logistic model with hidden weights, so a linear model
// can learn them well but not perfectly.
Dataset Generate(int samples, int features, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  std::vector<float> truth(features);
  for (float& w : truth) w = normal(rng);
  Dataset d{features, std::vector<float>(static_cast<size_t>(samples) * features),
            std::vector<float>(samples)};
  for (int i = 0; i < samples; ++i) {
    float z = 0.5f;
    for (int j = 0; j < features; ++j) {
      float v = normal(rng);
      d.x[static_cast<size_t>(i) * features + j] = v;
      z += v * truth[j];
    }
    d.y[i] = uniform(rng) < 1.0f / (1.0f + std::exp(-z)) ? 1.0f : 0.0f;
  }
  return d;
}

float Sigmoid(float z) { return 1.0f / (1.0f + std::exp(-z)); }

// Mean log-loss of (w, b) over samples [begin, end).
double LogLoss(const Dataset& d, const std::vector<float>& w, float b, int begin, int end) {
  double loss = 0;
  for (int i = begin; i < end; ++i) {
    float z = b;
    for (int j = 0; j < d.features; ++j) z += w[j] * d.x[static_cast<size_t>(i) * d.features + j];
    const double p = std::clamp<double>(Sigmoid(z), 1e-7, 1 - 1e-7);
    loss -= d.y[i] * std::log(p) + (1 - d.y[i]) * std::log(1 - p);
  }
  return loss / std::max(1, end - begin);
}

// One pass of one trainer over its shard [begin, end).
absl::Status TrainEpoch(Client& client, const Dataset& d, int begin, int end, int batch) {
  const std::vector<std::string> names = {"weights", "bias"};
  for (int start = begin; start < end; start += batch) {
    const int stop = std::min(end, start + batch);
    PS_ASSIGN_OR_RETURN(std::vector<Tensor> params, client.GetParams(names));
    absl::Span<const float> w = params[0].values<float>();
    const float b = params[1].values<float>()[0];
    std::vector<float> grad_w(d.features, 0.0f);
    float grad_b = 0;
    for (int i = start; i < stop; ++i) {
      const float* x = &d.x[static_cast<size_t>(i) * d.features];
      float z = b;
      for (int j = 0; j < d.features; ++j) z += w[j] * x[j];
      const float err = Sigmoid(z) - d.y[i];
      for (int j = 0; j < d.features; ++j) grad_w[j] += err * x[j] / (stop - start);
      grad_b += err / (stop - start);
    }
    PS_RETURN_IF_ERROR(client.SendGrads({
        {"weights", Tensor::FromValues<float>({d.features}, grad_w)},
        {"bias", Tensor::FromValues<float>({1}, {grad_b})},
    }));
  }
  return absl::OkStatus();
}

absl::Status Run() {
  const int trainers = absl::GetFlag(FLAGS_trainers);
  const int epochs = absl::GetFlag(FLAGS_epochs);
  const int batch = absl::GetFlag(FLAGS_batch);
  if (trainers < 1 || epochs < 1 || batch < 1) {
    return absl::InvalidArgumentError("--trainers, --epochs and --batch must be >= 1");
  }
  const Dataset data = Generate(absl::GetFlag(FLAGS_samples), absl::GetFlag(FLAGS_features), 7);

  std::unique_ptr<pserver::LocalCluster> cluster;
  pserver::ClientOptions options;
  if (absl::GetFlag(FLAGS_etcd).empty()) {
    PS_ASSIGN_OR_RETURN(cluster, pserver::LocalCluster::Start(absl::GetFlag(FLAGS_servers)));
    options.servers = cluster->addresses();
  } else {
    options.etcd_endpoints = absl::StrSplit(absl::GetFlag(FLAGS_etcd), ',');
    options.cluster = absl::GetFlag(FLAGS_cluster);
  }
  // Tiny blocks, so the 32 weights are spread over every server; real
  // clusters keep the 1 MiB default.
  options.block_bytes = 64;
  PS_ASSIGN_OR_RETURN(auto client, Client::Connect(options));
  std::printf("cluster: %d servers:", client->num_servers());
  for (const std::string& a : client->addresses()) std::printf(" %s", a.c_str());
  std::printf("\n");

  pserver::v1::ParameterConfig config;
  config.mutable_optimizer()->mutable_adam();
  config.mutable_learning_rate()->set_learning_rate(0.05);
  absl::Status init = client->InitParams({
      {"weights", Tensor::FromValues<float>({data.features}, std::vector<float>(data.features)),
       config},
      {"bias", Tensor::FromValues<float>({1}, {0.0f}), config},
  });
  // Servers restored from a checkpoint already hold the parameters.
  const bool resumed = absl::IsAlreadyExists(init) && cluster == nullptr;
  if (resumed) {
    std::printf("parameters already initialized: continuing from the servers' state\n");
  } else {
    PS_RETURN_IF_ERROR(init);
  }
  PS_RETURN_IF_ERROR(client->FinishInitParams());

  auto loss_now = [&]() -> absl::StatusOr<double> {
    PS_ASSIGN_OR_RETURN(std::vector<Tensor> p, client->GetParams({"weights", "bias"}));
    return LogLoss(data, p[0].ToVector<float>(), p[1].values<float>()[0], 0, data.size());
  };
  PS_ASSIGN_OR_RETURN(const double initial, loss_now());
  std::printf("epoch  loss\n    0  %.4f\n", initial);
  double loss = initial;
  for (int epoch = 1; epoch <= epochs; ++epoch) {
    std::vector<absl::Status> results(trainers);
    std::vector<std::thread> threads;
    const int shard = data.size() / trainers;
    for (int t = 0; t < trainers; ++t) {
      const int begin = t * shard;
      const int end = t + 1 == trainers ? data.size() : begin + shard;
      threads.emplace_back(
          [&, t, begin, end] { results[t] = TrainEpoch(*client, data, begin, end, batch); });
    }
    for (std::thread& th : threads) th.join();
    for (const absl::Status& s : results) PS_RETURN_IF_ERROR(s);
    PS_ASSIGN_OR_RETURN(loss, loss_now());
    std::printf("%5d  %.4f\n", epoch, loss);
    std::fflush(stdout);
  }
  PS_ASSIGN_OR_RETURN(auto stats, client->GetStats());
  for (const auto& s : stats) {
    std::printf("server %u: %llu gradients applied, %llu reads served\n", s.index(),
                static_cast<unsigned long long>(s.gradients_applied()),
                static_cast<unsigned long long>(s.gets_served()));
  }
  if (resumed) {
    std::printf("loss went from %.4f to %.4f\n", initial, loss);
    return absl::OkStatus();
  }
  return pserver::CheckFell("loss", initial, loss, 0.5);
}

}  // namespace

int main(int argc, char** argv) { return pserver::ExampleMain("quickstart", argc, argv, Run); }
