// The ParameterStore's storage seam, without a GPU: a test-only factory makes
// "device-like" storage that keeps each block's values encoded (every byte
// XOR 0x5a) in its own buffer and counts every call, so a store that touched
// values anywhere but through its BlockStorage would serve garbage. The same
// model trained through it and through plain host storage must agree to the
// bit, and checkpoints must move between the two bit for bit.
#include "cc/core/block_storage.h"

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using ::testing::AllOf;
using ::testing::HasSubstr;

constexpr unsigned char kMask = 0x5a;

struct Counts {
  std::atomic<int> created{0}, applied{0}, read{0}, exported{0}, imported{0}, destroyed{0};
  // Failure injection: the next call of that kind fails (UNAVAILABLE).
  std::atomic<bool> fail_apply{false}, fail_read{false}, fail_export{false};
};

void Encode(std::string* bytes) {
  for (char& c : *bytes) c = static_cast<char>(static_cast<unsigned char>(c) ^ kMask);
}

// Keeps the values XOR-masked in its own buffer, decoding into scratch for
// the host Optimizer and for reads, as a device copies through staging.
class MaskedStorage final : public BlockStorage {
 public:
  MaskedStorage(std::string values, std::unique_ptr<Optimizer> optimizer, Counts* counts)
      : masked_(std::move(values)), optimizer_(std::move(optimizer)), counts_(counts) {
    Encode(&masked_);
    counts_->created++;
  }
  ~MaskedStorage() override { counts_->destroyed++; }

  bool can_apply() const override { return optimizer_->can_apply(); }
  absl::Status CheckCanApply(const std::string& what) const override {
    return optimizer_->CheckCanApply(what);
  }
  absl::Status Apply(absl::string_view grad, ElementType grad_type,
                     std::optional<double> global_norm) override {
    counts_->applied++;
    if (counts_->fail_apply.exchange(false)) return absl::UnavailableError("injected apply fault");
    EXPECT_EQ(grad.size(), masked_.size());
    EXPECT_NE(grad_type, v1::ELEMENT_TYPE_UNSPECIFIED);
    std::string plain = masked_;
    Encode(&plain);
    optimizer_->Apply(plain.data(), grad.data(), global_norm);
    Encode(&plain);
    masked_ = std::move(plain);
    return absl::OkStatus();
  }
  absl::Status Read(absl::FunctionRef<void(absl::string_view)> read) const override {
    counts_->read++;
    if (counts_->fail_read.exchange(false)) return absl::UnavailableError("injected read fault");
    absl::MutexLock lock(&staging_mu_);  // reads may run concurrently
    staging_ = masked_;
    Encode(&staging_);
    read(staging_);
    staging_.assign(staging_.size(), '\xee');  // what a reader kept past the call is garbage
    return absl::OkStatus();
  }
  absl::StatusOr<OptimizerState> ExportState() const override {
    counts_->exported++;
    if (counts_->fail_export.exchange(false)) return absl::UnavailableError("injected copy fault");
    return optimizer_->ExportState();
  }
  absl::Status ImportState(const OptimizerState& state) override {
    counts_->imported++;
    return optimizer_->ImportState(state);
  }
  size_t value_bytes() const override { return masked_.size(); }
  size_t state_bytes() const override { return optimizer_->state_bytes(); }
  std::string location() const override { return "masked:0"; }

 private:
  std::string masked_;
  std::unique_ptr<Optimizer> optimizer_;
  Counts* counts_;
  mutable absl::Mutex staging_mu_;
  mutable std::string staging_;
};

StoreOptions MaskedOptions(Counts* counts) {
  StoreOptions options;
  options.storage_factory =
      [counts](const BlockStorageSpec& spec,
               std::string values) -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
    EXPECT_EQ(values.size(), static_cast<size_t>(spec.num_elements) * ElementSize(spec.type));
    EXPECT_GE(spec.ref.count(), 1u);
    absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
        Optimizer::Create(spec.config, spec.type, static_cast<size_t>(spec.num_elements));
    if (!optimizer.ok()) return optimizer.status();
    return std::unique_ptr<BlockStorage>(
        new MaskedStorage(std::move(values), *std::move(optimizer), counts));
  };
  return options;
}

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

v1::Parameter Param(const std::string& name, ElementType type, const Shape& shape,
                    std::string content, uint32_t index = 0, uint32_t count = 1,
                    uint64_t offset = 0) {
  v1::Parameter p;
  p.set_name(name);
  p.set_element_type(type);
  p.mutable_shape()->Assign(shape.begin(), shape.end());
  p.mutable_block()->set_index(index);
  p.mutable_block()->set_count(count);
  p.mutable_block()->set_offset(offset);
  p.set_content(std::move(content));
  return p;
}

v1::ParameterConfig Adam() {
  v1::ParameterConfig c;
  c.mutable_optimizer()->mutable_adam()->set_weight_decay(0.01);
  c.mutable_learning_rate()->set_learning_rate(0.01);
  return c;
}
v1::ParameterConfig Momentum() {
  v1::ParameterConfig c;
  c.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  c.mutable_clipping()->set_clip_norm(2.0);
  return c;
}
v1::ParameterConfig Add() {
  v1::ParameterConfig c;
  c.mutable_optimizer()->mutable_add();
  return c;
}

// Block sizes: "w" float32 [7] in blocks of 4 + 3 (adam), "b" float64 [3]
// (momentum with clip-by-norm), "n" int64 [2] (add), "frozen" int32 [2]
// (no optimizer: stored, never updated).
void InitModel(ParameterStore* store) {
  std::vector<float> w = {0.5f, -1, 2, 0.25f, 3, -0.125f, 1};
  ASSERT_OK(store->Init(
      Param("w", v1::FLOAT32, {7}, Bytes(std::vector<float>(w.begin(), w.begin() + 4)), 0, 2, 0),
      Adam()));
  ASSERT_OK(store->Init(
      Param("w", v1::FLOAT32, {7}, Bytes(std::vector<float>(w.begin() + 4, w.end())), 1, 2, 4),
      Adam()));
  ASSERT_OK(
      store->Init(Param("b", v1::FLOAT64, {3}, Bytes(std::vector<double>{1, 2, 3})), Momentum()));
  ASSERT_OK(store->Init(Param("n", v1::INT64, {2}, Bytes(std::vector<int64_t>{10, 20})), Add()));
  ASSERT_OK(store->Init(Param("frozen", v1::INT32, {2}, Bytes(std::vector<int32_t>{7, 8})),
                        v1::ParameterConfig()));
  store->FinishInit();
}

std::vector<v1::Gradient> Gradients(int step) {
  auto grad = [](const std::string& name, ElementType type, std::string content, uint32_t index = 0,
                 uint32_t count = 1, uint64_t offset = 0) {
    v1::Gradient g;
    g.set_name(name);
    g.set_element_type(type);
    g.mutable_block()->set_index(index);
    g.mutable_block()->set_count(count);
    g.mutable_block()->set_offset(offset);
    g.set_content(std::move(content));
    return g;
  };
  const float s = 0.1f * static_cast<float>(step % 7 + 1);
  std::vector<v1::Gradient> grads;
  grads.push_back(grad("w", v1::FLOAT32, Bytes(std::vector<float>{s, -s, 2 * s, 0}), 0, 2, 0));
  grads.push_back(grad("w", v1::FLOAT32, Bytes(std::vector<float>{-s, s / 3, 1}), 1, 2, 4));
  grads.push_back(grad("b", v1::FLOAT64, Bytes(std::vector<double>{s * 3.0, 1.5, -s * 1.0})));
  if (step % 3 == 0) grads.back().set_global_norm(4.0);
  grads.push_back(grad("n", v1::INT64, Bytes(std::vector<int64_t>{step, -1})));
  return grads;
}

void Train(ParameterStore* store, int from, int to) {
  for (int step = from; step < to; ++step) {
    std::vector<v1::Gradient> grads = Gradients(step);
    std::vector<const v1::Gradient*> ptrs;
    for (const v1::Gradient& g : grads) ptrs.push_back(&g);
    ASSERT_OK(store->ApplyGradients(ptrs));
  }
}

// Every block's bytes through Get, in a fixed order.
std::vector<std::string> Contents(ParameterStore* store) {
  std::vector<std::string> out;
  auto get = [&](const std::string& name, uint32_t index, uint32_t count) {
    v1::ParamRef ref;
    ref.set_name(name);
    ref.mutable_block()->set_index(index);
    ref.mutable_block()->set_count(count);
    v1::Parameter p;
    EXPECT_OK(store->Get(ref, &p));
    out.push_back(p.content());
  };
  get("w", 0, 2);
  get("w", 1, 2);
  get("b", 0, 1);
  get("n", 0, 1);
  get("frozen", 0, 1);
  return out;
}

void ExpectSnapshotsEqual(const StoreSnapshot& a, const StoreSnapshot& b) {
  EXPECT_EQ(a.initialized, b.initialized);
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

std::string TestDir(const std::string& name) {
  namespace fs = std::filesystem;
  const char* root = std::getenv("TEST_TMPDIR");
  fs::path dir = fs::path(root != nullptr ? root : "/tmp") / ("block_storage_test_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir.string();
}

constexpr int kBlocks = 5;

TEST(BlockStorageTest, HostStorageIsTodaysPath) {
  BlockStorageSpec spec;
  spec.name = "w";
  spec.type = v1::FLOAT32;
  spec.shape = {2};
  spec.ref.set_count(1);
  spec.num_elements = 2;
  spec.config.mutable_optimizer()->mutable_sgd();
  spec.config.mutable_learning_rate()->set_learning_rate(0.5);
  ASSERT_OK_AND_ASSIGN(std::unique_ptr<BlockStorage> storage,
                       MakeHostBlockStorage(spec, Bytes(std::vector<float>{1, 2})));
  EXPECT_EQ(storage->location(), "host");
  EXPECT_EQ(storage->value_bytes(), 8u);
  EXPECT_TRUE(storage->can_apply());
  ASSERT_OK(storage->Apply(Bytes(std::vector<float>{2, -4}), v1::FLOAT32, std::nullopt));
  std::string got;
  ASSERT_OK(storage->Read([&](absl::string_view b) { got = std::string(b); }));
  EXPECT_EQ(got, Bytes(std::vector<float>{0, 4}));
  ASSERT_OK_AND_ASSIGN(OptimizerState state, storage->ExportState());
  EXPECT_EQ(state.steps, 1u);

  spec.config.mutable_optimizer()->mutable_sgd()->set_momentum(-1);
  EXPECT_THAT(MakeHostBlockStorage(spec, Bytes(std::vector<float>{1, 2})).status(),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("momentum")));
}

TEST(BlockStorageTest, EveryOperationGoesThroughTheFactorysStorage) {
  Counts counts;
  ParameterStore masked(MaskedOptions(&counts));
  ParameterStore host;
  ASSERT_NO_FATAL_FAILURE(InitModel(&masked));
  ASSERT_NO_FATAL_FAILURE(InitModel(&host));
  EXPECT_EQ(counts.created, kBlocks);
  EXPECT_EQ(masked.GetStats().device_blocks, static_cast<uint64_t>(kBlocks));
  EXPECT_EQ(host.GetStats().device_blocks, 0u);

  ASSERT_NO_FATAL_FAILURE(Train(&masked, 0, 20));
  ASSERT_NO_FATAL_FAILURE(Train(&host, 0, 20));
  EXPECT_EQ(counts.applied, 20 * 4);  // four gradients a step; "frozen" gets none

  EXPECT_EQ(Contents(&masked), Contents(&host));  // bit for bit
  EXPECT_EQ(counts.read, kBlocks);

  const ParameterStore::Stats ms = masked.GetStats(), hs = host.GetStats();
  EXPECT_EQ(ms.parameter_bytes, hs.parameter_bytes);
  EXPECT_EQ(ms.optimizer_state_bytes, hs.optimizer_state_bytes);
  EXPECT_EQ(ms.gradients_applied, hs.gradients_applied);

  // Read (the zero-copy path the service uses) also goes through it.
  v1::ParamRef ref;
  ref.set_name("b");
  v1::Parameter header;
  std::string seen;
  ASSERT_OK(masked.Read(ref, &header, [&](absl::string_view b) { seen = std::string(b); }));
  EXPECT_EQ(seen, Contents(&host)[2]);
  EXPECT_EQ(header.element_type(), v1::FLOAT64);
  EXPECT_TRUE(header.content().empty());

  // Snapshot: one read and one export per block.
  const int reads = counts.read;
  ASSERT_OK_AND_ASSIGN(StoreSnapshot snapshot, masked.TakeSnapshot());
  EXPECT_EQ(counts.read, reads + kBlocks);
  EXPECT_EQ(counts.exported, kBlocks);
  ExpectSnapshotsEqual(snapshot, host.Snapshot());

  // Restore builds every block through the factory and imports its state.
  ParameterStore restored(MaskedOptions(&counts));
  ASSERT_OK(restored.Restore(snapshot));
  EXPECT_EQ(counts.created, 2 * kBlocks);
  EXPECT_EQ(counts.imported, kBlocks);
  EXPECT_EQ(restored.GetStats().device_blocks, static_cast<uint64_t>(kBlocks));
  ASSERT_NO_FATAL_FAILURE(Train(&restored, 20, 35));
  ASSERT_NO_FATAL_FAILURE(Train(&host, 20, 35));
  EXPECT_EQ(Contents(&restored), Contents(&host));
  ExpectSnapshotsEqual(restored.Snapshot(), host.Snapshot());
}

TEST(BlockStorageTest, CheckpointsMoveBetweenHostAndFactoryStorageBitForBit) {
  Counts counts;
  ParameterStore masked(MaskedOptions(&counts));
  ParameterStore host;
  ASSERT_NO_FATAL_FAILURE(InitModel(&masked));
  ASSERT_NO_FATAL_FAILURE(InitModel(&host));
  ASSERT_NO_FATAL_FAILURE(Train(&masked, 0, 12));
  ASSERT_NO_FATAL_FAILURE(Train(&host, 0, 12));

  // Factory storage -> files -> host storage.
  const std::string dir = TestDir("masked_to_host");
  ASSERT_OK_AND_ASSIGN(StoreSnapshot from_masked, masked.TakeSnapshot());
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info, SaveCheckpoint(from_masked, dir, 0, 1));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  ParameterStore host_restored;
  ASSERT_OK(host_restored.Restore(std::move(loaded.snapshot)));
  ExpectSnapshotsEqual(host_restored.Snapshot(), host.Snapshot());

  // Host storage -> files -> factory storage.
  const std::string dir2 = TestDir("host_to_masked");
  ASSERT_OK_AND_ASSIGN(CheckpointInfo info2, SaveCheckpoint(host.Snapshot(), dir2, 0, 1));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded2, LoadCheckpoint(info2.path));
  ParameterStore masked_restored(MaskedOptions(&counts));
  ASSERT_OK(masked_restored.Restore(std::move(loaded2.snapshot)));
  ExpectSnapshotsEqual(masked_restored.Snapshot(), from_masked);

  // Both continue identically to the store that never stopped.
  ASSERT_NO_FATAL_FAILURE(Train(&host, 12, 30));
  ASSERT_NO_FATAL_FAILURE(Train(&host_restored, 12, 30));
  ASSERT_NO_FATAL_FAILURE(Train(&masked_restored, 12, 30));
  EXPECT_EQ(Contents(&host_restored), Contents(&host));
  EXPECT_EQ(Contents(&masked_restored), Contents(&host));
}

TEST(BlockStorageTest, FactoryErrorsNameTheBlock) {
  StoreOptions failing;
  failing.storage_factory = [](const BlockStorageSpec& spec,
                               std::string) -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
    return absl::ResourceExhaustedError(absl::StrCat("no room for ", spec.num_elements));
  };
  ParameterStore store(failing);
  EXPECT_THAT(
      store.Init(Param("w", v1::FLOAT32, {4}, std::string(8, '\0'), 1, 2, 2), Adam()),
      StatusIs(absl::StatusCode::kResourceExhausted, "parameter 'w' block 1 of 2: no room for 2"));
  EXPECT_EQ(store.GetStats().blocks, 0u);
  EXPECT_EQ(store.GetStats().requests_rejected, 1u);

  StoreOptions null_factory;
  null_factory.storage_factory = [](const BlockStorageSpec&,
                                    std::string) -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
    return nullptr;
  };
  ParameterStore store2(null_factory);
  EXPECT_THAT(store2.Init(Param("w", v1::FLOAT32, {1}, std::string(4, '\0')), Adam()),
              StatusIs(absl::StatusCode::kInternal, HasSubstr("parameter 'w'")));

  // A bad config is still INVALID_ARGUMENT naming the block and the field.
  Counts counts;
  ParameterStore store3(MaskedOptions(&counts));
  v1::ParameterConfig bad;
  bad.mutable_optimizer()->mutable_sgd()->set_momentum(-1);
  EXPECT_THAT(store3.Init(Param("w", v1::FLOAT32, {1}, std::string(4, '\0')), bad),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       AllOf(HasSubstr("parameter 'w': "), HasSubstr("momentum"))));
  // Layout errors are the store's: refused before the factory is asked.
  EXPECT_THAT(store3.Init(Param("w", v1::FLOAT32, {2}, std::string(4, '\0')), Adam()),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
  EXPECT_EQ(counts.created, 0);
}

TEST(BlockStorageTest, StorageErrorsReachTheCaller) {
  Counts counts;
  ParameterStore store(MaskedOptions(&counts));
  ASSERT_NO_FATAL_FAILURE(InitModel(&store));

  std::vector<v1::Gradient> grads = Gradients(0);
  std::vector<const v1::Gradient*> ptrs;
  for (const v1::Gradient& g : grads) ptrs.push_back(&g);
  counts.fail_apply = true;
  EXPECT_THAT(store.ApplyGradients(ptrs),
              StatusIs(absl::StatusCode::kUnavailable,
                       "gradient for parameter 'w' block 0 of 2: injected apply fault"));
  EXPECT_EQ(store.GetStats().gradients_applied, 0u);

  counts.fail_read = true;
  v1::ParamRef ref;
  ref.set_name("n");
  v1::Parameter out;
  EXPECT_THAT(store.Get(ref, &out),
              StatusIs(absl::StatusCode::kUnavailable, "parameter 'n': injected read fault"));

  counts.fail_export = true;
  EXPECT_THAT(store.TakeSnapshot().status(),
              StatusIs(absl::StatusCode::kUnavailable,
                       HasSubstr("snapshot of parameter 'b': injected copy fault")));
  ASSERT_OK(store.TakeSnapshot().status());  // the fault was one-off

  // Integer blocks without `add` are still refused before any storage runs.
  v1::Gradient frozen;
  frozen.set_name("frozen");
  frozen.set_element_type(v1::INT32);
  frozen.set_content(Bytes(std::vector<int32_t>{1, 1}));
  const int applied = counts.applied;
  EXPECT_THAT(store.ApplyGradients({&frozen}), StatusCodeIs(absl::StatusCode::kFailedPrecondition));
  EXPECT_EQ(counts.applied, applied);
}

// The non-finite check runs on the host bytes before any storage's Apply, so
// it serves every storage (a GPU's included) in one place.
TEST(BlockStorageTest, NonFiniteGradientsNeverReachTheStorage) {
  Counts counts;
  ParameterStore store(MaskedOptions(&counts));
  ASSERT_NO_FATAL_FAILURE(InitModel(&store));
  const std::vector<std::string> before = Contents(&store);

  std::vector<v1::Gradient> grads = Gradients(0);
  grads[2].set_content(Bytes(std::vector<double>{0, 0, std::numeric_limits<double>::infinity()}));
  std::vector<const v1::Gradient*> ptrs;
  for (const v1::Gradient& g : grads) ptrs.push_back(&g);
  EXPECT_THAT(store.ApplyGradients(ptrs),
              StatusIs(absl::StatusCode::kInvalidArgument,
                       HasSubstr("gradient for parameter 'b': element 2 is inf")));
  EXPECT_EQ(counts.applied, 0);
  EXPECT_EQ(Contents(&store), before);
}

TEST(BlockStorageTest, StoragesAreDestroyedWithTheStore) {
  Counts counts;
  {
    ParameterStore store(MaskedOptions(&counts));
    ASSERT_OK(store.Init(Param("n", v1::INT64, {2}, std::string(16, '\0')), Add()));
    // A duplicate's storage is made, then dropped.
    EXPECT_THAT(store.Init(Param("n", v1::INT64, {2}, std::string(16, '\0')), Add()),
                StatusCodeIs(absl::StatusCode::kAlreadyExists));
    EXPECT_EQ(counts.created, 2);
    EXPECT_EQ(counts.destroyed, 1);
  }
  EXPECT_EQ(counts.destroyed, 2);
}

}  // namespace
}  // namespace pserver
