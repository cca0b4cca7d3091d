#include "cc/core/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <future>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "cc/core/crc32c.h"
#include "cc/core/element_type.h"
#include "cc/core/optimizer.h"
#include "cc/core/parameter_store.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "google/protobuf/text_format.h"
#include "gtest/gtest.h"
#include "pserver/v1/checkpoint.pb.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

using ::pserver::testing::IsOk;
using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;
using ::testing::StartsWith;

// ---- helpers ------------------------------------------------------------------

// A fresh, empty directory for one test under $TEST_TMPDIR.
std::string TestDir() {
  const char* root = std::getenv("TEST_TMPDIR");
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") /
                 absl::StrCat(info->test_suite_name(), ".", info->name());
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& data) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << data;
}

void FlipByte(const std::string& path, uint64_t offset) {
  std::string data = ReadFile(path);
  ASSERT_LT(offset, data.size()) << path;
  data[offset] ^= 0x20;
  WriteFile(path, data);
}

void Truncate(const std::string& path, uint64_t size) {
  ASSERT_EQ(::truncate(path.c_str(), static_cast<off_t>(size)), 0) << path;
}

std::vector<std::string> Names(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir)) {
    names.push_back(entry.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

v1::ParameterConfig Config(const std::string& text) {
  v1::ParameterConfig config;
  EXPECT_TRUE(google::protobuf::TextFormat::ParseFromString(text, &config)) << text;
  return config;
}

v1::BlockRef Block(uint32_t index, uint32_t count, uint64_t offset) {
  v1::BlockRef block;
  block.set_index(index);
  block.set_count(count);
  block.set_offset(offset);
  return block;
}

// Deterministic pseudo-random values of any storable type.
std::string Values(ElementType type, size_t n, uint64_t seed) {
  std::string bytes;
  DispatchStorable(type, [&](auto tag) {
    using T = typename decltype(tag)::type;
    std::vector<T> values(n);
    uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
    for (size_t i = 0; i < n; ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      const double u = static_cast<double>(x >> 11) / static_cast<double>(1ull << 53);
      if constexpr (std::is_floating_point_v<T>) {
        values[i] = static_cast<T>(2 * u - 1);
      } else {
        values[i] = static_cast<T>(static_cast<int64_t>(u * 100) - 50);
      }
    }
    bytes.assign(reinterpret_cast<const char*>(values.data()), n * sizeof(T));
  });
  return bytes;
}

// One block of the test model.
struct Spec {
  std::string name;
  ElementType type;
  Shape shape;
  v1::BlockRef block;
  size_t elements;
  std::string config;
  bool trainable = true;
};

std::vector<Spec> ModelSpecs() {
  return {
      {"w", v1::FLOAT32, {3, 4}, Block(0, 1, 0), 12,
       "optimizer { adam {} } learning_rate { learning_rate: 0.05 warmup_steps: 3 "
       "cosine { decay_steps: 20 min_learning_rate: 0.001 } } clipping { clip_norm: 1.5 }"},
      {"b", v1::FLOAT64, {5}, Block(0, 1, 0), 5,
       "optimizer { sgd { momentum: 0.9 nesterov: true weight_decay: 0.01 } } "
       "learning_rate { learning_rate: 0.1 linear { end_learning_rate: 0.01 decay_steps: 10 } }"},
      {"emb", v1::FLOAT32, {10}, Block(0, 2, 0), 5,
       "optimizer { rmsprop { centered: true momentum: 0.5 } }"},
      {"emb", v1::FLOAT32, {10}, Block(1, 2, 5), 5,
       "optimizer { rmsprop { centered: true momentum: 0.5 } }"},
      {"acc", v1::FLOAT64, {4}, Block(0, 1, 0), 4,
       "optimizer { adagrad { initial_accumulator: 0.1 } }"},
      {"delta", v1::FLOAT32, {6}, Block(0, 1, 0), 6, "optimizer { adadelta {} }"},
      {"aw", v1::FLOAT64, {2, 3}, Block(0, 1, 0), 6,
       "optimizer { adamw { weight_decay: 0.05 } } learning_rate { learning_rate: 0.02 "
       "step { step_size: 3 gamma: 0.5 } } clipping { clip_value: 0.3 }"},
      {"plain", v1::FLOAT32, {3}, Block(0, 1, 0), 3, ""},
      {"counts", v1::INT64, {4}, Block(0, 1, 0), 4, "optimizer { add {} }"},
      {"ids", v1::INT32, {3}, Block(0, 1, 0), 3, "", /*trainable=*/false},
  };
}

void InitModel(ParameterStore* store) {
  uint64_t seed = 1;
  for (const Spec& spec : ModelSpecs()) {
    v1::Parameter param;
    param.set_name(spec.name);
    param.set_element_type(spec.type);
    for (int64_t dim : spec.shape) param.add_shape(dim);
    *param.mutable_block() = spec.block;
    param.set_content(Values(spec.type, spec.elements, seed++));
    ASSERT_OK(store->Init(std::move(param), Config(spec.config)));
  }
  store->FinishInit();
}

// Applies gradients for steps [first, first + count) to every trainable block.
void Train(ParameterStore* store, int first, int count) {
  for (int step = first; step < first + count; ++step) {
    uint64_t seed = 1000 * (step + 1);
    for (const Spec& spec : ModelSpecs()) {
      ++seed;
      if (!spec.trainable) continue;
      v1::Gradient grad;
      grad.set_name(spec.name);
      grad.set_element_type(spec.type);
      *grad.mutable_block() = spec.block;
      grad.set_content(Values(spec.type, spec.elements, seed));
      if (spec.block.count() > 1) grad.set_global_norm(1.25);
      ASSERT_OK(store->ApplyGradients({&grad}));
    }
  }
}

// Every block's current content, in ModelSpecs order.
std::vector<std::string> Contents(ParameterStore* store) {
  std::vector<std::string> contents;
  for (const Spec& spec : ModelSpecs()) {
    v1::ParamRef ref;
    ref.set_name(spec.name);
    *ref.mutable_block() = spec.block;
    v1::Parameter out;
    EXPECT_OK(store->Get(ref, &out));
    contents.push_back(out.content());
  }
  return contents;
}

void ExpectSnapshotsEqual(const StoreSnapshot& a, const StoreSnapshot& b) {
  EXPECT_EQ(a.initialized, b.initialized);
  EXPECT_EQ(a.extensions, b.extensions);
  ASSERT_EQ(a.blocks.size(), b.blocks.size());
  for (size_t i = 0; i < a.blocks.size(); ++i) {
    const BlockSnapshot& x = a.blocks[i];
    const BlockSnapshot& y = b.blocks[i];
    SCOPED_TRACE(DescribeBlock(x.name, x.block));
    EXPECT_EQ(x.name, y.name);
    EXPECT_EQ(x.type, y.type);
    EXPECT_EQ(x.shape, y.shape);
    EXPECT_EQ(x.block.SerializeAsString(), y.block.SerializeAsString());
    EXPECT_EQ(x.config.SerializeAsString(), y.config.SerializeAsString());
    EXPECT_EQ(x.content, y.content);
    EXPECT_EQ(x.optimizer.steps, y.optimizer.steps);
    EXPECT_EQ(x.optimizer.slots, y.optimizer.slots);
  }
}

// A trained model's snapshot with two extensions.
StoreSnapshot TrainedSnapshot(int steps) {
  ParameterStore store;
  InitModel(&store);
  Train(&store, 0, steps);
  StoreSnapshot snapshot = store.Snapshot();
  snapshot.extensions["client_sequences"] = std::string("\x01\x00\xff binary", 10);
  snapshot.extensions["empty"] = "";
  return snapshot;
}

std::string ManifestPath(const CheckpointInfo& info) { return info.path + "/MANIFEST"; }

// Rewrites a checkpoint's manifest through `edit`, framing it with a correct
// checksum: for manifests that are intact but say wrong things.
void RewriteManifest(const std::string& checkpoint,
                     const std::function<void(v1::CheckpointManifest*)>& edit) {
  const std::string path = checkpoint + "/MANIFEST";
  const std::string framed = ReadFile(path);
  ASSERT_GE(framed.size(), kManifestHeaderSize);
  v1::CheckpointManifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(framed.substr(kManifestHeaderSize)));
  edit(&manifest);
  const std::string body = manifest.SerializeAsString();
  std::string header(kManifestHeaderSize, '\0');
  std::memcpy(header.data(), "PSCKPT01", 8);
  const uint32_t length = body.size(), crc = Crc32c(body);
  for (int i = 0; i < 4; ++i) {
    header[8 + i] = static_cast<char>(length >> (8 * i));
    header[12 + i] = static_cast<char>(crc >> (8 * i));
  }
  WriteFile(path, header + body);
}

// ---- optimizer state --------------------------------------------------------------

std::vector<std::string> SlotNames(const std::string& config, ElementType type = v1::FLOAT32) {
  auto opt = Optimizer::Create(Config(config), type, 4);
  EXPECT_OK(opt.status());
  std::vector<std::string> names;
  if (!opt.ok()) return names;
  for (const auto& [name, bytes] : (*opt)->ExportState().slots) {
    EXPECT_EQ(bytes.size(), 4 * ElementSize(type)) << name;
    names.push_back(name);
  }
  return names;
}

TEST(OptimizerStateTest, SlotNamesPerRule) {
  EXPECT_THAT(SlotNames(""), IsEmpty());
  EXPECT_THAT(SlotNames("optimizer { sgd { momentum: 0.9 } }"), ElementsAre("momentum"));
  EXPECT_THAT(SlotNames("optimizer { adagrad {} }"), ElementsAre("accumulator"));
  EXPECT_THAT(SlotNames("optimizer { adadelta {} }"), ElementsAre("square_avg", "acc_delta"));
  EXPECT_THAT(SlotNames("optimizer { rmsprop {} }"), ElementsAre("square_avg"));
  EXPECT_THAT(SlotNames("optimizer { rmsprop { centered: true momentum: 0.9 } }"),
              ElementsAre("square_avg", "grad_avg", "momentum"));
  EXPECT_THAT(SlotNames("optimizer { adam {} }", v1::FLOAT64), ElementsAre("m", "v"));
  EXPECT_THAT(SlotNames("optimizer { adamw {} }"), ElementsAre("m", "v"));
  EXPECT_THAT(SlotNames("optimizer { add {} }", v1::INT64), IsEmpty());
  EXPECT_THAT(SlotNames("", v1::UINT32), IsEmpty());
}

TEST(OptimizerStateTest, ExportedStateHoldsStepsAndAdamMoments) {
  ASSERT_OK_AND_ASSIGN(auto opt, Optimizer::Create(Config("optimizer { adam {} }"),
                                                   v1::FLOAT64, 2));
  std::vector<double> p = {1, 2};
  const std::vector<double> g = {0.5, -0.25};
  opt->Apply(p.data(), g.data(), std::nullopt);
  opt->Apply(p.data(), g.data(), std::nullopt);
  OptimizerState state = opt->ExportState();
  EXPECT_EQ(state.steps, 2u);
  ASSERT_EQ(state.slots.size(), 2u);
  double m[2], v[2];
  std::memcpy(m, state.slots[0].second.data(), sizeof(m));
  std::memcpy(v, state.slots[1].second.data(), sizeof(v));
  // m = b1 m + (1 - b1) g and v = b2 v + (1 - b2) g^2, twice, in float64.
  const double m0 = (1 - 0.9) * 0.5, m1 = (1 - 0.9) * -0.25;
  const double v0 = (1 - 0.999) * 0.25, v1 = (1 - 0.999) * 0.0625;
  EXPECT_DOUBLE_EQ(m[0], 0.9 * m0 + (1 - 0.9) * 0.5);
  EXPECT_DOUBLE_EQ(m[1], 0.9 * m1 + (1 - 0.9) * -0.25);
  EXPECT_DOUBLE_EQ(v[0], 0.999 * v0 + (1 - 0.999) * 0.25);
  EXPECT_DOUBLE_EQ(v[1], 0.999 * v1 + (1 - 0.999) * 0.0625);
}

TEST(OptimizerStateTest, ImportContinuesBitIdentically) {
  const v1::ParameterConfig config =
      Config("optimizer { adam {} } learning_rate { learning_rate: 0.1 step { step_size: 2 "
             "gamma: 0.5 } }");
  ASSERT_OK_AND_ASSIGN(auto a, Optimizer::Create(config, v1::FLOAT32, 3));
  std::vector<float> p = {0.5f, -1.f, 2.f};
  for (int s = 0; s < 3; ++s) {
    std::vector<float> g = {0.1f * s, -0.3f, 0.7f / (s + 1)};
    a->Apply(p.data(), g.data(), std::nullopt);
  }
  ASSERT_OK_AND_ASSIGN(auto b, Optimizer::Create(config, v1::FLOAT32, 3));
  ASSERT_OK(b->ImportState(a->ExportState()));
  EXPECT_EQ(b->steps(), 3u);
  EXPECT_EQ(b->current_learning_rate(), a->current_learning_rate());
  // Without the state, the same steps land elsewhere: the test can fail.
  ASSERT_OK_AND_ASSIGN(auto fresh, Optimizer::Create(config, v1::FLOAT32, 3));
  std::vector<float> q = p, r = p;
  for (int s = 3; s < 6; ++s) {
    std::vector<float> g = {0.2f, -0.1f * s, 0.05f};
    a->Apply(p.data(), g.data(), std::nullopt);
    b->Apply(q.data(), g.data(), std::nullopt);
    fresh->Apply(r.data(), g.data(), std::nullopt);
  }
  EXPECT_EQ(0, std::memcmp(p.data(), q.data(), sizeof(float) * 3));
  EXPECT_NE(0, std::memcmp(p.data(), r.data(), sizeof(float) * 3));
}

TEST(OptimizerStateTest, ImportRejectsMismatchAndChangesNothing) {
  ASSERT_OK_AND_ASSIGN(auto opt, Optimizer::Create(Config("optimizer { adam {} }"),
                                                   v1::FLOAT32, 2));
  std::vector<float> p = {1, 2}, g = {1, 1};
  opt->Apply(p.data(), g.data(), std::nullopt);
  const OptimizerState before = opt->ExportState();

  OptimizerState wrong_names = before;
  wrong_names.steps = 99;
  wrong_names.slots[1].first = "momentum";
  EXPECT_THAT(opt->ImportState(wrong_names),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("[m, v]"), HasSubstr("[m, momentum]"))));
  OptimizerState missing = before;
  missing.slots.pop_back();
  EXPECT_THAT(opt->ImportState(missing), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("[m]")));
  OptimizerState wrong_size = before;
  wrong_size.steps = 99;
  wrong_size.slots[0].second.resize(12);
  EXPECT_THAT(opt->ImportState(wrong_size),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("'m'"), HasSubstr("8 bytes"), HasSubstr("12"))));
  EXPECT_EQ(opt->steps(), 1u);
  EXPECT_EQ(opt->ExportState().slots, before.slots);

  ASSERT_OK_AND_ASSIGN(auto none, Optimizer::Create(Config(""), v1::INT32, 2));
  EXPECT_THAT(none->ImportState(before), StatusCodeIs(absl::StatusCode::kInvalidArgument));
  EXPECT_OK(none->ImportState(OptimizerState{}));
}

// ---- store snapshot and restore ---------------------------------------------------

TEST(StoreSnapshotTest, SnapshotHoldsLayoutConfigAndState) {
  ParameterStore store;
  InitModel(&store);
  Train(&store, 0, 3);
  StoreSnapshot snapshot = store.Snapshot();
  EXPECT_TRUE(snapshot.initialized);
  ASSERT_EQ(snapshot.blocks.size(), ModelSpecs().size());
  // Ordered by (name, block index).
  std::vector<std::string> order;
  for (const BlockSnapshot& b : snapshot.blocks) {
    order.push_back(absl::StrCat(b.name, "/", b.block.index()));
  }
  EXPECT_THAT(order, ElementsAre("acc/0", "aw/0", "b/0", "counts/0", "delta/0", "emb/0",
                                 "emb/1", "ids/0", "plain/0", "w/0"));
  const BlockSnapshot& emb1 = snapshot.blocks[6];
  EXPECT_EQ(emb1.type, v1::FLOAT32);
  EXPECT_EQ(emb1.shape, Shape({10}));
  EXPECT_EQ(emb1.block.count(), 2u);
  EXPECT_EQ(emb1.block.offset(), 5u);
  EXPECT_TRUE(emb1.config.optimizer().rmsprop().centered());
  EXPECT_EQ(emb1.content.size(), 5 * sizeof(float));
  EXPECT_EQ(emb1.optimizer.steps, 3u);
  EXPECT_EQ(emb1.optimizer.slots.size(), 3u);
  const BlockSnapshot& ids = snapshot.blocks[7];
  EXPECT_EQ(ids.optimizer.steps, 0u);
  EXPECT_THAT(ids.optimizer.slots, IsEmpty());
}

TEST(StoreSnapshotTest, RestoreContinuesBitIdentically) {
  ParameterStore original;
  InitModel(&original);
  Train(&original, 0, 7);
  const StoreSnapshot snapshot = original.Snapshot();

  ParameterStore restored;
  ASSERT_OK(restored.Restore(snapshot));
  EXPECT_TRUE(restored.initialized());
  ExpectSnapshotsEqual(restored.Snapshot(), snapshot);

  const std::vector<std::string> at_snapshot = Contents(&original);
  Train(&original, 7, 5);
  Train(&restored, 7, 5);
  const std::vector<std::string> a = Contents(&original);
  EXPECT_EQ(Contents(&restored), a);
  EXPECT_NE(a, at_snapshot);  // training did move the values
}

TEST(StoreSnapshotTest, RestoreOfUninitializedSnapshotLeavesStoreClosed) {
  ParameterStore original;
  v1::Parameter p;
  p.set_name("w");
  p.set_element_type(v1::FLOAT32);
  p.add_shape(2);
  p.set_content(Values(v1::FLOAT32, 2, 7));
  ASSERT_OK(original.Init(p, Config("")));
  StoreSnapshot snapshot = original.Snapshot();
  EXPECT_FALSE(snapshot.initialized);
  ParameterStore restored;
  ASSERT_OK(restored.Restore(snapshot));
  EXPECT_FALSE(restored.initialized());
  v1::ParamRef ref;
  ref.set_name("w");
  v1::Parameter out;
  EXPECT_THAT(restored.Get(ref, &out), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  p.set_name("v");
  EXPECT_OK(restored.Init(p, Config("")));  // still open for InitParam
  restored.FinishInit();
  ASSERT_OK(restored.Get(ref, &out));
  EXPECT_EQ(out.content(), Values(v1::FLOAT32, 2, 7));
}

TEST(StoreSnapshotTest, RestoreNeedsAnEmptyStore) {
  const StoreSnapshot snapshot = TrainedSnapshot(1);
  ParameterStore store;
  InitModel(&store);
  EXPECT_THAT(store.Restore(snapshot),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("empty store")));
  ParameterStore opened;
  opened.FinishInit();
  EXPECT_THAT(opened.Restore(snapshot), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
}

TEST(StoreSnapshotTest, RestoreIsAllOrNothing) {
  StoreSnapshot snapshot = TrainedSnapshot(2);
  // The last block's optimizer state does not fit its config.
  snapshot.blocks.back().optimizer.slots.pop_back();
  ParameterStore store;
  EXPECT_THAT(store.Restore(snapshot),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("parameter 'w'"), HasSubstr("[m, v]"))));
  EXPECT_EQ(store.GetStats().blocks, 0u);
  EXPECT_FALSE(store.initialized());

  StoreSnapshot duplicate = TrainedSnapshot(0);
  duplicate.blocks.push_back(duplicate.blocks.front());
  EXPECT_THAT(store.Restore(duplicate),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  EXPECT_EQ(store.GetStats().blocks, 0u);

  StoreSnapshot bad_layout = TrainedSnapshot(0);
  bad_layout.blocks.front().content.resize(3);
  EXPECT_THAT(store.Restore(bad_layout), StatusIs(absl::StatusCode::kInvalidArgument,
                                                  HasSubstr("parameter 'acc'")));
  EXPECT_EQ(store.GetStats().blocks, 0u);

  EXPECT_OK(store.Restore(TrainedSnapshot(2)));  // the failures left it usable
  EXPECT_EQ(store.GetStats().blocks, ModelSpecs().size());
}

// ---- checkpoint files -------------------------------------------------------------

TEST(CheckpointTest, DirNameIsTwentyDigits) {
  EXPECT_EQ(CheckpointDirName(42), "ckpt-00000000000000000042");
  EXPECT_EQ(CheckpointDirName(UINT64_MAX), "ckpt-18446744073709551615");
}

TEST(CheckpointTest, RoundTripThroughFilesContinuesBitIdentically) {
  const std::string dir = TestDir();
  ParameterStore original;
  InitModel(&original);
  Train(&original, 0, 7);
  StoreSnapshot snapshot = original.Snapshot();
  snapshot.extensions["client_sequences"] = std::string("\0\x01\x02", 3);

  const absl::Time time = absl::FromUnixSeconds(1700000000) + absl::Microseconds(123);
  CheckpointWriteOptions options;
  options.time = time;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 3, 42, options));
  EXPECT_EQ(info.path, dir + "/ckpt-00000000000000000042");
  EXPECT_EQ(info.shard, 3u);
  EXPECT_EQ(info.sequence, 42u);
  EXPECT_EQ(info.time, time);

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  EXPECT_EQ(loaded.info.path, info.path);
  EXPECT_EQ(loaded.info.shard, 3u);
  EXPECT_EQ(loaded.info.sequence, 42u);
  EXPECT_EQ(loaded.info.manifest_crc32c, info.manifest_crc32c);
  EXPECT_EQ(loaded.info.time, time);
  EXPECT_THAT(loaded.skipped, IsEmpty());
  ExpectSnapshotsEqual(loaded.snapshot, snapshot);

  ParameterStore restored;
  ASSERT_OK(restored.Restore(std::move(loaded.snapshot)));
  Train(&original, 7, 6);
  Train(&restored, 7, 6);
  EXPECT_EQ(Contents(&restored), Contents(&original));

  // The optimizer state is what makes it identical: values alone are not enough.
  ParameterStore values_only;
  for (const BlockSnapshot& block : snapshot.blocks) {
    v1::Parameter param;
    param.set_name(block.name);
    param.set_element_type(block.type);
    param.mutable_shape()->Assign(block.shape.begin(), block.shape.end());
    *param.mutable_block() = block.block;
    param.set_content(block.content);
    ASSERT_OK(values_only.Init(param, block.config));
  }
  values_only.FinishInit();
  Train(&values_only, 7, 6);
  EXPECT_NE(Contents(&values_only), Contents(&original));
}

TEST(CheckpointTest, LayoutAndManifestFraming) {
  const std::string dir = TestDir();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(TrainedSnapshot(2), dir, 1, 7));
  EXPECT_THAT(Names(dir), ElementsAre("ckpt-00000000000000000007"));
  EXPECT_THAT(Names(info.path), ElementsAre("MANIFEST", "data-00000.bin"));

  const std::string framed = ReadFile(ManifestPath(info));
  ASSERT_GT(framed.size(), kManifestHeaderSize);
  EXPECT_EQ(framed.substr(0, 8), "PSCKPT01");
  auto le32 = [&](size_t at) {
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= uint32_t{static_cast<unsigned char>(framed[at + i])} << (8 * i);
    return v;
  };
  const std::string body = framed.substr(kManifestHeaderSize);
  EXPECT_EQ(le32(8), body.size());
  EXPECT_EQ(le32(12), Crc32c(body));
  EXPECT_EQ(info.manifest_crc32c, Crc32c(body));

  v1::CheckpointManifest manifest;
  ASSERT_TRUE(manifest.ParseFromString(body));
  EXPECT_EQ(manifest.format_version(), 1u);
  EXPECT_EQ(manifest.shard(), 1u);
  EXPECT_EQ(manifest.sequence(), 7u);
  EXPECT_TRUE(manifest.initialized());
  EXPECT_EQ(manifest.create_time_micros(), absl::ToUnixMicros(info.time));
  ASSERT_EQ(manifest.data_files_size(), 1);
  EXPECT_EQ(manifest.data_files(0).name(), "data-00000.bin");
  EXPECT_EQ(manifest.data_files(0).length(), fs::file_size(info.path + "/data-00000.bin"));
  ASSERT_EQ(manifest.parameters_size(), 10);
  ASSERT_EQ(manifest.extensions_size(), 2);
  EXPECT_EQ(manifest.extensions(0).name(), "client_sequences");
  EXPECT_EQ(manifest.extensions(1).name(), "empty");

  // Items are packed back to back, each chunk's CRC32C over its own bytes.
  const std::string data = ReadFile(info.path + "/data-00000.bin");
  const v1::CheckpointParameter& w = manifest.parameters(9);
  EXPECT_EQ(w.name(), "w");
  EXPECT_EQ(w.optimizer(), "adam");
  EXPECT_EQ(w.optimizer_steps(), 2u);
  EXPECT_EQ(w.element_type(), v1::FLOAT32);
  EXPECT_THAT(w.shape(), ElementsAre(3, 4));
  EXPECT_EQ(w.content().length(), 48u);
  EXPECT_EQ(w.content().chunk_size(), kCheckpointMaxChunkSize);
  ASSERT_EQ(w.content().chunk_crc32c_size(), 1);
  EXPECT_EQ(w.content().chunk_crc32c(0), Crc32c(data.substr(w.content().offset(), 48)));
  ASSERT_EQ(w.optimizer_slots_size(), 2);
  EXPECT_EQ(w.optimizer_slots(0).name(), "m");
  EXPECT_EQ(w.optimizer_slots(0).data().offset(), w.content().offset() + 48);
  EXPECT_EQ(w.optimizer_slots(1).name(), "v");
  EXPECT_EQ(manifest.parameters(0).content().offset(), 0u);
  EXPECT_EQ(manifest.parameters(7).optimizer(), "none");  // ids: int32, no optimizer
  EXPECT_EQ(manifest.extensions(1).data().length(), 0u);
  EXPECT_EQ(manifest.extensions(1).data().chunk_crc32c_size(), 0);
}

TEST(CheckpointTest, SaveRefusesAnExistingSequenceAndBadInput) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(1);
  ASSERT_OK(SaveCheckpoint(snapshot, dir, 0, 5).status());
  EXPECT_THAT(SaveCheckpoint(snapshot, dir, 0, 5),
              StatusIs(absl::StatusCode::kAlreadyExists, HasSubstr("ckpt-00000000000000000005")));

  StoreSnapshot duplicate = snapshot;
  duplicate.blocks.push_back(duplicate.blocks.back());
  EXPECT_THAT(SaveCheckpoint(duplicate, dir, 0, 6),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("twice")));
  CheckpointWriteOptions options;
  options.chunk_size = kCheckpointMaxChunkSize + 1;
  EXPECT_THAT(SaveCheckpoint(snapshot, dir, 0, 6, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("chunk_size")));
  EXPECT_THAT(Names(dir), ElementsAre("ckpt-00000000000000000005"));
}

TEST(CheckpointTest, SaveCreatesTheDirectory) {
  const std::string dir = TestDir() + "/a/b/shard-0";
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1));
  EXPECT_OK(VerifyCheckpoint(info.path).status());
}

TEST(CheckpointTest, EmptyStoreRoundTrip) {
  const std::string dir = TestDir();
  ParameterStore empty;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(empty.Snapshot(), dir, 0, 1));
  EXPECT_THAT(Names(info.path), ElementsAre("MANIFEST"));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  EXPECT_FALSE(loaded.snapshot.initialized);
  EXPECT_THAT(loaded.snapshot.blocks, IsEmpty());
  ParameterStore restored;
  EXPECT_OK(restored.Restore(loaded.snapshot));
}

TEST(CheckpointTest, LargeParameterSpansSeveralChunks) {
  const std::string dir = TestDir();
  constexpr size_t kElements = 3'500'000;  // 14 MB: 4 chunks of at most 4 MiB
  ParameterStore store;
  v1::Parameter big;
  big.set_name("big");
  big.set_element_type(v1::FLOAT32);
  big.add_shape(kElements);
  big.set_content(Values(v1::FLOAT32, kElements, 5));
  ASSERT_OK(store.Init(big, Config("optimizer { sgd { momentum: 0.9 } }")));
  store.FinishInit();
  v1::Gradient grad;
  grad.set_name("big");
  grad.set_element_type(v1::FLOAT32);
  grad.set_content(Values(v1::FLOAT32, kElements, 6));
  ASSERT_OK(store.ApplyGradients({&grad}));
  const StoreSnapshot snapshot = store.Snapshot();
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 0, 1));

  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(info.path));
  const v1::DataRef& content = reader->manifest().parameters(0).content();
  EXPECT_EQ(content.length(), kElements * 4);
  EXPECT_EQ(content.chunk_size(), 4u << 20);
  EXPECT_EQ(content.chunk_crc32c_size(), 4);
  const std::string data = ReadFile(info.path + "/data-00000.bin");
  EXPECT_EQ(content.chunk_crc32c(3),
            Crc32c(data.substr(content.offset() + 3 * (4u << 20), kElements * 4 - 3 * (4u << 20))));
  EXPECT_EQ(reader->manifest().parameters(0).optimizer_slots(0).data().chunk_crc32c_size(), 4);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  ExpectSnapshotsEqual(loaded.snapshot, snapshot);

  // A flipped byte in the third chunk is reported as chunk 2.
  FlipByte(info.path + "/data-00000.bin", content.offset() + 2 * (4u << 20) + 77);
  const std::string want = absl::StrCat(kChecksumValidationFailed, ": ", info.path,
                                        "/data-00000.bin chunk 2: ");
  EXPECT_THAT(LoadCheckpoint(info.path),
              StatusIs(absl::StatusCode::kDataLoss, StartsWith(want)));
  EXPECT_THAT(VerifyCheckpoint(info.path),
              StatusIs(absl::StatusCode::kDataLoss, StartsWith(want)));
}

TEST(CheckpointTest, SmallChunksAndSeveralDataFiles) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(3);
  CheckpointWriteOptions options;
  options.chunk_size = 7;
  options.max_data_file_bytes = 100;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 0, 1, options));
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(info.path));
  EXPECT_GT(reader->manifest().data_files_size(), 3);
  for (const v1::DataFile& file : reader->manifest().data_files()) {
    // Only an item larger than the limit makes a file larger than it.
    EXPECT_LE(file.length(), 100u) << file.name();
    EXPECT_EQ(fs::file_size(info.path + "/" + file.name()), file.length());
  }
  EXPECT_EQ(reader->manifest().parameters(9).content().chunk_crc32c_size(), 7);  // 48 / 7
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  ExpectSnapshotsEqual(loaded.snapshot, snapshot);
  EXPECT_OK(VerifyCheckpoint(info.path).status());
}

TEST(CheckpointTest, InMemoryFilesAreTheBytesSaveWrites) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(3);
  CheckpointWriteOptions options;
  options.chunk_size = 7;
  options.max_data_file_bytes = 100;  // several data files
  options.time = absl::FromUnixSeconds(1700000000);
  options.epoch = 5;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 2, 9, options));
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointFile> files,
                       CheckpointToMemory(snapshot, 2, 9, options));
  std::vector<std::string> on_disk;
  for (const fs::directory_entry& entry : fs::directory_iterator(info.path)) {
    on_disk.push_back(entry.path().filename().string());
  }
  ASSERT_EQ(files.size(), on_disk.size());
  EXPECT_GT(files.size(), 4u);
  EXPECT_EQ(files.back().name, "MANIFEST");
  for (const CheckpointFile& file : files) {
    EXPECT_EQ(file.content, ReadFile(info.path + "/" + file.name)) << file.name;
  }
  options.chunk_size = 0;
  EXPECT_THAT(CheckpointToMemory(snapshot, 2, 9, options).status(),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

TEST(CheckpointTest, ReaderReadsOneParameter) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(2);
  CheckpointWriteOptions options;
  options.max_data_file_bytes = 1;  // one data file per item
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 0, 1, options));
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(info.path));
  EXPECT_EQ(reader->info().sequence, 1u);
  ASSERT_OK_AND_ASSIGN(int emb1, reader->FindParameter("emb", 1));
  EXPECT_EQ(reader->manifest().parameters(emb1).block().offset(), 5u);
  EXPECT_THAT(reader->FindParameter("emb", 2), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(reader->FindParameter("nope"), StatusIs(absl::StatusCode::kNotFound,
                                                      HasSubstr("'nope'")));
  EXPECT_THAT(reader->ReadBlock(99), StatusCodeIs(absl::StatusCode::kOutOfRange));

  // Damage another parameter's file: reading this one still works, and only
  // reads of the damaged one fail.
  ASSERT_OK_AND_ASSIGN(int w, reader->FindParameter("w"));
  const std::string w_file = reader->manifest().parameters(w).content().file();
  ASSERT_NE(w_file, reader->manifest().parameters(emb1).content().file());
  FlipByte(info.path + "/" + w_file, 3);
  ASSERT_OK_AND_ASSIGN(BlockSnapshot block, reader->ReadBlock(emb1));
  EXPECT_EQ(block.content, snapshot.blocks[6].content);
  EXPECT_EQ(block.optimizer.slots, snapshot.blocks[6].optimizer.slots);
  ASSERT_OK_AND_ASSIGN(std::string content,
                       reader->ReadData(reader->manifest().parameters(emb1).content()));
  EXPECT_EQ(content, snapshot.blocks[6].content);
  EXPECT_THAT(reader->ReadBlock(w), StatusIs(absl::StatusCode::kDataLoss,
                                             StartsWith(absl::StrCat(kChecksumValidationFailed,
                                                                     ": ", info.path, "/", w_file,
                                                                     " chunk 0"))));
  EXPECT_THAT(reader->ReadAll(), StatusCodeIs(absl::StatusCode::kDataLoss));
  EXPECT_THAT(reader->Verify(), StatusIs(absl::StatusCode::kDataLoss, HasSubstr(w_file)));
}

// ---- corruption -------------------------------------------------------------------

class CorruptionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = TestDir();
    auto info = SaveCheckpoint(TrainedSnapshot(3), dir_, 0, 1);
    ASSERT_OK(info.status());
    info_ = *info;
    manifest_ = ManifestPath(info_);
    data_ = info_.path + "/data-00000.bin";
  }

  // Load, Verify and Open (for manifest damage) all fail with DATA_LOSS
  // naming `file`.
  void ExpectDataLoss(const std::string& file, bool manifest_damage) {
    auto named = AllOf(StartsWith(absl::StrCat(kChecksumValidationFailed, ": ", file)));
    EXPECT_THAT(LoadCheckpoint(info_.path), StatusIs(absl::StatusCode::kDataLoss, named));
    EXPECT_THAT(VerifyCheckpoint(info_.path), StatusIs(absl::StatusCode::kDataLoss, named));
    if (manifest_damage) {
      EXPECT_THAT(CheckpointReader::Open(info_.path),
                  StatusIs(absl::StatusCode::kDataLoss, named));
    } else {
      EXPECT_OK(CheckpointReader::Open(info_.path).status());
    }
  }

  std::string dir_, manifest_, data_;
  CheckpointInfo info_;
};

TEST_F(CorruptionTest, IntactCheckpointLoads) {
  EXPECT_OK(LoadCheckpoint(info_.path).status());
  EXPECT_OK(VerifyCheckpoint(info_.path).status());
}

TEST_F(CorruptionTest, TruncatedManifest) {
  const uint64_t size = fs::file_size(manifest_);
  Truncate(manifest_, size - 1);
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("truncated"));
  Truncate(manifest_, 10);
  ExpectDataLoss(manifest_, true);
  Truncate(manifest_, 0);
  ExpectDataLoss(manifest_, true);
}

TEST_F(CorruptionTest, GarbageManifest) {
  WriteFile(manifest_, Values(v1::UINT64, 100, 3));
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("magic"));
  // Right magic, garbage after it.
  WriteFile(manifest_, "PSCKPT01" + Values(v1::UINT64, 100, 4));
  ExpectDataLoss(manifest_, true);
}

TEST_F(CorruptionTest, FlippedByteInManifestBody) {
  FlipByte(manifest_, kManifestHeaderSize + 20);
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("crc32c"));
}

TEST_F(CorruptionTest, FlippedByteInManifestChecksum) {
  FlipByte(manifest_, 13);
  ExpectDataLoss(manifest_, true);
}

TEST_F(CorruptionTest, MissingManifest) {
  fs::remove(manifest_);
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("missing"));
}

TEST_F(CorruptionTest, MissingDataFile) {
  fs::remove(data_);
  ExpectDataLoss(data_, false);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("missing"));
}

TEST_F(CorruptionTest, TruncatedDataFile) {
  Truncate(data_, fs::file_size(data_) - 4);
  ExpectDataLoss(data_, false);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("truncated"));
}

TEST_F(CorruptionTest, FlippedByteInDataFile) {
  // Every byte of the data file is under some checksum: try several.
  const uint64_t size = fs::file_size(data_);
  for (uint64_t at : {uint64_t{0}, size / 3, size / 2, size - 1}) {
    SCOPED_TRACE(at);
    FlipByte(data_, at);
    ExpectDataLoss(absl::StrCat(data_, " chunk 0"), false);
    FlipByte(data_, at);  // back
    EXPECT_OK(LoadCheckpoint(info_.path).status());
  }
}

TEST_F(CorruptionTest, ExtraBytesInDataFile) {
  WriteFile(data_, ReadFile(data_) + "x");
  ExpectDataLoss(data_, false);
}

TEST_F(CorruptionTest, InconsistentManifestWithGoodChecksum) {
  RewriteManifest(info_.path, [](v1::CheckpointManifest* m) {
    m->mutable_parameters(0)->mutable_content()->set_file("../../etc/passwd");
  });
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("does not list"));

  ASSERT_OK_AND_ASSIGN(info_, SaveCheckpoint(TrainedSnapshot(1), dir_, 0, 2));
  manifest_ = ManifestPath(info_);
  RewriteManifest(info_.path, [](v1::CheckpointManifest* m) {
    m->mutable_parameters(1)->mutable_content()->set_offset(1u << 30);
  });
  ExpectDataLoss(manifest_, true);

  ASSERT_OK_AND_ASSIGN(info_, SaveCheckpoint(TrainedSnapshot(1), dir_, 0, 3));
  manifest_ = ManifestPath(info_);
  RewriteManifest(info_.path, [](v1::CheckpointManifest* m) {
    m->mutable_parameters(1)->mutable_content()->add_chunk_crc32c(0);
  });
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("chunk checksums"));

  ASSERT_OK_AND_ASSIGN(info_, SaveCheckpoint(TrainedSnapshot(1), dir_, 0, 4));
  manifest_ = ManifestPath(info_);
  RewriteManifest(info_.path, [](v1::CheckpointManifest* m) {
    m->mutable_data_files(0)->set_length(m->data_files(0).length() + 8);
  });
  ExpectDataLoss(manifest_, true);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("in no item"));
}

TEST_F(CorruptionTest, UnknownFormatVersion) {
  RewriteManifest(info_.path, [](v1::CheckpointManifest* m) { m->set_format_version(2); });
  EXPECT_THAT(LoadCheckpoint(info_.path),
              StatusIs(absl::StatusCode::kFailedPrecondition, HasSubstr("format version 2")));
}

TEST_F(CorruptionTest, NotACheckpoint) {
  EXPECT_THAT(LoadCheckpoint(dir_ + "/ckpt-00000000000000000099"),
              StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(LoadCheckpoint(data_), StatusIs(absl::StatusCode::kInvalidArgument,
                                              HasSubstr("not a directory")));
}

// ---- directories of checkpoints ---------------------------------------------------

TEST(CheckpointDirTest, ListIgnoresEverythingElse) {
  const std::string dir = TestDir();
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(0), dir, 0, 10).status());
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(0), dir, 0, 9).status());
  fs::create_directories(dir + "/ckpt-12");
  fs::create_directories(dir + "/ckpt-0000000000000000000x");
  fs::create_directories(dir + "/.tmp-ckpt-00000000000000000011-abc");
  fs::create_directories(dir + "/ckpt-99999999999999999999");  // above 2^64
  WriteFile(dir + "/ckpt-00000000000000000013", "a file");
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> entries, ListCheckpoints(dir));
  ASSERT_EQ(entries.size(), 2u);
  EXPECT_EQ(entries[0].sequence, 9u);
  EXPECT_EQ(entries[0].path, dir + "/ckpt-00000000000000000009");
  EXPECT_EQ(entries[1].sequence, 10u);

  ASSERT_OK_AND_ASSIGN(entries, ListCheckpoints(dir + "/does-not-exist"));
  EXPECT_THAT(entries, IsEmpty());
}

TEST(CheckpointDirTest, LoadLatestPicksTheNewest) {
  const std::string dir = TestDir();
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1).status());
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(2), dir, 0, 2).status());
  const StoreSnapshot newest = TrainedSnapshot(3);
  ASSERT_OK(SaveCheckpoint(newest, dir, 0, 10).status());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 10u);
  EXPECT_THAT(loaded.skipped, IsEmpty());
  ExpectSnapshotsEqual(loaded.snapshot, newest);
}

TEST(CheckpointDirTest, FallsBackToThePreviousGoodCheckpoint) {
  const std::string dir = TestDir();
  const StoreSnapshot good = TrainedSnapshot(1);
  ASSERT_OK(SaveCheckpoint(good, dir, 0, 1).status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo second, SaveCheckpoint(TrainedSnapshot(2), dir, 0, 2));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo third, SaveCheckpoint(TrainedSnapshot(3), dir, 0, 3));
  FlipByte(third.path + "/data-00000.bin", 100);
  Truncate(ManifestPath(second), 20);

  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 1u);
  ExpectSnapshotsEqual(loaded.snapshot, good);
  ASSERT_EQ(loaded.skipped.size(), 2u);
  EXPECT_EQ(loaded.skipped[0].path, third.path);
  EXPECT_EQ(loaded.skipped[0].sequence, 3u);
  EXPECT_THAT(loaded.skipped[0].status,
              StatusIs(absl::StatusCode::kDataLoss,
                       StartsWith(absl::StrCat(kChecksumValidationFailed, ": ", third.path,
                                               "/data-00000.bin chunk "))));
  EXPECT_EQ(loaded.skipped[1].path, second.path);
  EXPECT_THAT(loaded.skipped[1].status,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr(ManifestPath(second))));
}

TEST(CheckpointDirTest, NoGoodCheckpoint) {
  const std::string dir = TestDir();
  EXPECT_THAT(LoadLatestCheckpoint(dir), StatusCodeIs(absl::StatusCode::kNotFound));
  EXPECT_THAT(LoadLatestCheckpoint(dir + "/missing"), StatusCodeIs(absl::StatusCode::kNotFound));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo a, SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1));
  ASSERT_OK_AND_ASSIGN(CheckpointInfo b, SaveCheckpoint(TrainedSnapshot(1), dir, 0, 2));
  fs::remove(ManifestPath(a));
  FlipByte(ManifestPath(b), 30);
  EXPECT_THAT(LoadLatestCheckpoint(dir),
              StatusIs(absl::StatusCode::kDataLoss,
                       AllOf(HasSubstr("no good checkpoint"), HasSubstr(a.path),
                             HasSubstr(b.path))));
}

TEST(CheckpointDirTest, SequenceMustMatchTheDirectoryName) {
  const std::string dir = TestDir();
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1).status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo b, SaveCheckpoint(TrainedSnapshot(2), dir, 0, 2));
  fs::rename(b.path, dir + "/ckpt-00000000000000000005");
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 1u);
  ASSERT_EQ(loaded.skipped.size(), 1u);
  EXPECT_THAT(loaded.skipped[0].status,
              StatusIs(absl::StatusCode::kDataLoss, HasSubstr("holds sequence 2")));
}

// A crash after writing the files but before the rename leaves a .tmp-ckpt-*
// directory: readers ignore it and the next save removes it.
TEST(CheckpointDirTest, CrashBeforeRenameLeavesThePreviousCheckpoint) {
  const std::string dir = TestDir();
  const StoreSnapshot first = TrainedSnapshot(1);
  ASSERT_OK(SaveCheckpoint(first, dir, 0, 1).status());

  // A complete write of sequence 2, then the "crash": moved to a temporary
  // name, part of it missing. A second one with only a partial data file.
  const std::string scratch = dir + "-scratch";
  fs::remove_all(scratch);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo partial, SaveCheckpoint(TrainedSnapshot(2), scratch, 0, 2));
  const std::string tmp1 = dir + "/.tmp-ckpt-00000000000000000002-0123456789abcdef";
  fs::rename(partial.path, tmp1);
  Truncate(tmp1 + "/data-00000.bin", 10);
  const std::string tmp2 = dir + "/.tmp-ckpt-00000000000000000003-fedcba9876543210";
  fs::create_directories(tmp2);
  WriteFile(tmp2 + "/data-00000.bin", "partial");

  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> entries, ListCheckpoints(dir));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].sequence, 1u);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 1u);
  EXPECT_THAT(loaded.skipped, IsEmpty());
  ExpectSnapshotsEqual(loaded.snapshot, first);

  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(3), dir, 0, 2).status());
  EXPECT_THAT(Names(dir),
              ElementsAre("ckpt-00000000000000000001", "ckpt-00000000000000000002"));
  ASSERT_OK_AND_ASSIGN(loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 2u);
}

TEST(CheckpointDirTest, PruneKeepsTheNewest) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(1);
  for (uint64_t seq : {3, 1, 5, 2, 4}) ASSERT_OK(SaveCheckpoint(snapshot, dir, 0, seq).status());
  EXPECT_THAT(PruneCheckpoints(dir, 0), StatusCodeIs(absl::StatusCode::kInvalidArgument));

  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed, PruneCheckpoints(dir, 2));
  EXPECT_THAT(removed, ElementsAre(dir + "/ckpt-00000000000000000001",
                                   dir + "/ckpt-00000000000000000002",
                                   dir + "/ckpt-00000000000000000003"));
  EXPECT_THAT(Names(dir),
              ElementsAre("ckpt-00000000000000000004", "ckpt-00000000000000000005"));
  ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(dir, 2));
  EXPECT_THAT(removed, IsEmpty());
  ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(dir, 5));
  EXPECT_THAT(removed, IsEmpty());
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 5u);
  ASSERT_OK_AND_ASSIGN(removed, PruneCheckpoints(dir, 1));
  EXPECT_THAT(Names(dir), ElementsAre("ckpt-00000000000000000005"));
  EXPECT_THAT(PruneCheckpoints(dir + "/missing", 1), IsOk());
}

TEST(CheckpointDirTest, PruneNeverDeletesASparedCheckpoint) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(1);
  for (uint64_t seq : {1, 2, 3, 4}) ASSERT_OK(SaveCheckpoint(snapshot, dir, 0, seq).status());
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed,
                       PruneCheckpoints(dir, 1, {dir + "/ckpt-00000000000000000002"}));
  EXPECT_THAT(removed, ElementsAre(dir + "/ckpt-00000000000000000001",
                                   dir + "/ckpt-00000000000000000003"));
  EXPECT_THAT(Names(dir),
              ElementsAre("ckpt-00000000000000000002", "ckpt-00000000000000000004"));
}

// Manifests record the placement; one written without (before placements
// were recorded) reads as MODULO over its server count.
TEST(CheckpointManifestTest, RecordsThePlacement) {
  const std::string dir = TestDir();
  const StoreSnapshot snapshot = TrainedSnapshot(1);
  CheckpointWriteOptions options;
  options.num_servers = 3;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(snapshot, dir, 0, 1, options));
  EXPECT_EQ(info.placement.kind(), v1::Placement::JUMP);
  EXPECT_EQ(info.placement.num_servers(), 3u);
  options.placement.set_kind(v1::Placement::MODULO);
  options.placement.set_version(7);
  ASSERT_OK(SaveCheckpoint(snapshot, dir, 0, 2, options).status());
  ASSERT_OK_AND_ASSIGN(auto jump, CheckpointReader::Open(dir + "/ckpt-00000000000000000001"));
  EXPECT_EQ(jump->info().placement.kind(), v1::Placement::JUMP);
  EXPECT_EQ(jump->manifest().placement().num_servers(), 3u);
  ASSERT_OK_AND_ASSIGN(auto modulo, CheckpointReader::Open(dir + "/ckpt-00000000000000000002"));
  EXPECT_EQ(modulo->info().placement.kind(), v1::Placement::MODULO);
  EXPECT_EQ(modulo->info().placement.version(), 7u);
  EXPECT_EQ(modulo->info().placement.num_servers(), 3u);
}

// A stale server (an older epoch) that wrote later sequence numbers than the
// current holder must not win: loading and pruning order by (epoch,
// sequence), and checkpoints without an epoch still load.
TEST(CheckpointDirTest, LoadingAndPruningOrderByEpochThenSequence) {
  const std::string dir = TestDir();
  const StoreSnapshot old_server = TrainedSnapshot(1);
  const StoreSnapshot holder = TrainedSnapshot(2);
  const StoreSnapshot stale = TrainedSnapshot(3);
  ASSERT_OK(SaveCheckpoint(old_server, dir, 0, 1).status());  // no epoch
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.epoch, 0u);
  EXPECT_EQ(loaded.info.sequence, 1u);

  CheckpointWriteOptions epoch2;
  epoch2.epoch = 2;
  CheckpointWriteOptions epoch1;
  epoch1.epoch = 1;
  ASSERT_OK(SaveCheckpoint(holder, dir, 0, 3, epoch2).status());
  ASSERT_OK(SaveCheckpoint(stale, dir, 0, 7, epoch1).status());  // later, but stale
  ASSERT_OK(SaveCheckpoint(old_server, dir, 0, 9).status());     // later, no epoch

  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> order, ListCheckpointsInLoadOrder(dir));
  ASSERT_EQ(order.size(), 4u);
  EXPECT_EQ(order[0].sequence, 1u);
  EXPECT_EQ(order[1].sequence, 9u);
  EXPECT_EQ(order[2].sequence, 7u);
  EXPECT_EQ(order[2].epoch, 1u);
  EXPECT_EQ(order[3].sequence, 3u);
  EXPECT_EQ(order[3].epoch, 2u);

  ASSERT_OK_AND_ASSIGN(loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 3u);
  EXPECT_EQ(loaded.info.epoch, 2u);
  ExpectSnapshotsEqual(loaded.snapshot, holder);

  // Pruning keeps the holder's, not the stale server's later ones.
  ASSERT_OK_AND_ASSIGN(std::vector<std::string> removed, PruneCheckpoints(dir, 1));
  EXPECT_EQ(removed.size(), 3u);
  EXPECT_THAT(Names(dir), ElementsAre("ckpt-00000000000000000003"));
}

// ---- files that are not regular files -----------------------------------------------

// Runs `read` on another thread. Reading a FIFO used to block in open(2)
// until a writer came; if `read` has not returned within a generous bound,
// the test fails and opening the FIFO's write end releases the reader, so a
// regression fails here instead of hanging the suite.
template <typename Read>
auto WithFifoReleased(const std::string& fifo, Read read) -> decltype(read()) {
  auto result = std::async(std::launch::async, read);
  if (result.wait_for(std::chrono::seconds(20)) != std::future_status::ready) {
    ADD_FAILURE() << "reading blocked on the FIFO " << fifo;
    for (int i = 0;
         i < 1000 && result.wait_for(std::chrono::milliseconds(10)) != std::future_status::ready;
         ++i) {
      const int fd = ::open(fifo.c_str(), O_WRONLY | O_NONBLOCK);
      if (fd >= 0) ::close(fd);
    }
  }
  return result.get();
}

void ReplaceWithFifo(const std::string& path) {
  ASSERT_TRUE(fs::remove(path)) << path;
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0) << path << ": " << std::strerror(errno);
}

TEST_F(CorruptionTest, FifoInPlaceOfManifestIsRefusedWithoutBlocking) {
  ASSERT_NO_FATAL_FAILURE(ReplaceWithFifo(manifest_));
  auto refused = StatusIs(absl::StatusCode::kDataLoss,
                          AllOf(HasSubstr(manifest_), HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT(WithFifoReleased(manifest_, [&] { return LoadCheckpoint(info_.path).status(); }),
              refused);
  EXPECT_THAT(WithFifoReleased(manifest_, [&] { return VerifyCheckpoint(info_.path).status(); }),
              refused);
  EXPECT_THAT(
      WithFifoReleased(manifest_, [&] { return CheckpointReader::Open(info_.path).status(); }),
      refused);
}

TEST_F(CorruptionTest, FifoInPlaceOfDataFileIsRefusedWithoutBlocking) {
  ASSERT_NO_FATAL_FAILURE(ReplaceWithFifo(data_));
  auto refused = StatusIs(absl::StatusCode::kDataLoss,
                          AllOf(HasSubstr(data_), HasSubstr("is a FIFO, not a regular file")));
  EXPECT_THAT(WithFifoReleased(data_, [&] { return LoadCheckpoint(info_.path).status(); }),
              refused);
  EXPECT_THAT(WithFifoReleased(data_, [&] { return VerifyCheckpoint(info_.path).status(); }),
              refused);
}

TEST_F(CorruptionTest, SymbolicLinksAndDirectoriesAreNotCheckpointFiles) {
  // A link to a byte-identical copy: refused all the same (the writer never
  // makes links, and one could point anywhere).
  const std::string copy = dir_ + "/copy.bin";
  fs::copy_file(data_, copy);
  fs::remove(data_);
  fs::create_symlink(copy, data_);
  ExpectDataLoss(data_, false);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("symbolic link"));
  fs::remove(data_);
  fs::create_directory(data_);
  ExpectDataLoss(data_, false);
  EXPECT_THAT(LoadCheckpoint(info_.path).status().message(), HasSubstr("is a directory"));
}

TEST(CheckpointDirTest, LoadLatestSkipsACheckpointWithAFifo) {
  const std::string dir = TestDir();
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1).status());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo newest, SaveCheckpoint(TrainedSnapshot(2), dir, 0, 2));
  const std::string fifo = newest.path + "/data-00000.bin";
  ASSERT_NO_FATAL_FAILURE(ReplaceWithFifo(fifo));
  absl::StatusOr<LoadedCheckpoint> loaded =
      WithFifoReleased(fifo, [&] { return LoadLatestCheckpoint(dir); });
  ASSERT_OK(loaded.status());
  EXPECT_EQ(loaded->info.sequence, 1u);
  ASSERT_EQ(loaded->skipped.size(), 1u);
  EXPECT_THAT(loaded->skipped[0].status.message(), HasSubstr("FIFO"));
}

TEST(CheckpointDirTest, ListSkipsLinksAndRefusesAFile) {
  const std::string dir = TestDir();
  const std::string elsewhere = TestDir() + "-elsewhere";
  fs::remove_all(elsewhere);
  ASSERT_OK_AND_ASSIGN(CheckpointInfo foreign, SaveCheckpoint(TrainedSnapshot(1), elsewhere, 0, 7));
  ASSERT_OK(SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1).status());
  fs::create_directory_symlink(foreign.path, dir + "/ckpt-00000000000000000007");
  ASSERT_OK_AND_ASSIGN(std::vector<CheckpointEntry> entries, ListCheckpoints(dir));
  ASSERT_EQ(entries.size(), 1u);
  EXPECT_EQ(entries[0].sequence, 1u);
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
  EXPECT_EQ(loaded.info.sequence, 1u);

  WriteFile(dir + "/a-file", "x");
  EXPECT_THAT(ListCheckpoints(dir + "/a-file"),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(dir + "/a-file"), HasSubstr("not a directory"))));
  // A directory named by the caller may be a link.
  fs::create_directory_symlink(dir, dir + "-link");
  ASSERT_OK_AND_ASSIGN(entries, ListCheckpoints(dir + "-link"));
  EXPECT_EQ(entries.size(), 1u);
  fs::remove(dir + "-link");
}

// ---- identity and modes -------------------------------------------------------------

TEST(CheckpointTest, ManifestRecordsClusterAndServerCount) {
  const std::string dir = TestDir();
  CheckpointWriteOptions options;
  options.cluster = "job-7";
  options.num_servers = 3;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo saved,
                       SaveCheckpoint(TrainedSnapshot(1), dir, 2, 1, options));
  EXPECT_EQ(saved.cluster, "job-7");
  EXPECT_EQ(saved.num_servers, 3u);
  ASSERT_OK_AND_ASSIGN(auto reader, CheckpointReader::Open(saved.path));
  EXPECT_EQ(reader->manifest().cluster(), "job-7");
  EXPECT_EQ(reader->manifest().num_servers(), 3u);
  EXPECT_EQ(reader->info().cluster, "job-7");
  EXPECT_EQ(reader->info().num_servers, 3u);
  EXPECT_EQ(reader->info().shard, 2u);
}

uint32_t ModeOf(const std::string& path) {
  struct stat st;
  EXPECT_EQ(::lstat(path.c_str(), &st), 0) << path;
  return st.st_mode & 07777;
}

// Sets the umask for one scope (tests in this binary run one at a time).
class ScopedUmask {
 public:
  explicit ScopedUmask(mode_t mask) : old_(::umask(mask)) {}
  ~ScopedUmask() { ::umask(old_); }

 private:
  mode_t old_;
};

TEST(CheckpointModeTest, FilesAreOwnerOnlyByDefaultWhateverTheUmask) {
  ScopedUmask umask(0);
  const std::string root = TestDir();
  const std::string dir = root + "/new/shard-0";
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1));
  EXPECT_EQ(ModeOf(root + "/new"), 0700u);
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_EQ(ModeOf(info.path), 0700u);
  for (const std::string& name : Names(info.path)) {
    EXPECT_EQ(ModeOf(info.path + "/" + name), 0600u) << name;
  }
}

TEST(CheckpointModeTest, ModeOptionIsAppliedExactly) {
  ScopedUmask umask(077);  // would take group read away
  const std::string dir = TestDir() + "/shard-0";
  CheckpointWriteOptions options;
  options.file_mode = 0640;
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(TrainedSnapshot(1), dir, 0, 1, options));
  EXPECT_EQ(ModeOf(dir), 0750u);
  EXPECT_EQ(ModeOf(info.path), 0750u);
  for (const std::string& name : Names(info.path)) {
    EXPECT_EQ(ModeOf(info.path + "/" + name), 0640u) << name;
  }
  options.file_mode = 0755;
  EXPECT_THAT(SaveCheckpoint(TrainedSnapshot(1), dir, 0, 2, options),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("0755")));
  EXPECT_THAT(Names(dir), ElementsAre("ckpt-00000000000000000001"));
}

TEST(CheckpointModeTest, ParseAndDirMode) {
  for (const auto& [text, mode] : std::vector<std::pair<std::string, uint32_t>>{
           {"0600", 0600}, {"640", 0640}, {"0644", 0644}, {"0666", 0666}}) {
    absl::StatusOr<uint32_t> parsed = ParseCheckpointFileMode(text);
    ASSERT_OK(parsed.status()) << text;
    EXPECT_EQ(*parsed, mode) << text;
  }
  for (const char* bad :
       {"", "600x", "0800", "0400", "0700", "04600", "0200", "-600", "0000000600"}) {
    EXPECT_THAT(ParseCheckpointFileMode(bad), StatusCodeIs(absl::StatusCode::kInvalidArgument))
        << bad;
  }
  EXPECT_EQ(CheckpointDirMode(0600), 0700u);
  EXPECT_EQ(CheckpointDirMode(0640), 0750u);
  EXPECT_EQ(CheckpointDirMode(0644), 0755u);
  EXPECT_EQ(CheckpointDirMode(0660), 0770u);
}

// ---- writable directories -----------------------------------------------------------

TEST(CheckWritableDirectoryTest, CreatesTheDirectoryAndLeavesNothing) {
  ScopedUmask umask(0);
  const std::string dir = TestDir() + "/a/b";
  EXPECT_OK(CheckWritableDirectory(dir));
  EXPECT_EQ(ModeOf(dir), 0700u);
  EXPECT_THAT(Names(dir), IsEmpty());
  EXPECT_OK(CheckWritableDirectory(dir));  // an existing one
}

TEST(CheckWritableDirectoryTest, FailsUnderARegularFileEvenForRoot) {
  const std::string file = TestDir() + "/file";
  WriteFile(file, "x");
  EXPECT_THAT(
      CheckWritableDirectory(file + "/sub"),
      StatusIs(absl::StatusCode::kFailedPrecondition,
               AllOf(HasSubstr("checkpoint directory " + file + "/sub"), HasSubstr("not usable"))));
  EXPECT_THAT(CheckWritableDirectory(file),
              StatusIs(absl::StatusCode::kFailedPrecondition,
                       AllOf(HasSubstr(file), HasSubstr("not a directory"))));
  EXPECT_THAT(CheckWritableDirectory(""), StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

}  // namespace
}  // namespace pserver
