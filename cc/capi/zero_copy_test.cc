// The C ABI sends gradients from the caller's buffers and reads parameters
// into them in place: no allocation as large as the parameter is made
// anywhere in the process (client, in-process transport, servers) during
// send_grad, get_param, get_params or push_pull, where the C ABI used to
// copy every gradient and every result once. Counted with a global
// operator new, not timed.
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>
#include <vector>

#include "cc/capi/pserver.h"
#include "gtest/gtest.h"

namespace {

constexpr size_t kElements = size_t{1} << 21;  // 8 MiB of float32: 8 blocks of 1 MiB
constexpr size_t kBytes = kElements * sizeof(float);

std::atomic<bool> counting{false};
std::atomic<int> large_allocations{0};

}  // namespace

void* operator new(size_t size) {
  if (counting.load(std::memory_order_relaxed) && size >= kBytes) large_allocations.fetch_add(1);
  if (void* p = std::malloc(size == 0 ? 1 : size)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace {

// Counts the allocations of at least kBytes made while it lives.
class LargeAllocations {
 public:
  LargeAllocations() {
    large_allocations.store(0);
    counting.store(true);
  }
  ~LargeAllocations() { counting.store(false); }
  int count() const { return large_allocations.load(); }
};

class ZeroCopyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    status_ = pserver_status_new();
    cluster_ = pserver_local_cluster_new(2, status_);
    ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
    client_ = pserver_local_cluster_client(cluster_, nullptr, status_);
    ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
    pserver_param_config_t* config = pserver_param_config_new();
    pserver_param_config_set(config, "lr", 1.0, status_);  // SGD: w -= g
    std::vector<float> w(kElements, 1.0f);
    const int64_t shape[1] = {static_cast<int64_t>(kElements)};
    pserver_client_init_param(client_, "w", 1, PSERVER_FLOAT32, shape, 1, w.data(), kBytes, config,
                              status_);
    pserver_param_config_delete(config);
    ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
    pserver_client_finish_init(client_, status_);
    ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  }
  void TearDown() override {
    pserver_client_delete(client_);
    pserver_local_cluster_delete(cluster_);
    pserver_status_delete(status_);
  }

  pserver_status_t* status_ = nullptr;
  pserver_local_cluster_t* cluster_ = nullptr;
  pserver_client_t* client_ = nullptr;
};

// The counter sees a copy of a parameter's size (what the C ABI made before).
TEST(LargeAllocationsTest, CountsACopyOfAParameter) {
  std::vector<float> grad(kElements, 0.25f);
  LargeAllocations large;
  std::vector<float> copy(grad);
  EXPECT_EQ(large.count(), 1);
  EXPECT_EQ(copy.size(), kElements);
}

TEST_F(ZeroCopyTest, SendGradReadsTheCallersBuffer) {
  std::vector<float> grad(kElements, 0.25f);
  {
    LargeAllocations large;
    pserver_client_send_grad(client_, "w", 1, PSERVER_FLOAT32, grad.data(), kBytes, status_);
    EXPECT_EQ(large.count(), 0);
  }
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  std::vector<float> w(kElements);
  pserver_client_get_param(client_, "w", 1, PSERVER_FLOAT32, w.data(), kBytes, status_);
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  EXPECT_EQ(w.front(), 0.75f);
  EXPECT_EQ(w.back(), 0.75f);
}

TEST_F(ZeroCopyTest, GetParamWritesTheCallersBufferInPlace) {
  std::vector<float> w(kElements, -1.0f);
  {
    LargeAllocations large;
    pserver_client_get_param(client_, "w", 1, PSERVER_FLOAT32, w.data(), kBytes, status_);
    EXPECT_EQ(large.count(), 0);
  }
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  EXPECT_EQ(w.front(), 1.0f);
  EXPECT_EQ(w[kElements / 2], 1.0f);
  EXPECT_EQ(w.back(), 1.0f);
}

TEST_F(ZeroCopyTest, BatchedCallsSendAndFillInPlace) {
  std::vector<float> grad(kElements, 0.5f);
  std::vector<float> w(kElements, -1.0f);
  pserver_batch_t* grads = pserver_batch_new();
  pserver_batch_t* outs = pserver_batch_new();
  pserver_batch_add_input(grads, "w", 1, PSERVER_FLOAT32, grad.data(), kBytes);
  pserver_batch_add_output(outs, "w", 1, PSERVER_FLOAT32, w.data(), kBytes);
  {
    LargeAllocations large;
    pserver_client_push_pull(client_, grads, outs, status_);
    EXPECT_EQ(large.count(), 0);
  }
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  EXPECT_EQ(w.front(), 0.5f);
  EXPECT_EQ(w.back(), 0.5f);
  {
    LargeAllocations large;
    pserver_client_send_grads(client_, grads, status_);
    ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
    pserver_client_get_params(client_, outs, status_);
    EXPECT_EQ(large.count(), 0);
  }
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  EXPECT_EQ(w.front(), 0.0f);
  EXPECT_EQ(w.back(), 0.0f);
  pserver_batch_delete(grads);
  pserver_batch_delete(outs);
}

TEST_F(ZeroCopyTest, AWrongSizeOutputFailsBeforeAnythingIsSent) {
  std::vector<float> grad(kElements, 0.5f);
  std::vector<float> small(4, -1.0f);
  pserver_batch_t* grads = pserver_batch_new();
  pserver_batch_t* outs = pserver_batch_new();
  pserver_batch_add_input(grads, "w", 1, PSERVER_FLOAT32, grad.data(), kBytes);
  pserver_batch_add_output(outs, "w", 1, PSERVER_FLOAT32, small.data(), 4 * sizeof(float));
  pserver_client_push_pull(client_, grads, outs, status_);
  EXPECT_EQ(pserver_status_code(status_), PSERVER_INVALID_ARGUMENT);
  EXPECT_EQ(small[0], -1.0f);
  // The gradient was not applied.
  std::vector<float> w(kElements);
  pserver_client_get_param(client_, "w", 1, PSERVER_FLOAT32, w.data(), kBytes, status_);
  ASSERT_EQ(pserver_status_code(status_), PSERVER_OK) << pserver_status_message(status_);
  EXPECT_EQ(w.front(), 1.0f);
  pserver_batch_delete(grads);
  pserver_batch_delete(outs);
}

}  // namespace
