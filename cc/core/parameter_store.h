// ParameterStore: the parameters (or blocks of parameters) one server holds,
// each with its optimizer, and the init lifecycle of Paddle's pserver.
//
//   ParameterStore store;
//   PS_RETURN_IF_ERROR(store.Init(std::move(param), config));  // first init wins
//   store.FinishInit();                                       // opens the store
//   PS_RETURN_IF_ERROR(store.ApplyGradients({&grad1, &grad2}));
//   PS_RETURN_IF_ERROR(store.Get(ref, &out));
//
// Errors: Init after FinishInit, or of a block already initialized, is
// ALREADY_EXISTS "pserver already initialized..."; Get/ApplyGradients before
// FinishInit are FAILED_PRECONDITION "pserver not fully initialized"; an
// unknown name is NOT_FOUND; a wrong element type, size or block layout is
// INVALID_ARGUMENT naming the parameter, what was expected and what came.
// A batch is checked whole before anything of it is applied.
//
// Thread-safe: blocks are updated under their own locks, so gradients for
// different parameters apply concurrently.
#ifndef PSERVER_CC_CORE_PARAMETER_STORE_H_
#define PSERVER_CC_CORE_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/optimizer.h"
#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

class ParameterStore {
 public:
  struct Stats {
    bool initialized = false;
    uint64_t blocks = 0;
    uint64_t parameter_bytes = 0;
    uint64_t optimizer_state_bytes = 0;
    uint64_t gradients_applied = 0;
    uint64_t gets_served = 0;
    uint64_t requests_rejected = 0;
  };

  ParameterStore();
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  ~ParameterStore();

  // Stores `param` (its content is moved out) with an optimizer made from
  // `config`. `param.block` says which block of the parameter this is.
  absl::Status Init(v1::Parameter param, const v1::ParameterConfig& config);

  // Opens the store for Get and ApplyGradients. Idempotent.
  void FinishInit();
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }

  // Copies one block into `out`. A ref without a block count reads block 0.
  absl::Status Get(const v1::ParamRef& ref, v1::Parameter* out);

  // Checks every gradient, then applies them in order.
  absl::Status ApplyGradients(absl::Span<const v1::Gradient* const> grads);

  Stats GetStats() const;

  // Counts a request rejected before it reached the store (for Stats).
  void CountRejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }

 private:
  struct Block;
  using Key = std::pair<std::string, uint32_t>;

  // The block a gradient goes to, after checking it against the block.
  absl::StatusOr<Block*> CheckGradient(const v1::Gradient& grad);
  Block* Find(const std::string& name, uint32_t index) const;
  absl::Status Reject(absl::Status status);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::unique_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> initialized_{false};
  std::atomic<uint64_t> gradients_applied_{0};
  std::atomic<uint64_t> gets_served_{0};
  std::atomic<uint64_t> rejected_{0};
};

// "parameter 'w'" or "parameter 'w' block 2 of 4": how errors name a block.
std::string DescribeBlock(const std::string& name, const v1::BlockRef& block);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_PARAMETER_STORE_H_
