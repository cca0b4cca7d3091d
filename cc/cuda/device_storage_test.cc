// ParameterStore with its dense blocks on a GPU (device_storage.h) against
// the same store in host memory: same parameters and optimizer state over
// 100 steps, checkpoints moving both ways, blocks the device cannot update
// left on the host. Which blocks go where, and the errors without a device,
// are checked everywhere; the rest skips without a GPU, saying why.
#include "cc/cuda/device_storage.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "cc/core/checkpoint.h"
#include "cc/core/parameter_store.h"
#include "cc/cuda/device.h"
#include "cc/cuda/optimizer_cases.h"
#include "cc/cuda/test_util.h"
#include "cc/testing/status_matchers.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pserver {
namespace cuda {
namespace {

using ::pserver::testing::StatusCodeIs;
using ::pserver::testing::StatusIs;
using testing::Case;
using testing::Cases;
using ::testing::HasSubstr;
using testing::kElements;

// "w" float32 [kElements] in three blocks (device), "n" int64 [3] with add
// and "d" float64 [5] with the case's optimizer (host, both).
constexpr uint32_t kBlocks = 3;
constexpr size_t kBlockElements[kBlocks] = {4000, 4000, kElements - 8000};

template <typename T>
std::string Bytes(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

v1::Parameter Param(const std::string& name, ElementType type, int64_t total, std::string content,
                    uint32_t index = 0, uint32_t count = 1, uint64_t offset = 0) {
  v1::Parameter p;
  p.set_name(name);
  p.set_element_type(type);
  p.add_shape(total);
  p.mutable_block()->set_index(index);
  p.mutable_block()->set_count(count);
  p.mutable_block()->set_offset(offset);
  p.set_content(std::move(content));
  return p;
}

void InitModel(ParameterStore* store, const v1::ParameterConfig& config) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  uint64_t offset = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    std::vector<float> values(kBlockElements[b]);
    for (float& v : values) v = uniform(rng);
    ASSERT_OK(
        store->Init(Param("w", v1::FLOAT32, kElements, Bytes(values), b, kBlocks, offset), config));
    offset += kBlockElements[b];
  }
  v1::ParameterConfig add;
  add.mutable_optimizer()->mutable_add();
  ASSERT_OK(store->Init(Param("n", v1::INT64, 3, Bytes(std::vector<int64_t>{1, 2, 3})), add));
  ASSERT_OK(store->Init(Param("d", v1::FLOAT64, 5, Bytes(std::vector<double>{0.5, -0.5, 1, 2, -3})),
                        config));
  store->FinishInit();
}

// One step's gradients, the same for every store trained with this seed.
std::vector<v1::Gradient> StepGradients(std::mt19937& rng, int step) {
  testing::Gradient full = testing::MakeGradient(v1::FLOAT32, rng);
  std::vector<v1::Gradient> grads;
  uint64_t offset = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    v1::Gradient& g = grads.emplace_back();
    g.set_name("w");
    g.set_element_type(v1::FLOAT32);
    g.mutable_block()->set_index(b);
    g.mutable_block()->set_count(kBlocks);
    g.mutable_block()->set_offset(offset);
    g.set_content(full.bytes.substr(offset * 4, kBlockElements[b] * 4));
    if (step % 4 == 1) g.set_global_norm(50.0 + step);  // the worker's norm, sometimes
    offset += kBlockElements[b];
  }
  v1::Gradient& n = grads.emplace_back();
  n.set_name("n");
  n.set_element_type(v1::INT64);
  n.set_content(Bytes(std::vector<int64_t>{step, 1, -1}));
  v1::Gradient& d = grads.emplace_back();
  d.set_name("d");
  d.set_element_type(v1::FLOAT64);
  d.set_content(Bytes(std::vector<double>{0.1 * step, -0.2, 0.3, 0, 1}));
  return grads;
}

void Train(ParameterStore* store, uint32_t seed, int from, int to) {
  std::mt19937 rng(seed);
  for (int step = 0; step < to; ++step) {
    std::vector<v1::Gradient> grads = StepGradients(rng, step);
    if (step < from) continue;  // same random stream as a store trained from 0
    std::vector<const v1::Gradient*> ptrs;
    for (const v1::Gradient& g : grads) ptrs.push_back(&g);
    ASSERT_OK(store->ApplyGradients(ptrs));
  }
}

std::string Get(ParameterStore* store, const std::string& name, uint32_t index, uint32_t count) {
  v1::ParamRef ref;
  ref.set_name(name);
  ref.mutable_block()->set_index(index);
  ref.mutable_block()->set_count(count);
  v1::Parameter p;
  EXPECT_OK(store->Get(ref, &p));
  return p.content();
}

// Float32 bytes within 1e-5 relative (+1e-7 absolute); the largest
// difference in ulps.
int64_t ExpectClose(const std::string& want, const std::string& got, const std::string& what) {
  EXPECT_EQ(want.size(), got.size()) << what;
  if (want.size() != got.size()) return 0;
  const size_t n = want.size() / 4;
  std::vector<float> a(n), b(n);
  std::memcpy(a.data(), want.data(), n * 4);
  std::memcpy(b.data(), got.data(), n * 4);
  int64_t max_ulps = 0;
  int bad = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(std::fabs(a[i] - b[i]) <= 1e-5 * std::fabs(a[i]) + 1e-7) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "]: host " << a[i] << ", device " << b[i];
    }
    max_ulps = std::max<int64_t>(
        max_ulps, std::abs(static_cast<int64_t>(static_cast<int32_t>(testing::FloatBits(a[i]))) -
                           static_cast<int64_t>(static_cast<int32_t>(testing::FloatBits(b[i])))));
  }
  return max_ulps;
}

// Parameters and optimizer state of two stores trained alike.
int64_t ExpectStoresAgree(ParameterStore* host, ParameterStore* device) {
  int64_t max_ulps = 0;
  for (uint32_t b = 0; b < kBlocks; ++b) {
    max_ulps = std::max(max_ulps, ExpectClose(Get(host, "w", b, kBlocks),
                                              Get(device, "w", b, kBlocks), absl::StrCat("w", b)));
  }
  EXPECT_EQ(Get(host, "n", 0, 1), Get(device, "n", 0, 1));  // host storage on both: exact
  EXPECT_EQ(Get(host, "d", 0, 1), Get(device, "d", 0, 1));
  absl::StatusOr<StoreSnapshot> hs = host->TakeSnapshot();
  absl::StatusOr<StoreSnapshot> ds = device->TakeSnapshot();
  EXPECT_OK(hs.status());
  EXPECT_OK(ds.status());
  if (!hs.ok() || !ds.ok()) return max_ulps;
  EXPECT_EQ(hs->blocks.size(), ds->blocks.size());
  for (size_t i = 0; i < std::min(hs->blocks.size(), ds->blocks.size()); ++i) {
    const BlockSnapshot& h = hs->blocks[i];
    const BlockSnapshot& d = ds->blocks[i];
    const std::string what = DescribeBlock(h.name, h.block);
    EXPECT_EQ(h.optimizer.steps, d.optimizer.steps) << what;
    EXPECT_EQ(h.optimizer.slots.size(), d.optimizer.slots.size()) << what;
    if (h.type != v1::FLOAT32) {
      EXPECT_EQ(h.content, d.content) << what;
      EXPECT_EQ(h.optimizer.slots, d.optimizer.slots) << what;
      continue;
    }
    for (size_t s = 0; s < std::min(h.optimizer.slots.size(), d.optimizer.slots.size()); ++s) {
      EXPECT_EQ(h.optimizer.slots[s].first, d.optimizer.slots[s].first);
      max_ulps =
          std::max(max_ulps, ExpectClose(h.optimizer.slots[s].second, d.optimizer.slots[s].second,
                                         absl::StrCat(what, " ", h.optimizer.slots[s].first)));
    }
  }
  return max_ulps;
}

StoreOptions DeviceOptions(std::vector<std::string>* log = nullptr) {
  DeviceStorageOptions options;
  options.device = 0;
  options.copy_chunk_bytes = 4096;  // several chunks a block
  if (log != nullptr) {
    auto mu = std::make_shared<absl::Mutex>();
    options.log = [log, mu](const std::string& line) {
      absl::MutexLock lock(mu.get());
      log->push_back(line);
    };
  }
  StoreOptions store_options;
  store_options.storage_factory = DeviceStorageFactory(std::move(options));
  return store_options;
}

// ---- everywhere -----------------------------------------------------------------

TEST(DeviceStorageTest, WhatTheDeviceCanHold) {
  v1::ParameterConfig c;
  EXPECT_OK(DeviceCanHold(v1::FLOAT32, c));  // sgd by default
  for (auto set : std::vector<void (*)(v1::ParameterConfig&)>{
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_sgd()->set_momentum(0.9); },
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_adagrad(); },
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_adam(); },
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_adamw(); }}) {
    v1::ParameterConfig config;
    set(config);
    EXPECT_OK(DeviceCanHold(v1::FLOAT32, config)) << config.ShortDebugString();
  }
  EXPECT_THAT(DeviceCanHold(v1::FLOAT64, c),
              StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("float64 parameters")));
  EXPECT_THAT(DeviceCanHold(v1::INT32, c), StatusCodeIs(absl::StatusCode::kUnimplemented));
  for (auto set : std::vector<void (*)(v1::ParameterConfig&)>{
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_add(); },
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_adadelta(); },
           [](v1::ParameterConfig& c) { c.mutable_optimizer()->mutable_rmsprop(); }}) {
    v1::ParameterConfig config;
    set(config);
    EXPECT_THAT(
        DeviceCanHold(v1::FLOAT32, config),
        StatusIs(absl::StatusCode::kUnimplemented, HasSubstr("does not run on a CUDA device")))
        << config.ShortDebugString();
  }
}

TEST(DeviceStorageTest, BlocksTheDeviceCannotUpdateStayOnTheHostLoggedOnce) {
  std::vector<std::string> log;
  ParameterStore store(DeviceOptions(&log));
  v1::ParameterConfig add, adam, rmsprop;
  add.mutable_optimizer()->mutable_add();
  adam.mutable_optimizer()->mutable_adam();
  rmsprop.mutable_optimizer()->mutable_rmsprop();
  ASSERT_OK(store.Init(Param("n", v1::INT64, 2, Bytes(std::vector<int64_t>{1, 2})), add));
  ASSERT_OK(store.Init(Param("d", v1::FLOAT64, 1, Bytes(std::vector<double>{1})), adam));
  ASSERT_OK(store.Init(Param("r", v1::FLOAT32, 1, Bytes(std::vector<float>{1})), rmsprop));
  ASSERT_EQ(log.size(), 1u);
  EXPECT_THAT(log[0], HasSubstr("parameter 'n' (int64, add) and any other block cuda:0 cannot "
                                "update stay in host memory: int64 parameters"));
  EXPECT_EQ(store.GetStats().device_blocks, 0u);
  EXPECT_EQ(store.GetStats().blocks, 3u);

  // A block for the device: on it with a GPU; without one Init says why.
  absl::Status w = store.Init(Param("w", v1::FLOAT32, 2, Bytes(std::vector<float>{1, 2})), adam);
  if (CudaDeviceCount().ok()) {
    ASSERT_OK(w);
    EXPECT_EQ(store.GetStats().device_blocks, 1u);
  } else {
    EXPECT_THAT(w, StatusIs(absl::StatusCode::kUnavailable, HasSubstr("parameter 'w': ")));
    std::printf("without a device: %s\n", w.ToString().c_str());
  }
  // A bad config is refused with the host's words either way.
  v1::ParameterConfig bad;
  bad.mutable_optimizer()->mutable_adam()->set_beta1(2);
  EXPECT_THAT(store.Init(Param("b", v1::FLOAT32, 1, Bytes(std::vector<float>{1})), bad),
              StatusIs(absl::StatusCode::kInvalidArgument, HasSubstr("parameter 'b': ")));
  EXPECT_EQ(log.size(), 1u);
}

TEST(DeviceStorageTest, MakingTheFactoryProbesTheDevice) {
  DeviceStorageOptions options;
  options.device = 0;
  absl::StatusOr<BlockStorageFactory> factory = MakeDeviceStorageFactory(options);
  if (!CudaDeviceCount().ok()) {
    EXPECT_THAT(factory.status(),
                StatusIs(absl::StatusCode::kUnavailable, HasSubstr("no CUDA device")));
    GTEST_SKIP() << "no CUDA device: " << CudaDeviceCount().status().message();
  }
  ASSERT_OK(factory.status());
  options.device = 1000;
  EXPECT_THAT(MakeDeviceStorageFactory(options).status(),
              StatusCodeIs(absl::StatusCode::kInvalidArgument));
}

// ---- on a GPU ---------------------------------------------------------------------

class DeviceStoreAgreementTest : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceStoreAgreementTest, SameParametersAsAHostStoreOver100Steps) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  const Case& c = GetParam();
  ParameterStore host;
  ParameterStore device(DeviceOptions());
  ASSERT_NO_FATAL_FAILURE(InitModel(&host, c.config));
  ASSERT_NO_FATAL_FAILURE(InitModel(&device, c.config));
  const ParameterStore::Stats stats = device.GetStats();
  EXPECT_EQ(stats.device_blocks, kBlocks);
  EXPECT_EQ(stats.parameter_bytes, host.GetStats().parameter_bytes);
  EXPECT_EQ(stats.optimizer_state_bytes, host.GetStats().optimizer_state_bytes);
  ASSERT_NO_FATAL_FAILURE(Train(&host, 11, 0, 100));
  ASSERT_NO_FATAL_FAILURE(Train(&device, 11, 0, 100));
  const int64_t max_ulps = ExpectStoresAgree(&host, &device);
  RecordProperty("max_ulps", static_cast<int>(std::min<int64_t>(max_ulps, INT32_MAX)));
  std::printf("%s: largest host/device difference after 100 steps: %lld ulp\n", c.name.c_str(),
              static_cast<long long>(max_ulps));
}

INSTANTIATE_TEST_SUITE_P(Optimizers, DeviceStoreAgreementTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

TEST(DeviceStorageTest, CheckpointsMoveBetweenDeviceAndHostStores) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  v1::ParameterConfig adam;
  adam.mutable_optimizer()->mutable_adamw()->set_weight_decay(0.01);
  adam.mutable_learning_rate()->set_learning_rate(0.01);
  ParameterStore host;
  ParameterStore device(DeviceOptions());
  ASSERT_NO_FATAL_FAILURE(InitModel(&host, adam));
  ASSERT_NO_FATAL_FAILURE(InitModel(&device, adam));
  ASSERT_NO_FATAL_FAILURE(Train(&host, 3, 0, 40));
  ASSERT_NO_FATAL_FAILURE(Train(&device, 3, 0, 40));

  // Device -> files -> host: the host store holds exactly what the device had.
  ASSERT_OK_AND_ASSIGN(StoreSnapshot from_device, device.TakeSnapshot());
  ASSERT_OK_AND_ASSIGN(
      CheckpointInfo info,
      SaveCheckpoint(from_device, testing::FreshTestDir("device_storage_test_d2h"), 0, 1));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded, LoadCheckpoint(info.path));
  ParameterStore host_restored;
  ASSERT_OK(host_restored.Restore(std::move(loaded.snapshot)));
  ASSERT_OK_AND_ASSIGN(StoreSnapshot again, host_restored.TakeSnapshot());
  ASSERT_EQ(again.blocks.size(), from_device.blocks.size());
  for (size_t i = 0; i < again.blocks.size(); ++i) {
    EXPECT_EQ(again.blocks[i].content, from_device.blocks[i].content);
    EXPECT_EQ(again.blocks[i].optimizer.steps, from_device.blocks[i].optimizer.steps);
    EXPECT_EQ(again.blocks[i].optimizer.slots, from_device.blocks[i].optimizer.slots);
  }

  // Host -> files -> device: likewise, bit for bit.
  ASSERT_OK_AND_ASSIGN(StoreSnapshot from_host, host.TakeSnapshot());
  ASSERT_OK_AND_ASSIGN(
      CheckpointInfo info2,
      SaveCheckpoint(from_host, testing::FreshTestDir("device_storage_test_h2d"), 0, 1));
  ASSERT_OK_AND_ASSIGN(LoadedCheckpoint loaded2, LoadCheckpoint(info2.path));
  ParameterStore device_restored(DeviceOptions());
  ASSERT_OK(device_restored.Restore(std::move(loaded2.snapshot)));
  EXPECT_EQ(device_restored.GetStats().device_blocks, kBlocks);
  ASSERT_OK_AND_ASSIGN(StoreSnapshot again2, device_restored.TakeSnapshot());
  ASSERT_EQ(again2.blocks.size(), from_host.blocks.size());
  for (size_t i = 0; i < again2.blocks.size(); ++i) {
    EXPECT_EQ(again2.blocks[i].content, from_host.blocks[i].content);
    EXPECT_EQ(again2.blocks[i].optimizer.steps, from_host.blocks[i].optimizer.steps);
    EXPECT_EQ(again2.blocks[i].optimizer.slots, from_host.blocks[i].optimizer.slots);
  }

  // All four continue in step.
  ASSERT_NO_FATAL_FAILURE(Train(&host, 3, 40, 100));
  ASSERT_NO_FATAL_FAILURE(Train(&device, 3, 40, 100));
  ASSERT_NO_FATAL_FAILURE(Train(&host_restored, 3, 40, 100));
  ASSERT_NO_FATAL_FAILURE(Train(&device_restored, 3, 40, 100));
  ExpectStoresAgree(&host, &device);
  ExpectStoresAgree(&host, &device_restored);
  ExpectStoresAgree(&host_restored, &device_restored);
}

TEST(DeviceStorageTest, ConcurrentPullsWhilePushing) {
  PS_SKIP_WITHOUT_CUDA_DEVICE();
  v1::ParameterConfig sgd;
  sgd.mutable_optimizer()->mutable_sgd()->set_momentum(0.9);
  ParameterStore host;
  ParameterStore device(DeviceOptions());
  ASSERT_NO_FATAL_FAILURE(InitModel(&host, sgd));
  ASSERT_NO_FATAL_FAILURE(InitModel(&device, sgd));
  std::atomic<bool> done{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 4; ++t) {
    readers.emplace_back([&, t] {
      while (!done.load()) {
        std::string bytes = Get(&device, "w", t % kBlocks, kBlocks);
        EXPECT_EQ(bytes.size(), kBlockElements[t % kBlocks] * 4);
      }
    });
  }
  Train(&device, 5, 0, 50);
  done = true;
  for (std::thread& t : readers) t.join();
  ASSERT_NO_FATAL_FAILURE(Train(&host, 5, 0, 50));
  ExpectStoresAgree(&host, &device);
}

}  // namespace
}  // namespace cuda
}  // namespace pserver
