// Compression on the wire: softmax regression on generated 8x8 "digits"
// (10 classes, pixel values 0-16 like sklearn's digits set), trained through
// a two-server cluster four times from the same start on the same batches:
// uncompressed, float16, bfloat16 and top-k with error feedback
// (ParameterConfig.wire_compression). Prints each run's test accuracy and the
// bytes its gradients took, and exits 1 unless every compressed run ends
// within --tolerance of the uncompressed accuracy.
//
//   bazel run //examples:compressed_digits
//   bazel run //examples:compressed_digits -- --topk_fraction=0.05 --epochs=12
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "cc/client/client.h"
#include "cc/core/compression.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"
#include "examples/encoding_runs.h"
#include "examples/example_main.h"

ABSL_FLAG(int, epochs, 10, "Passes over the training set.");
ABSL_FLAG(int, train, 2000, "Generated training samples.");
ABSL_FLAG(int, test, 1000, "Generated test samples.");
ABSL_FLAG(int, batch, 32, "Mini-batch size.");
ABSL_FLAG(double, lr, 0.3, "SGD learning rate (on the mean gradient of a batch).");
ABSL_FLAG(double, topk_fraction, 0.1, "Top-k run: fraction of each block sent per step.");
ABSL_FLAG(double, tolerance, 0.01, "Largest accuracy loss allowed against float32.");

namespace {

using pserver::Client;
using pserver::Tensor;
namespace v1 = pserver::v1;

constexpr int kPixels = 64;
constexpr int kClasses = 10;

struct Digits {
  std::vector<float> x;  // samples x kPixels, scaled to [0, 1]
  std::vector<int> y;
  int size() const { return static_cast<int>(y.size()); }
};

// Each class is a random 8x8 stroke pattern; a sample is its class's
// pattern, shifted by up to a pixel, with noisy intensities (0-16).
struct DigitGenerator {
  explicit DigitGenerator(uint32_t seed) : rng(seed) {
    std::bernoulli_distribution on(0.35);
    for (auto& pattern : patterns) {
      for (float& p : pattern) p = on(rng) ? 16.0f : 0.0f;
    }
  }

  Digits Make(int n) {
    Digits d;
    std::uniform_int_distribution<int> label(0, kClasses - 1), shift(-1, 1);
    std::normal_distribution<float> noise(0.0f, 5.0f);
    for (int s = 0; s < n; ++s) {
      const int c = label(rng), dr = shift(rng), dc = shift(rng);
      for (int r = 0; r < 8; ++r) {
        for (int col = 0; col < 8; ++col) {
          const int sr = r - dr, sc = col - dc;
          const float base = sr >= 0 && sr < 8 && sc >= 0 && sc < 8 ? patterns[c][sr * 8 + sc] : 0;
          d.x.push_back(std::clamp(base + noise(rng), 0.0f, 16.0f) / 16.0f);
        }
      }
      d.y.push_back(c);
    }
    return d;
  }

  std::mt19937 rng;
  float patterns[kClasses][kPixels];
};

// Softmax over the logits of sample `s`: probabilities in `p`.
void Softmax(const std::vector<float>& w, const float* x, float* p) {
  float top = -1e30f;
  for (int c = 0; c < kClasses; ++c) {
    float z = w[kPixels * kClasses + c];  // bias row
    for (int i = 0; i < kPixels; ++i) z += x[i] * w[i * kClasses + c];
    p[c] = z;
    top = std::max(top, z);
  }
  float sum = 0;
  for (int c = 0; c < kClasses; ++c) sum += p[c] = std::exp(p[c] - top);
  for (int c = 0; c < kClasses; ++c) p[c] /= sum;
}

double Accuracy(const std::vector<float>& w, const Digits& d) {
  int right = 0;
  float p[kClasses];
  for (int s = 0; s < d.size(); ++s) {
    Softmax(w, &d.x[s * kPixels], p);
    right += std::max_element(p, p + kClasses) - p == d.y[s];
  }
  return static_cast<double>(right) / d.size();
}

using Run = pserver::EncodingRun;

// Trains one model (weights and bias in one parameter "w", (kPixels + 1) x
// kClasses) with `run.compression` and returns its test accuracy.
absl::Status Train(const Digits& train, const Digits& test, Run& run) {
  PS_ASSIGN_OR_RETURN(auto cluster, pserver::LocalCluster::Start(2));
  pserver::ClientOptions options;
  options.servers = cluster->addresses();
  options.block_bytes = 1024;  // split over both servers
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  v1::ParameterConfig config;
  config.mutable_learning_rate()->set_learning_rate(absl::GetFlag(FLAGS_lr));
  *config.mutable_wire_compression() = run.compression;
  const pserver::Shape shape = {kPixels + 1, kClasses};
  PS_RETURN_IF_ERROR(client->InitParam("w", *Tensor::Zeros(v1::FLOAT32, shape), config));
  PS_RETURN_IF_ERROR(client->FinishInitParams());

  const int batch = absl::GetFlag(FLAGS_batch);
  const size_t k_per_block = pserver::TopKCount(run.compression, 1024 / sizeof(float));
  const size_t value_bytes = pserver::ElementSize(pserver::WireValueType(run.compression));
  std::vector<float> w((kPixels + 1) * kClasses, 0.0f), g(w.size());
  std::vector<int> order(train.size());
  for (int i = 0; i < train.size(); ++i) order[i] = i;
  std::mt19937 shuffle(11);  // the same batches in every run
  float p[kClasses];
  for (int epoch = 0; epoch < absl::GetFlag(FLAGS_epochs); ++epoch) {
    std::shuffle(order.begin(), order.end(), shuffle);
    for (int start = 0; start + batch <= train.size(); start += batch) {
      std::fill(g.begin(), g.end(), 0.0f);
      for (int b = start; b < start + batch; ++b) {
        const float* x = &train.x[order[b] * kPixels];
        Softmax(w, x, p);
        p[train.y[order[b]]] -= 1.0f;  // d(log-loss)/d(logits)
        for (int c = 0; c < kClasses; ++c) {
          const float d = p[c] / batch;
          for (int i = 0; i < kPixels; ++i) g[i * kClasses + c] += x[i] * d;
          g[kPixels * kClasses + c] += d;
        }
      }
      Tensor out;
      PS_RETURN_IF_ERROR(client->PushPull("w", Tensor::FromValues<float>(shape, g), &out));
      std::copy_n(reinterpret_cast<const float*>(out.data()), w.size(), w.begin());
      const size_t blocks = (w.size() * sizeof(float) + 1023) / 1024;
      run.bytes += k_per_block > 0 ? std::min(w.size(), blocks * k_per_block) * (4 + value_bytes)
                                   : w.size() * value_bytes;
    }
  }
  run.accuracy = Accuracy(w, test);
  return absl::OkStatus();
}

absl::Status RunExample() {
  DigitGenerator generator(2024);
  const Digits train = generator.Make(absl::GetFlag(FLAGS_train));
  const Digits test = generator.Make(absl::GetFlag(FLAGS_test));
  std::vector<Run> runs(4);
  runs[0].label = "float32";
  runs[1].label = "float16";
  runs[1].compression.set_value_type(v1::WireCompression::FLOAT16);
  runs[2].label = "bfloat16";
  runs[2].compression.set_value_type(v1::WireCompression::BFLOAT16);
  runs[3].label = absl::StrCat("top-k ", absl::GetFlag(FLAGS_topk_fraction));
  runs[3].compression.set_topk_fraction(absl::GetFlag(FLAGS_topk_fraction));
  for (Run& run : runs) PS_RETURN_IF_ERROR(Train(train, test, run));
  return pserver::ReportRuns(runs, absl::GetFlag(FLAGS_tolerance), "gradient payload bytes");
}

}  // namespace

int main(int argc, char** argv) {
  return pserver::ExampleMain("compressed_digits", argc, argv, RunExample);
}
