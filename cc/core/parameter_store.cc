#include "cc/core/parameter_store.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

constexpr char kAlreadyInitialized[] = "pserver already initialized";
constexpr char kNotInitialized[] = "pserver not fully initialized";

uint32_t BlockCount(const v1::BlockRef& block) {
  return block.count() == 0 ? 1 : block.count();
}

// Validates the block layout of a parameter being initialized.
absl::Status CheckBlockIndex(const std::string& what, const v1::BlockRef& block) {
  if (block.index() < BlockCount(block)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": block index ", block.index(), " is not below the block count ",
      BlockCount(block)));
}

absl::Status CheckLayout(const std::string& what, int64_t total, int64_t elements,
                         const v1::BlockRef& block) {
  PS_RETURN_IF_ERROR(CheckBlockIndex(what, block));
  const uint32_t count = BlockCount(block);
  if (elements == 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": block has no elements"));
  }
  if (count == 1 && block.offset() != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": an unsplit parameter starts at element 0, got offset ", block.offset()));
  }
  if (count == 1 && elements != total) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": content holds ", elements, " elements, the shape needs ", total));
  }
  if (block.offset() > static_cast<uint64_t>(total) ||
      static_cast<uint64_t>(elements) > static_cast<uint64_t>(total) - block.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": elements [", block.offset(), ", ", block.offset() + elements,
        ") lie outside the parameter's ", total, " elements"));
  }
  return absl::OkStatus();
}

}  // namespace

std::string DescribeBlock(const std::string& name, const v1::BlockRef& block) {
  if (BlockCount(block) <= 1) return absl::StrCat("parameter '", name, "'");
  return absl::StrCat("parameter '", name, "' block ", block.index(), " of ",
                      BlockCount(block));
}

// Layout fields never change after Init; data and optimizer are guarded by mu.
struct ParameterStore::Block {
  std::string name;
  ElementType type;
  Shape shape;
  v1::BlockRef ref;
  int64_t num_elements;

  mutable absl::Mutex mu;
  std::string data ABSL_GUARDED_BY(mu);
  std::unique_ptr<Optimizer> optimizer ABSL_GUARDED_BY(mu);
};

ParameterStore::ParameterStore() = default;
ParameterStore::~ParameterStore() = default;

absl::Status ParameterStore::Reject(absl::Status status) {
  if (!status.ok()) rejected_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

ParameterStore::Block* ParameterStore::Find(const std::string& name,
                                            uint32_t index) const {
  absl::ReaderMutexLock lock(&mu_);
  auto it = blocks_.find(Key(name, index));
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
  absl::StatusOr<std::unique_ptr<Optimizer>> optimizer =
      Optimizer::Create(config, param.element_type(), static_cast<size_t>(elements));
  if (!optimizer.ok()) {
    return Reject(absl::Status(optimizer.status().code(),
                               absl::StrCat(what, ": ", optimizer.status().message())));
  }

  auto block = std::make_unique<Block>();
  block->name = param.name();
  block->type = param.element_type();
  block->shape = std::move(shape);
  block->ref = param.block();
  block->ref.set_count(BlockCount(param.block()));
  block->num_elements = elements;
  {
    absl::MutexLock data_lock(&block->mu);
    block->data = std::move(*param.mutable_content());
    block->optimizer = *std::move(optimizer);
  }

  absl::MutexLock lock(&mu_);
  // Checked again under the lock: FinishInit may have run meanwhile.
  if (initialized()) {
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": FinishInitParams was called before InitParam of ", what)));
  }
  auto [it, inserted] = blocks_.try_emplace(Key(block->name, block->ref.index()), nullptr);
  if (!inserted) {
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": ", what, " was initialized by an earlier InitParam")));
  }
  it->second = std::move(block);
  return absl::OkStatus();
}

void ParameterStore::FinishInit() {
  absl::MutexLock lock(&mu_);
  initialized_.store(true, std::memory_order_release);
}

absl::Status ParameterStore::Get(const v1::ParamRef& ref, v1::Parameter* out) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  const bool layout_known = ref.block().count() != 0;
  if (layout_known) {
    PS_RETURN_IF_ERROR(Reject(CheckBlockIndex(DescribeBlock(ref.name(), ref.block()), ref.block())));
  }
  Block* block = Find(ref.name(), layout_known ? ref.block().index() : 0);
  if (block == nullptr) {
    return Reject(absl::NotFoundError(absl::StrCat(
        DescribeBlock(ref.name(), ref.block()), " not found on this server")));
  }
  if (layout_known && ref.block().count() != block->ref.count()) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        "parameter '", ref.name(), "' is stored as ", block->ref.count(),
        " blocks, the request assumes ", ref.block().count(),
        ": every client of a cluster must use the same block size")));
  }
  out->set_name(block->name);
  out->set_element_type(block->type);
  out->mutable_shape()->Assign(block->shape.begin(), block->shape.end());
  *out->mutable_block() = block->ref;
  {
    absl::ReaderMutexLock lock(&block->mu);
    out->set_content(block->data);
  }
  gets_served_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::Block*> ParameterStore::CheckGradient(
    const v1::Gradient& grad) {
  const std::string what = absl::StrCat("gradient for ", DescribeBlock(grad.name(), grad.block()));
  PS_RETURN_IF_ERROR(CheckBlockIndex(what, grad.block()));
  Block* block = Find(grad.name(), grad.block().index());
  if (block == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        DescribeBlock(grad.name(), grad.block()), " not found on this server"));
  }
  if (BlockCount(grad.block()) != block->ref.count() ||
      grad.block().offset() != block->ref.offset()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": the server holds it as block ", block->ref.index(), " of ",
        block->ref.count(), " at element ", block->ref.offset(), ", the request says ",
        grad.block().index(), " of ", BlockCount(grad.block()), " at element ",
        grad.block().offset(), ": every client of a cluster must use the same block size"));
  }
  if (grad.element_type() != block->type) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": element type ", ElementTypeName(grad.element_type()), " received, ",
        ElementTypeName(block->type), " expected"));
  }
  const size_t want = static_cast<size_t>(block->num_elements) * ElementSize(block->type);
  if (grad.content().size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": ", grad.content().size(), " bytes received, ", want, " expected (",
        block->num_elements, " ", ElementTypeName(block->type), " values)"));
  }
  if (grad.has_global_norm() && !(std::isfinite(grad.global_norm()) && grad.global_norm() >= 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": global_norm must be finite and >= 0, got ", grad.global_norm()));
  }
  {
    absl::ReaderMutexLock lock(&block->mu);
    PS_RETURN_IF_ERROR(block->optimizer->CheckCanApply(DescribeBlock(block->name, block->ref)));
  }
  return block;
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const v1::Gradient* const> grads) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  std::vector<Block*> targets;
  targets.reserve(grads.size());
  for (const v1::Gradient* grad : grads) {
    absl::StatusOr<Block*> block = CheckGradient(*grad);
    if (!block.ok()) return Reject(block.status());
    targets.push_back(*block);
  }
  for (size_t i = 0; i < grads.size(); ++i) {
    Block* block = targets[i];
    const v1::Gradient* grad = grads[i];
    std::optional<double> norm;
    if (grad->has_global_norm()) norm = grad->global_norm();
    absl::MutexLock lock(&block->mu);
    block->optimizer->Apply(block->data.data(), grad->content().data(), norm);
  }
  gradients_applied_.fetch_add(grads.size(), std::memory_order_relaxed);
  return absl::OkStatus();
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
    stats.parameter_bytes += block->data.size();
    stats.optimizer_state_bytes += block->optimizer->state_bytes();
  }
  return stats;
}

}  // namespace pserver
