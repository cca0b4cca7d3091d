#include "cc/core/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

constexpr char kAlreadyInitialized[] = "pserver already initialized";
constexpr char kNotInitialized[] = "pserver not fully initialized";

uint32_t BlockCount(const v1::BlockRef& block) { return block.count() == 0 ? 1 : block.count(); }

bool BlockIndexInRange(const v1::BlockRef& block) { return block.index() < BlockCount(block); }

absl::Status BlockIndexError(const std::string& what, const v1::BlockRef& block) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": block index ", block.index(), " is not below the block count ", BlockCount(block)));
}

// Validates the block layout of a parameter being initialized.
absl::Status CheckLayout(const std::string& what, int64_t total, int64_t elements,
                         const v1::BlockRef& block) {
  if (!BlockIndexInRange(block)) return BlockIndexError(what, block);
  const uint32_t count = BlockCount(block);
  if (elements == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": block has no elements"));
  }
  if (count == 1 && block.offset() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": an unsplit parameter starts at element 0, got offset ", block.offset()));
  }
  if (count == 1 && elements != total) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": content holds ", elements, " elements, the shape needs ", total));
  }
  if (block.offset() > static_cast<uint64_t>(total) ||
      static_cast<uint64_t>(elements) > static_cast<uint64_t>(total) - block.offset()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": elements [", block.offset(), ", ", block.offset() + elements,
                     ") lie outside the parameter's ", total, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeBlock(absl::string_view name, const v1::BlockRef& block) {
  if (BlockCount(block) <= 1) return absl::StrCat("parameter '", name, "'");
  return absl::StrCat("parameter '", name, "' block ", block.index(), " of ", BlockCount(block));
}

// Layout fields never change after Init; the storage (values and optimizer)
// is guarded by mu: Apply and ImportState under the writer lock, the rest
// under the reader lock.
struct ParameterStore::Block {
  std::string name;
  ElementType type;
  Shape shape;
  v1::BlockRef ref;
  int64_t num_elements;
  v1::ParameterConfig config;  // as given to Init, for snapshots

  mutable absl::Mutex mu;
  std::unique_ptr<BlockStorage> storage ABSL_GUARDED_BY(mu);
};

ParameterStore::ParameterStore() = default;
ParameterStore::ParameterStore(StoreOptions options) : options_(std::move(options)) {}
ParameterStore::~ParameterStore() = default;

absl::Status ParameterStore::Reject(absl::Status status) {
  if (!status.ok()) rejected_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

ParameterStore::Block* ParameterStore::Find(absl::string_view name, uint32_t index) const {
  const Key key(std::string(name), index);
  absl::ReaderMutexLock lock(&mu_);
  auto it = blocks_.find(key);
  return it == blocks_.end() ? nullptr : it->second.get();
}

absl::Status ParameterStore::Init(v1::Parameter param, const v1::ParameterConfig& config) {
  if (param.name().empty()) {
    return Reject(absl::InvalidArgumentError("parameter name is empty"));
  }
  const std::string what = DescribeBlock(param.name(), param.block());
  if (initialized()) {
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": FinishInitParams was called before InitParam of ", what)));
  }
  PS_RETURN_IF_ERROR(Reject(ValidateStorableType(param.element_type(), what)));
  Shape shape(param.shape().begin(), param.shape().end());
  absl::StatusOr<int64_t> total = NumElements(shape);
  if (!total.ok()) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(what, ": ", total.status().message())));
  }
  if (*total == 0) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat(what, ": shape ", ShapeString(shape), " has no elements")));
  }
  const size_t elem = ElementSize(param.element_type());
  if (param.content().size() % elem != 0) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        what, ": content of ", param.content().size(), " bytes is not a whole number of ",
        ElementTypeName(param.element_type()), " values")));
  }
  const int64_t elements = static_cast<int64_t>(param.content().size() / elem);
  PS_RETURN_IF_ERROR(Reject(CheckLayout(what, *total, elements, param.block())));

  BlockStorageSpec spec;
  spec.name = param.name();
  spec.type = param.element_type();
  spec.shape = std::move(shape);
  spec.ref = param.block();
  spec.ref.set_count(BlockCount(param.block()));
  spec.num_elements = elements;
  spec.config = config;
  absl::StatusOr<std::unique_ptr<BlockStorage>> storage =
      options_.storage_factory ? options_.storage_factory(spec, std::move(*param.mutable_content()))
                               : MakeHostBlockStorage(spec, std::move(*param.mutable_content()));
  if (storage.ok() && *storage == nullptr) {
    storage = absl::InternalError("the block storage factory returned no storage");
  }
  if (!storage.ok()) {
    return Reject(absl::Status(storage.status().code(),
                               absl::StrCat(what, ": ", storage.status().message())));
  }

  auto block = std::make_unique<Block>();
  block->name = std::move(spec.name);
  block->type = spec.type;
  block->shape = std::move(spec.shape);
  block->ref = std::move(spec.ref);
  block->num_elements = elements;
  block->config = std::move(spec.config);
  {
    absl::MutexLock data_lock(&block->mu);
    block->storage = *std::move(storage);
  }

  absl::MutexLock lock(&mu_);
  // Checked again under the lock: FinishInit may have run meanwhile.
  if (initialized()) {
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": FinishInitParams was called before InitParam of ", what)));
  }
  auto [it, inserted] = blocks_.try_emplace(Key(block->name, block->ref.index()), nullptr);
  if (!inserted) {
    return Reject(absl::AlreadyExistsError(
        absl::StrCat(kAlreadyInitialized, ": ", what, " was initialized by an earlier InitParam")));
  }
  it->second = std::move(block);
  return absl::OkStatus();
}

void ParameterStore::FinishInit() {
  absl::MutexLock lock(&mu_);
  initialized_.store(true, std::memory_order_release);
}

absl::Status ParameterStore::Get(const v1::ParamRef& ref, v1::Parameter* out) {
  return Read(ref, out,
              [out](absl::string_view bytes) { out->set_content(bytes.data(), bytes.size()); });
}

absl::Status ParameterStore::Read(const v1::ParamRef& ref, v1::Parameter* out,
                                  absl::FunctionRef<void(absl::string_view)> read) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  const bool layout_known = ref.block().count() != 0;
  if (layout_known && !BlockIndexInRange(ref.block())) {
    return Reject(BlockIndexError(DescribeBlock(ref.name(), ref.block()), ref.block()));
  }
  Block* block = Find(ref.name(), layout_known ? ref.block().index() : 0);
  if (block == nullptr) {
    return Reject(absl::NotFoundError(
        absl::StrCat(DescribeBlock(ref.name(), ref.block()), " not found on this server")));
  }
  if (layout_known && ref.block().count() != block->ref.count()) {
    return Reject(absl::InvalidArgumentError(
        absl::StrCat("parameter '", ref.name(), "' is stored as ", block->ref.count(),
                     " blocks, the request assumes ", ref.block().count(),
                     ": every client of a cluster must use the same block size")));
  }
  out->set_name(block->name);
  out->set_element_type(block->type);
  out->mutable_shape()->Assign(block->shape.begin(), block->shape.end());
  *out->mutable_block() = block->ref;
  out->set_clips_by_norm(block->config.clipping().clip_norm() > 0);
  {
    absl::ReaderMutexLock lock(&block->mu);
    absl::Status status = block->storage->Read(read);
    if (!status.ok()) {
      return Reject(absl::Status(status.code(), absl::StrCat(DescribeBlock(block->name, block->ref),
                                                             ": ", status.message())));
    }
  }
  gets_served_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

GradientView GradientView::Of(const v1::Gradient& grad) {
  GradientView view;
  view.name = grad.name();
  view.type = grad.element_type();
  view.block = grad.block();
  if (grad.has_global_norm()) view.global_norm = grad.global_norm();
  view.content = grad.content();
  return view;
}

absl::StatusOr<ParameterStore::Block*> ParameterStore::CheckGradient(const GradientView& grad) {
  const absl::string_view name = grad.name;
  // Error messages only: built when one is returned, not for every gradient.
  auto what = [&] { return absl::StrCat("gradient for ", DescribeBlock(name, grad.block)); };
  if (!BlockIndexInRange(grad.block)) return BlockIndexError(what(), grad.block);
  Block* block = Find(name, grad.block.index());
  if (block == nullptr) {
    return absl::NotFoundError(
        absl::StrCat(DescribeBlock(name, grad.block), " not found on this server"));
  }
  if (BlockCount(grad.block) != block->ref.count() || grad.block.offset() != block->ref.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what(), ": the server holds it as block ", block->ref.index(), " of ", block->ref.count(),
        " at element ", block->ref.offset(), ", the request says ", grad.block.index(), " of ",
        BlockCount(grad.block), " at element ", grad.block.offset(),
        ": every client of a cluster must use the same block size"));
  }
  if (grad.type != block->type) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": element type ",
                                                   ElementTypeName(grad.type), " received, ",
                                                   ElementTypeName(block->type), " expected"));
  }
  const size_t want = static_cast<size_t>(block->num_elements) * ElementSize(block->type);
  if (grad.content.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": ", grad.content.size(), " bytes received, ", want, " expected (",
                     block->num_elements, " ", ElementTypeName(block->type), " values)"));
  }
  if (grad.global_norm.has_value() &&
      !(std::isfinite(*grad.global_norm) && *grad.global_norm >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": global_norm must be finite and >= 0, got ", *grad.global_norm));
  }
  {
    absl::ReaderMutexLock lock(&block->mu);
    if (!block->storage->can_apply()) {
      return block->storage->CheckCanApply(DescribeBlock(block->name, block->ref));
    }
  }
  return block;
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const v1::Gradient* const> grads) {
  std::vector<GradientView> views;
  views.reserve(grads.size());
  for (const v1::Gradient* grad : grads) views.push_back(GradientView::Of(*grad));
  return ApplyGradients(views);
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const GradientView> grads) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  std::vector<Block*> targets;
  targets.reserve(grads.size());
  for (const GradientView& grad : grads) {
    absl::StatusOr<Block*> block = CheckGradient(grad);
    if (!block.ok()) return Reject(block.status());
    targets.push_back(*block);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    Block* block = targets[i];
    absl::Status status;
    {
      absl::MutexLock lock(&block->mu);
      status = block->storage->Apply(grads[i].content, grads[i].type, grads[i].global_norm);
    }
    if (!status.ok()) {
      gradients_applied_.fetch_add(i, std::memory_order_relaxed);
      return Reject(absl::Status(
          status.code(), absl::StrCat("gradient for ", DescribeBlock(block->name, block->ref), ": ",
                                      status.message())));
    }
  }
  gradients_applied_.fetch_add(grads.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

void ParameterStore::FillStats(v1::ServerStats* out) const {
  const Stats stats = GetStats();
  out->set_initialized(stats.initialized);
  out->set_parameters(stats.blocks);
  out->set_parameter_bytes(stats.parameter_bytes);
  out->set_optimizer_state_bytes(stats.optimizer_state_bytes);
  out->set_gradients_applied(stats.gradients_applied);
  out->set_gets_served(stats.gets_served);
  out->set_requests_rejected(stats.requests_rejected);
}

ParameterStore::Stats ParameterStore::GetStats() const {
  Stats stats;
  stats.initialized = initialized();
  stats.gradients_applied = gradients_applied_.load(std::memory_order_relaxed);
  stats.gets_served = gets_served_.load(std::memory_order_relaxed);
  stats.requests_rejected = rejected_.load(std::memory_order_relaxed);
  absl::ReaderMutexLock lock(&mu_);
  stats.blocks = blocks_.size();
  for (const auto& [key, block] : blocks_) {
    absl::ReaderMutexLock block_lock(&block->mu);
    stats.parameter_bytes += block->storage->value_bytes();
    stats.optimizer_state_bytes += block->storage->state_bytes();
    if (block->storage->location() != "host") ++stats.device_blocks;
  }
  return stats;
}

StoreSnapshot ParameterStore::Snapshot() const {
  absl::StatusOr<StoreSnapshot> snapshot = TakeSnapshot();
  if (!snapshot.ok()) {
    std::fprintf(stderr, "ParameterStore::Snapshot: %s\n", snapshot.status().ToString().c_str());
    std::abort();
  }
  return *std::move(snapshot);
}

absl::StatusOr<StoreSnapshot> ParameterStore::TakeSnapshot() const {
  StoreSnapshot snapshot;
  std::vector<const Block*> blocks;
  {
    absl::ReaderMutexLock lock(&mu_);
    snapshot.initialized = initialized();
    blocks.reserve(blocks_.size());
    for (const auto& [key, block] : blocks_) blocks.push_back(block.get());
  }
  // Blocks are never removed, so the pointers stay valid without mu_.
  std::sort(blocks.begin(), blocks.end(), [](const Block* a, const Block* b) {
    return Key(a->name, a->ref.index()) < Key(b->name, b->ref.index());
  });
  snapshot.blocks.reserve(blocks.size());
  for (const Block* block : blocks) {
    BlockSnapshot& out = snapshot.blocks.emplace_back();
    out.name = block->name;
    out.type = block->type;
    out.shape = block->shape;
    out.block = block->ref;
    out.config = block->config;
    absl::ReaderMutexLock lock(&block->mu);
    absl::Status read = block->storage->Read(
        [&out](absl::string_view bytes) { out.content.assign(bytes.data(), bytes.size()); });
    absl::StatusOr<OptimizerState> state =
        read.ok() ? block->storage->ExportState() : absl::StatusOr<OptimizerState>(read);
    if (!state.ok()) {
      return absl::Status(state.status().code(),
                          absl::StrCat("snapshot of ", DescribeBlock(block->name, block->ref), ": ",
                                       state.status().message()));
    }
    out.optimizer = *std::move(state);
  }
  return snapshot;
}

absl::Status ParameterStore::Restore(StoreSnapshot snapshot) {
  auto not_empty = [] {
    return absl::FailedPreconditionError(
        "restore needs an empty store: it already holds parameters or was opened by "
        "FinishInitParams");
  };
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!blocks_.empty() || initialized()) return Reject(not_empty());
  }
  // Built aside with the ordinary Init checks, then moved in whole.
  ParameterStore staging(options_);
  for (BlockSnapshot& block : snapshot.blocks) {
    const std::string what = DescribeBlock(block.name, block.block);
    v1::Parameter param;
    param.set_name(block.name);
    param.set_element_type(block.type);
    param.mutable_shape()->Assign(block.shape.begin(), block.shape.end());
    *param.mutable_block() = block.block;
    param.set_content(std::move(block.content));
    absl::Status status = staging.Init(std::move(param), block.config);
    if (status.code() == absl::StatusCode::kAlreadyExists) {
      return Reject(absl::InvalidArgumentError(absl::StrCat("snapshot holds ", what, " twice")));
    }
    if (!status.ok()) {
      return Reject(absl::Status(status.code(), absl::StrCat("restore: ", status.message())));
    }
    Block* restored = staging.Find(block.name, block.block.index());
    absl::MutexLock lock(&restored->mu);
    absl::Status imported = restored->storage->ImportState(block.optimizer);
    if (!imported.ok()) {
      return Reject(
          absl::Status(imported.code(), absl::StrCat("restore: ", what, ": ", imported.message())));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!blocks_.empty() || initialized()) return Reject(not_empty());
  absl::MutexLock staging_lock(&staging.mu_);
  blocks_ = std::move(staging.blocks_);
  if (snapshot.initialized) initialized_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace pserver
