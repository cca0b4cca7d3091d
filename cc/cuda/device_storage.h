// Device-resident parameter blocks for ParameterStore: a BlockStorage
// (cc/core/block_storage.h) whose float32 values live in a DeviceBuffer and
// whose optimizer is a DeviceOptimizer, and the store factory that puts each
// block on the device when it can and in host memory when it cannot.
//
//   DeviceStorageOptions options;
//   options.device = 0;
//   options.log = [](const std::string& line) { std::fprintf(stderr, "%s\n", line.c_str()); };
//   PS_ASSIGN_OR_RETURN(BlockStorageFactory factory, MakeDeviceStorageFactory(options));
//   StoreOptions store_options;
//   store_options.storage_factory = std::move(factory);
//   ParameterStore store(std::move(store_options));
//
// On the device: float32 blocks with sgd (momentum, Nesterov, weight decay),
// adagrad, adam or adamw, clipping and learning-rate schedules included.
// Everything else (integer and float64 blocks, `add`, adadelta, rmsprop)
// stays in host storage, exactly as without a device; `log` gets one line at
// the first such block. Errors other than "the device cannot do this" (out
// of device memory, a device fault) are returned, not hidden by a fallback.
//
// Data path: each block holds one pinned host buffer of its size. A push is
// copied into it in chunks, each chunk's host-to-device copy queued as soon
// as it is there (so the copies overlap the next memcpy), then the kernel
// runs on the block's stream; a pull copies device -> pinned and hands the
// pinned bytes to the reader. Snapshots export values and optimizer state
// to host bytes in cc/core's format, so checkpoints are the same whichever
// side held the block.
//
// Thread-safe: a device block serializes its own calls (the store may read a
// block from several threads at once); the factory may be called concurrently.
#ifndef PSERVER_CC_CUDA_DEVICE_STORAGE_H_
#define PSERVER_CC_CUDA_DEVICE_STORAGE_H_

#include <cstddef>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cc/core/block_storage.h"
#include "cc/core/element_type.h"
#include "pserver/v1/config.pb.h"

namespace pserver {
namespace cuda {

struct DeviceStorageOptions {
  int device = 0;  // the CUDA ordinal
  // Pushes are staged in chunks of this many bytes (> 0).
  size_t copy_chunk_bytes = size_t{4} << 20;
  // Gets one line at the first block that stays in host memory. May be empty.
  std::function<void(const std::string&)> log;
};

// OK if a block of `type` with `config` can live on a device (no device is
// probed); UNIMPLEMENTED saying why not otherwise.
absl::Status DeviceCanHold(ElementType type, const v1::ParameterConfig& config);

// One block on options.device. UNIMPLEMENTED where !DeviceCanHold;
// INVALID_ARGUMENT for a bad config (Optimizer::Create's words); UNAVAILABLE
// without the device; RESOURCE_EXHAUSTED when device or pinned memory runs out.
absl::StatusOr<std::unique_ptr<BlockStorage>> MakeDeviceBlockStorage(
    const BlockStorageSpec& spec, std::string values, const DeviceStorageOptions& options);

// The store's factory: MakeDeviceBlockStorage where DeviceCanHold, else
// MakeHostBlockStorage (logging the first such block). Probes nothing: a
// block for the device fails its Init with the runtime's reason when the
// device is missing.
BlockStorageFactory DeviceStorageFactory(DeviceStorageOptions options);

// DeviceStorageFactory after checking that options.device exists:
// UNAVAILABLE "no CUDA device: <reason>" or INVALID_ARGUMENT (ordinal out of
// range) otherwise, as ChooseDevice words them.
absl::StatusOr<BlockStorageFactory> MakeDeviceStorageFactory(DeviceStorageOptions options);

}  // namespace cuda
}  // namespace pserver

#endif  // PSERVER_CC_CUDA_DEVICE_STORAGE_H_
