// ParameterStore: the parameters (or blocks of parameters) one server holds,
// each with its optimizer, and the init lifecycle of Paddle's pserver.
//
//   ParameterStore store;
//   PS_RETURN_IF_ERROR(store.Init(std::move(param), config));  // first init wins
//   store.FinishInit();                                       // opens the store
//   PS_RETURN_IF_ERROR(store.ApplyGradients({&grad1, &grad2}));
//   PS_RETURN_IF_ERROR(store.Get(ref, &out));
//
// Each block's values and optimizer live in a BlockStorage (block_storage.h):
// host memory unless StoreOptions names a factory (a GPU, cc/cuda).
//
// Errors: Init after FinishInit, or of a block already initialized, is
// ALREADY_EXISTS "pserver already initialized..."; Get/ApplyGradients before
// FinishInit are FAILED_PRECONDITION "pserver not fully initialized: call
// FinishInitParams..."; an unknown name is NOT_FOUND; a name that is not
// valid (names.h), a wrong element type, size or block layout, or a NaN or
// infinity where a finite value is needed is INVALID_ARGUMENT naming the
// parameter, what was expected and what came. A batch is checked whole
// before anything of it is applied. An Init whose block (values and
// optimizer state) would take the store past StoreOptions::max_bytes is
// RESOURCE_EXHAUSTED naming the parameter and --max_param_bytes, and stores
// nothing; blocks a snapshot brings in (Restore, Merge) are taken whole.
//
// Block layouts: a parameter of T elements cut into c blocks has blocks of n
// elements (the last holds the rest), block i starting at element i * n, with
// c = ceil(T / n), as cc/core/placement.h cuts them. Init accepts a block
// only in that layout, and only with the type, shape, count and n of the
// parameter's other blocks on this server, so blocks never overlap.
//
// Zero-size parameters (a shape with a 0 dimension) are refused: a block
// holds at least one element, and a parameter with no values has nothing to
// serve or update.
//
// Thread-safe: blocks are updated under their own locks, so gradients for
// different parameters apply concurrently.
#ifndef PSERVER_CC_CORE_PARAMETER_STORE_H_
#define PSERVER_CC_CORE_PARAMETER_STORE_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "cc/core/block_storage.h"
#include "cc/core/finite.h"
#include "cc/core/gradient_view.h"
#include "cc/core/memory_budget.h"
#include "cc/core/optimizer.h"
#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"
#include "pserver/v1/service.pb.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

// One block as a snapshot holds it: layout, config, values and optimizer
// state, all taken at the same instant (under the block's lock).
struct BlockSnapshot {
  std::string name;
  ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  Shape shape;         // the whole parameter's shape
  v1::BlockRef block;  // count is never 0 here
  v1::ParameterConfig config;
  std::string content;  // this block's elements, little-endian
  OptimizerState optimizer;
};

// What a checkpoint holds for one server. Each block is consistent in itself;
// blocks are taken one after another, so gradients arriving meanwhile may be
// in some blocks and not yet in others.
struct StoreSnapshot {
  bool initialized = false;           // FinishInit had been called
  std::vector<BlockSnapshot> blocks;  // ordered by (name, block index)
  // Opaque data that other parts of the server keep next to the parameters
  // (per-client sequence numbers, clocks, sparse tables...), by name. The
  // store neither fills nor reads it; checkpoints carry it.
  std::map<std::string, std::string> extensions;
};

// What ApplyGradients did with a batch it accepted.
struct ApplyResult {
  uint64_t applied = 0;
  // Gradients with a NaN or infinity skipped (ParameterConfig.non_finite SKIP).
  uint64_t non_finite_skipped = 0;
};

struct StoreOptions {
  // Makes each block's storage (Init, Restore). Null: host memory
  // (MakeHostBlockStorage).
  BlockStorageFactory storage_factory;
  // Bytes of values and optimizer state that Init may bring the store to
  // (--max_param_bytes); blocks a snapshot brings in are taken whole, and
  // dropped blocks give theirs back.
  uint64_t max_bytes = MemoryBudget::kUnlimited;
};

class ParameterStore {
 private:
  struct Block;

 public:
  struct Stats {
    bool initialized = false;
    uint64_t blocks = 0;
    uint64_t parameter_bytes = 0;
    uint64_t optimizer_state_bytes = 0;
    uint64_t gradients_applied = 0;
    uint64_t gets_served = 0;
    uint64_t requests_rejected = 0;
    uint64_t device_blocks = 0;  // blocks whose storage is not host memory
    uint64_t non_finite_skipped = 0;
    // Gradients with a NaN or infinity refused (non_finite REJECT), each
    // failing its whole request.
    uint64_t non_finite_refused = 0;
    // Bytes of values and optimizer state held, as counted against
    // StoreOptions::max_bytes, and that limit.
    uint64_t budget_used = 0;
    uint64_t budget_limit = 0;
  };

  ParameterStore();
  explicit ParameterStore(StoreOptions options);
  ParameterStore(const ParameterStore&) = delete;
  ParameterStore& operator=(const ParameterStore&) = delete;
  ~ParameterStore();

  // Stores `param` (its content is moved out) with an optimizer made from
  // `config`. `param.block` says which block of the parameter this is. The
  // name must be valid (ValidateName) and floating values finite.
  absl::Status Init(v1::Parameter param, const v1::ParameterConfig& config);

  // Opens the store for Get and ApplyGradients. Idempotent.
  void FinishInit();
  bool initialized() const { return initialized_.load(std::memory_order_acquire); }

  // Copies one block into `out`. A ref without a block count reads block 0.
  absl::Status Get(const v1::ParamRef& ref, v1::Parameter* out);

  // Reads one block without copying it into a message: fills `header` (all
  // but content) and calls `read` with the block's bytes under its read lock,
  // so they are consistent. `read` must not call back into the store.
  absl::Status Read(const v1::ParamRef& ref, v1::Parameter* header,
                    absl::FunctionRef<void(absl::string_view)> read);

  // A block opened for reading (Open): its header (all but content), the
  // content's length as Read would deliver it, and the block itself, kept
  // alive (EraseBlocks meanwhile does not invalidate it).
  class OpenedBlock {
   public:
    const v1::Parameter& header() const { return header_; }
    size_t content_bytes() const { return content_bytes_; }
    // In host memory: ReadOpened cannot fail and delivers content_bytes().
    bool host() const { return host_; }

   private:
    friend class ParameterStore;
    v1::Parameter header_;
    size_t content_bytes_ = 0;
    bool host_ = false;
    ElementType wire_type_ = v1::ELEMENT_TYPE_UNSPECIFIED;  // set: narrowed
    std::shared_ptr<Block> block_;
  };
  // Read's checks and header without reading: what ReadOpened then reads.
  // Read(ref, header, read) is Open then ReadOpened.
  absl::StatusOr<OpenedBlock> Open(const v1::ParamRef& ref);
  // Calls `read` with the opened block's bytes now, under its read lock.
  absl::Status ReadOpened(const OpenedBlock& opened,
                          absl::FunctionRef<void(absl::string_view)> read);

  // Checks every gradient, then applies them in order. Host storage cannot
  // fail once checked; a device error stops the batch there and is returned
  // (the gradients before it stay applied). A gradient holding a NaN or an
  // infinity fails the whole batch, or, for a parameter configured with
  // non_finite SKIP, is skipped and counted. `result` (may be null) says what
  // was done with an accepted batch.
  absl::Status ApplyGradients(absl::Span<const GradientView> grads, ApplyResult* result = nullptr);
  // The same; `checked` is called once every gradient passed its checks,
  // right before the first is applied (never for a refused batch): a
  // primary hands the batch to its backups then (docs/replication.md).
  absl::Status ApplyGradients(absl::Span<const GradientView> grads, ApplyResult* result,
                              absl::FunctionRef<void()> checked);
  // The same; `applied(i)` is also called after gradient i is applied (or
  // skipped), outside its block's lock, before gradient i + 1 is.
  absl::Status ApplyGradients(absl::Span<const GradientView> grads, ApplyResult* result,
                              absl::FunctionRef<void()> checked,
                              absl::FunctionRef<void(size_t)> applied);
  absl::Status ApplyGradients(absl::Span<const v1::Gradient* const> grads,
                              ApplyResult* result = nullptr);

  // The parameters held here named after `after` (in byte order), at most
  // `max_entries` of them, in name order: name, type, whole shape, blocks
  // held here, block count, optimizer kind. Memory and time are bounded by
  // max_entries and the number held, not by a reply of everything.
  std::vector<v1::ParamListing> List(absl::string_view after, size_t max_entries) const;

  // Every block held, as (parameter name, block index), in that order.
  std::vector<std::pair<std::string, uint32_t>> BlockKeys() const;

  // Drops the blocks `keys` names (values and optimizer state) from this
  // store; keys not held are skipped. A parameter left with no block here
  // is forgotten. A caller reading or applying to one of them meanwhile
  // finishes on its own reference. Returns the bytes of values and
  // optimizer state dropped. (A live move's old owner, docs/elastic.md.)
  uint64_t EraseBlocks(absl::Span<const std::pair<std::string, uint32_t>> keys);

  Stats GetStats() const;
  // The budget of values and optimizer state (StoreOptions::max_bytes).
  const MemoryBudget& budget() const { return budget_; }
  // The stats as the protocol reports them (index and uptime left unset).
  void FillStats(v1::ServerStats* out) const;

  // Copies every block with its config and optimizer state. Does not block
  // gradients on other blocks while one block is copied. Fails only where a
  // storage cannot copy its block to the host (a device error), naming it.
  absl::StatusOr<StoreSnapshot> TakeSnapshot() const;
  // TakeSnapshot of only the blocks `include(name, block index)` accepts
  // (a live move hands a few blocks to another server, docs/elastic.md).
  absl::StatusOr<StoreSnapshot> TakeSnapshot(
      absl::FunctionRef<bool(absl::string_view name, uint32_t index)> include) const;
  // TakeSnapshot for stores that cannot fail (host storage: the default).
  // A storage error here is a broken device, not a caller's mistake: it is
  // printed and the process aborts. Servers use TakeSnapshot.
  StoreSnapshot Snapshot() const;

  // Fills an empty store (no block, FinishInit not called) from `snapshot`:
  // recreates each block's storage (through this store's factory) and
  // optimizer from its config, imports its state and,
  // if the snapshot was initialized, opens the store. All or nothing:
  // FAILED_PRECONDITION if the store is not empty; INVALID_ARGUMENT naming the
  // block for a block Init would refuse, a duplicate, or optimizer state that
  // does not fit its config. `extensions` are ignored here. Unlike Init, it
  // takes names and values as the store once held them: a value that became
  // infinite through finite updates does not make a checkpoint unloadable.
  // With `replace`, the store need not be empty: its blocks are replaced
  // whole by the snapshot's (a standby loading a fresh copy of its shard).
  absl::Status Restore(StoreSnapshot snapshot, bool replace = false);

  // Adds the snapshot's blocks to a store that may hold others (a server
  // receiving blocks in a live move, docs/elastic.md): each is checked as
  // Restore checks it and against the layout of the parameter's blocks held
  // here; a block held already gets the snapshot's values and optimizer
  // state (its type, shape and config must be the same). All or nothing:
  // INVALID_ARGUMENT naming the first block that does not fit. Opens the
  // store when the snapshot was initialized.
  absl::Status Merge(StoreSnapshot snapshot);

  // Counts a request rejected before it reached the store (for Stats).
  void CountRejected() { rejected_.fetch_add(1, std::memory_order_relaxed); }

 private:
  // How a parameter is cut into blocks (see "Block layouts" above).
  struct Layout {
    ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
    Shape shape;
    uint32_t count = 1;
    uint64_t block_elements = 0;  // n: elements in every block but the last
  };
  using Key = std::pair<std::string, uint32_t>;
  // What Init checks beyond the layout: a snapshot's blocks were checked
  // when the store first took them.
  enum class Source { kCaller, kSnapshot };
  // A checked gradient: its block, and whether it is to be skipped.
  struct Target {
    std::shared_ptr<Block> block;
    bool skip = false;
    // A gradient that arrived compressed (cc/core/compression.h), widened
    // to the block's float32 values; empty: apply the gradient as it came.
    std::string widened;
  };

  absl::Status InitBlock(v1::Parameter param, const v1::ParameterConfig& config, Source source);
  // OK if `layout` agrees with the parameter's blocks already held.
  absl::Status CheckSameLayout(const std::string& what, absl::string_view name,
                               const Layout& layout) const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // OK unless block `key` is held; then ALREADY_EXISTS saying whether the
  // earlier Init had this type, shape and config (ending "with the same
  // type, shape and config") or what differs.
  absl::Status HeldBlockError(const Key& key, ElementType type, absl::Span<const int64_t> shape,
                              const v1::ParameterConfig& config, const std::string& what) const
      ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // The block a gradient goes to, after checking it against the block.
  absl::StatusOr<Target> CheckGradient(const GradientView& grad);
  // Shared: a caller's block stays valid if EraseBlocks drops it meanwhile.
  std::shared_ptr<Block> Find(absl::string_view name, uint32_t index) const;
  absl::Status Reject(absl::Status status);
  // OK if `bytes` more fit in the budget now; BudgetError otherwise.
  absl::Status CheckRoom(const std::string& what, uint64_t bytes) const;
  // RESOURCE_EXHAUSTED: block `what` of `bytes` bytes does not fit, naming
  // --max_param_bytes.
  absl::Status BudgetError(const std::string& what, uint64_t bytes) const;

  const StoreOptions options_;
  // Every held block's budget_bytes (Init reserves, a snapshot adds, a drop
  // gives back).
  MemoryBudget budget_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<Key, std::shared_ptr<Block>> blocks_ ABSL_GUARDED_BY(mu_);
  // Per parameter name, the layout its blocks share.
  absl::flat_hash_map<std::string, Layout> layouts_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> initialized_{false};
  std::atomic<uint64_t> gradients_applied_{0};
  std::atomic<uint64_t> gets_served_{0};
  std::atomic<uint64_t> rejected_{0};
  std::atomic<uint64_t> non_finite_skipped_{0};
  std::atomic<uint64_t> non_finite_refused_{0};
};

}  // namespace pserver

#endif  // PSERVER_CC_CORE_PARAMETER_STORE_H_
