// Compression on the wire for a sparse table: a classifier over categorical
// features (an embedding table, the sum of a sample's rows, then a linear
// layer), trained through a two-server cluster five times from the same start
// on the same batches: the table's pushed gradient rows and pulled rows
// uncompressed, in float16, in bfloat16, as top-k rows with error feedback,
// and as top-k rows in float16 (TableConfig.wire_compression). The linear
// layer stays float32. Prints each run's test accuracy and the bytes of its
// table pushes, and exits 1 unless every compressed run ends within
// --tolerance of the uncompressed accuracy.
//
//   bazel run //examples:compressed_embeddings
//   bazel run //examples:compressed_embeddings -- --topk_fraction=0.25 --epochs=8
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
#include "cc/client/table.h"
#include "cc/core/compression.h"
#include "cc/core/row_error_feedback.h"
#include "cc/core/status_macros.h"
#include "cc/server/local_cluster.h"
#include "examples/encoding_runs.h"
#include "examples/example_main.h"

ABSL_FLAG(int, epochs, 6, "Passes over the training set.");
ABSL_FLAG(int, train, 4000, "Generated training samples.");
ABSL_FLAG(int, test, 2000, "Generated test samples.");
ABSL_FLAG(int, batch, 32, "Mini-batch size.");
ABSL_FLAG(double, lr, 0.5, "SGD learning rate of the table and the linear layer.");
ABSL_FLAG(double, topk_fraction, 0.5, "Top-k runs: fraction of each push's rows sent.");
ABSL_FLAG(double, tolerance, 0.01, "Largest accuracy loss allowed against float32.");

namespace {

using pserver::Client;
using pserver::Table;
using pserver::Tensor;
namespace v1 = pserver::v1;

constexpr int kFields = 4;   // categorical features per sample
constexpr int kVocab = 300;  // values per field
constexpr int kDim = 8;      // embedding width
constexpr int kClasses = 4;
constexpr int kWeights = (kDim + 1) * kClasses;  // W (kDim x kClasses), then the bias

struct Samples {
  std::vector<uint64_t> keys;  // samples x kFields: field * kVocab + value
  std::vector<int> y;
  int size() const { return static_cast<int>(y.size()); }
};

// Every (field, value) has a hidden score per class; a sample's class is
// the one its values score highest in sum.
struct Generator {
  explicit Generator(uint32_t seed) : rng(seed), scores(kFields * kVocab * kClasses) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& s : scores) s = normal(rng);
  }
  Samples Make(int n) {
    std::uniform_int_distribution<int> value(0, kVocab - 1);
    Samples out;
    for (int s = 0; s < n; ++s) {
      float total[kClasses] = {};
      for (int f = 0; f < kFields; ++f) {
        const uint64_t key = static_cast<uint64_t>(f * kVocab + value(rng));
        out.keys.push_back(key);
        for (int c = 0; c < kClasses; ++c) total[c] += scores[key * kClasses + c];
      }
      out.y.push_back(static_cast<int>(std::max_element(total, total + kClasses) - total));
    }
    return out;
  }
  std::mt19937 rng;
  std::vector<float> scores;
};

// Softmax of the logits of a sample whose summed embedding is `h`.
void Softmax(const std::vector<float>& w, const float* h, float* p) {
  float max = -INFINITY;
  for (int c = 0; c < kClasses; ++c) {
    float z = w[kDim * kClasses + c];
    for (int d = 0; d < kDim; ++d) z += h[d] * w[d * kClasses + c];
    p[c] = z;
    max = std::max(max, z);
  }
  float sum = 0;
  for (int c = 0; c < kClasses; ++c) sum += (p[c] = std::exp(p[c] - max));
  for (int c = 0; c < kClasses; ++c) p[c] /= sum;
}

// Sums each sample's kFields rows of `rows` into h (samples x kDim).
void SumRows(const std::vector<float>& rows, int samples, std::vector<float>* h) {
  h->assign(static_cast<size_t>(samples) * kDim, 0.0f);
  for (int s = 0; s < samples; ++s) {
    for (int f = 0; f < kFields; ++f) {
      for (int d = 0; d < kDim; ++d) (*h)[s * kDim + d] += rows[(s * kFields + f) * kDim + d];
    }
  }
}

using Run = pserver::EncodingRun;

double Accuracy(const Table& table, const std::vector<float>& w, const Samples& test) {
  std::vector<float> rows(test.keys.size() * kDim), h;
  if (!table.Pull<float>(test.keys, absl::MakeSpan(rows)).ok()) return 0;
  SumRows(rows, test.size(), &h);
  int right = 0;
  float p[kClasses];
  for (int s = 0; s < test.size(); ++s) {
    Softmax(w, &h[s * kDim], p);
    right += std::max_element(p, p + kClasses) - p == test.y[s];
  }
  return static_cast<double>(right) / test.size();
}

absl::Status Train(const Samples& train, const Samples& test, Run& run) {
  PS_ASSIGN_OR_RETURN(auto cluster, pserver::LocalCluster::Start(2));
  pserver::ClientOptions options;
  options.servers = cluster->addresses();
  PS_ASSIGN_OR_RETURN(std::unique_ptr<Client> client, Client::Connect(options));
  const double lr = absl::GetFlag(FLAGS_lr);
  v1::ParameterConfig dense;
  dense.mutable_learning_rate()->set_learning_rate(lr);
  std::vector<float> w(kWeights, 0.0f);
  std::mt19937 init(3);
  std::normal_distribution<float> small(0.0f, 0.1f);
  for (int i = 0; i < kDim * kClasses; ++i) w[i] = small(init);
  PS_RETURN_IF_ERROR(client->InitParam("w", Tensor::FromValues<float>({kWeights}, w), dense));
  PS_RETURN_IF_ERROR(client->FinishInitParams());
  v1::TableConfig config;
  config.set_dim(kDim);
  config.mutable_initializer()->mutable_normal()->set_stddev(0.1);
  config.mutable_initializer()->set_seed(7);
  config.mutable_optimizer()->mutable_sgd()->set_learning_rate(lr);
  if (pserver::Compresses(run.compression)) *config.mutable_wire_compression() = run.compression;
  PS_ASSIGN_OR_RETURN(Table table, Table::Create(*client, "emb", config));

  const int batch = absl::GetFlag(FLAGS_batch);
  const size_t row_bytes = kDim * pserver::ElementSize(pserver::WireValueType(run.compression));
  std::vector<int> order(train.size());
  for (int i = 0; i < train.size(); ++i) order[i] = i;
  std::mt19937 shuffle(11);  // the same batches in every run
  std::vector<uint64_t> keys(batch * kFields);
  std::vector<float> rows(keys.size() * kDim), h, row_grads(rows.size()), g(kWeights);
  float p[kClasses];
  for (int epoch = 0; epoch < absl::GetFlag(FLAGS_epochs); ++epoch) {
    std::shuffle(order.begin(), order.end(), shuffle);
    for (int start = 0; start + batch <= train.size(); start += batch) {
      for (int b = 0; b < batch; ++b) {
        std::copy_n(&train.keys[order[start + b] * kFields], kFields, &keys[b * kFields]);
      }
      PS_RETURN_IF_ERROR(table.Pull<float>(keys, absl::MakeSpan(rows)));
      SumRows(rows, batch, &h);
      std::fill(g.begin(), g.end(), 0.0f);
      for (int b = 0; b < batch; ++b) {
        Softmax(w, &h[b * kDim], p);
        p[train.y[order[start + b]]] -= 1.0f;  // d(log-loss)/d(logits)
        float dh[kDim] = {};
        for (int c = 0; c < kClasses; ++c) {
          const float d = p[c] / batch;
          for (int k = 0; k < kDim; ++k) {
            g[k * kClasses + c] += h[b * kDim + k] * d;
            dh[k] += w[k * kClasses + c] * d;
          }
          g[kDim * kClasses + c] += d;
        }
        for (int f = 0; f < kFields; ++f)
          std::copy_n(dh, kDim, &row_grads[(b * kFields + f) * kDim]);
      }
      PS_RETURN_IF_ERROR(table.Push<float>(keys, row_grads));
      Tensor out;
      PS_RETURN_IF_ERROR(client->PushPull("w", Tensor::FromValues<float>({kWeights}, g), &out));
      std::copy_n(reinterpret_cast<const float*>(out.data()), kWeights, w.begin());
      const size_t distinct = pserver::RowErrorFeedback::DistinctKeys(keys);
      const size_t sent = pserver::TopKCount(run.compression, 1) > 0
                              ? pserver::TopKCount(run.compression, distinct)
                              : keys.size();
      run.bytes += sent * (sizeof(uint64_t) + row_bytes);
    }
  }
  run.accuracy = Accuracy(table, w, test);
  return absl::OkStatus();
}

absl::Status RunExample() {
  Generator generator(2024);
  const Samples train = generator.Make(absl::GetFlag(FLAGS_train));
  const Samples test = generator.Make(absl::GetFlag(FLAGS_test));
  const double fraction = absl::GetFlag(FLAGS_topk_fraction);
  std::vector<Run> runs(5);
  runs[0].label = "float32";
  runs[1].label = "float16";
  runs[1].compression.set_value_type(v1::WireCompression::FLOAT16);
  runs[2].label = "bfloat16";
  runs[2].compression.set_value_type(v1::WireCompression::BFLOAT16);
  runs[3].label = absl::StrCat("top-k ", fraction);
  runs[3].compression.set_topk_fraction(fraction);
  runs[4].label = absl::StrCat("top-k ", fraction, "+f16");
  runs[4].compression.set_topk_fraction(fraction);
  runs[4].compression.set_value_type(v1::WireCompression::FLOAT16);
  for (Run& run : runs) PS_RETURN_IF_ERROR(Train(train, test, run));
  return pserver::ReportRuns(runs, absl::GetFlag(FLAGS_tolerance), "table push bytes");
}

}  // namespace

int main(int argc, char** argv) {
  return pserver::ExampleMain("compressed_embeddings", argc, argv, RunExample);
}
