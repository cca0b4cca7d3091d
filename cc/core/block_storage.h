// BlockStorage: where one parameter block's values and optimizer state live
// and how a gradient updates them. ParameterStore keeps layout, locking and
// checking; a BlockStorage keeps the bytes. Host memory (HostBlockStorage,
// today's code path) is the default; a StoreOptions::storage_factory may put
// blocks elsewhere (cc/cuda/device_storage.h keeps them on a GPU) without
// cc/core knowing about it.
//
//   StoreOptions options;
//   options.storage_factory = [](const BlockStorageSpec& spec, std::string values)
//       -> absl::StatusOr<std::unique_ptr<BlockStorage>> {
//     return MakeHostBlockStorage(spec, std::move(values));
//   };
//   ParameterStore store(std::move(options));
//
// The cost of the seam is one virtual call per block and operation, never one
// per element.
//
// Thread-safety: ParameterStore calls Apply and ImportState under the block's
// exclusive lock, and everything else under its shared lock, so const methods
// may run concurrently with each other: an implementation whose const methods
// use scratch memory (a staging buffer) locks it itself. A factory is called
// concurrently from concurrent Inits and must be thread-safe.
#ifndef PSERVER_CC_CORE_BLOCK_STORAGE_H_
#define PSERVER_CC_CORE_BLOCK_STORAGE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "cc/core/optimizer.h"
#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

// One block as the store has checked it, for a factory to place.
struct BlockStorageSpec {
  std::string name;
  ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  Shape shape;                 // the whole parameter's shape
  v1::BlockRef ref;            // count >= 1
  int64_t num_elements = 0;    // in this block, > 0
  v1::ParameterConfig config;  // as given to Init
};

class BlockStorage {
 public:
  virtual ~BlockStorage() = default;

  // False if no gradient may be applied (an integer block without `add`);
  // CheckCanApply then says why, naming `what`.
  virtual bool can_apply() const = 0;
  virtual absl::Status CheckCanApply(const std::string& what) const = 0;

  // Applies one gradient the store has checked: num_elements values of
  // `grad_type` (the block's type; a device may also take float16/bfloat16
  // for float32 blocks), `global_norm` as in Optimizer::Apply. Host storage
  // never fails; a device reports its errors (the block may then be partly
  // updated, as after a crash).
  virtual absl::Status Apply(absl::string_view grad, ElementType grad_type,
                             std::optional<double> global_norm) = 0;

  // Calls `read` once with the block's values as host bytes (little-endian),
  // valid only during the call.
  virtual absl::Status Read(absl::FunctionRef<void(absl::string_view)> read) const = 0;

  // The optimizer's step count and state on the host, in cc/core's Optimizer
  // slot order, so checkpoints have one format wherever the block lived.
  virtual absl::StatusOr<OptimizerState> ExportState() const = 0;
  // INVALID_ARGUMENT with Optimizer::ImportState's wording, and nothing
  // changes, if the state does not fit.
  virtual absl::Status ImportState(const OptimizerState& state) = 0;

  virtual size_t value_bytes() const = 0;
  virtual size_t state_bytes() const = 0;
  // Where the block lives, for logs and tests: "host", "cuda:0".
  virtual std::string location() const = 0;
};

// Makes a block's storage from its spec and initial values (moved in; their
// size is num_elements * ElementSize(type)). Errors are reported by Init
// prefixed with the block's name (INVALID_ARGUMENT for a bad config).
using BlockStorageFactory = std::function<absl::StatusOr<std::unique_ptr<BlockStorage>>(
    const BlockStorageSpec& spec, std::string values)>;

// The host storage: the values in a std::string, updated by cc/core's
// Optimizer. INVALID_ARGUMENT as Optimizer::Create words it.
absl::StatusOr<std::unique_ptr<BlockStorage>> MakeHostBlockStorage(const BlockStorageSpec& spec,
                                                                   std::string values);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_BLOCK_STORAGE_H_
