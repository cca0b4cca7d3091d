#include "cc/core/parameter_store.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "google/protobuf/util/message_differencer.h"
#include "cc/core/compression.h"
#include "cc/core/finite.h"
#include "cc/core/names.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

constexpr char kAlreadyInitialized[] = "pserver already initialized";
// Ends the ALREADY_EXISTS of an InitParam that repeats an earlier one exactly
// (Python's `init(exist_ok=True)` accepts that one and no other).
constexpr char kSameInit[] = "with the same type, shape and config";
constexpr char kZeroSizeRefused[] = "a parameter needs at least one element";

// OK for a usable wire_compression: none, or one on a float32 parameter.
absl::Status CheckWireCompression(const v1::ParameterConfig& config, ElementType type,
                                  const std::string& what) {
  if (!config.has_wire_compression()) return absl::OkStatus();
  return ValidateWireCompressionFor(config.wire_compression(), type, what, "parameter");
}

// OK if a read of a `type` block may travel as `wire_type` (not the same).
absl::Status CheckReadWireType(absl::string_view name, const v1::BlockRef& block,
                               ElementType type, ElementType wire_type) {
  if (CanTravelAs(type, wire_type)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "read of ", DescribeBlock(name, block), ": wire_type ", ElementTypeName(wire_type),
      " is not possible for a ", ElementTypeName(type),
      " parameter; want float16 or bfloat16 for a float32 one, or unset"));
}

// The block element that value `i` of a top-k gradient with `indices` is for.
size_t TopKIndex(absl::string_view indices, size_t i) {
  uint32_t index;
  std::memcpy(&index, indices.data() + i * sizeof(index), sizeof(index));
  return index;
}
constexpr char kNotInitialized[] =
    "pserver not fully initialized: call FinishInitParams (finish_init() in Python, FinishInit "
    "in Go) once every parameter is initialized";

uint32_t BlockCount(const v1::BlockRef& block) { return block.count() == 0 ? 1 : block.count(); }

bool BlockIndexInRange(const v1::BlockRef& block) { return block.index() < BlockCount(block); }

absl::Status BlockIndexError(const std::string& what, const v1::BlockRef& block) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": block index ", block.index(), " is not below the block count ", BlockCount(block)));
}

// Validates the block layout of a parameter being initialized (see "Block
// layouts" in the header) and returns n, the elements of every block but the
// last. `elements` is this block's, `total` the parameter's (both > 0).
absl::StatusOr<uint64_t> CheckLayout(const std::string& what, uint64_t total, uint64_t elements,
                                     const v1::BlockRef& block) {
  if (!BlockIndexInRange(block)) return BlockIndexError(what, block);
  const uint64_t count = BlockCount(block);
  const uint64_t index = block.index();
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
  if (block.offset() > total || elements > total - block.offset()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": elements [", block.offset(), ", ", block.offset() + elements,
                     ") lie outside the parameter's ", total, " elements"));
  }
  if (count == 1) return total;
  if (count > total) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": ", count, " blocks for a parameter of ",
                                                   total,
                                                   " elements (a block holds at least one)"));
  }
  // n from this block alone: its size, or for the last block offset / (count - 1).
  const bool last = index == count - 1;
  const uint64_t n = last ? block.offset() / (count - 1) : elements;
  using u128 = unsigned __int128;
  const bool fits = n > 0 && u128{block.offset()} == u128{index} * n &&
                    u128{count - 1} * n < total && total <= u128{count} * n &&
                    (!last || block.offset() + elements == total);
  if (!fits) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": elements [", block.offset(), ", ", block.offset() + elements, ") are not block ",
        index, " of a parameter of ", total, " elements cut into ", count,
        " blocks (n elements each, block i from element i * n, the last holding the rest)"));
  }
  return n;
}

// "float32 [4, 5] in 3 blocks of 8 elements", for layout mismatches.
std::string LayoutString(ElementType type, const Shape& shape, uint32_t count, uint64_t n) {
  return absl::StrCat(ElementTypeName(type), " ", ShapeString(shape), " in ", count,
                      count == 1 ? " block" : " blocks", " of ", n, " elements");
}

}  // namespace

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
  // Values and optimizer state, as counted in the store's budget: set when
  // the storage is made (Merge swaps it with the storage).
  uint64_t budget_bytes = 0;

  mutable absl::Mutex mu;
  std::unique_ptr<BlockStorage> storage ABSL_GUARDED_BY(mu);
};

ParameterStore::ParameterStore() : budget_(options_.max_bytes) {}
ParameterStore::ParameterStore(StoreOptions options)
    : options_(std::move(options)), budget_(options_.max_bytes) {}
ParameterStore::~ParameterStore() = default;

absl::Status ParameterStore::Reject(absl::Status status) {
  if (!status.ok()) rejected_.fetch_add(1, std::memory_order_relaxed);
  return status;
}

std::shared_ptr<ParameterStore::Block> ParameterStore::Find(absl::string_view name,
                                                            uint32_t index) const {
  const Key key(std::string(name), index);
  absl::ReaderMutexLock lock(&mu_);
  auto it = blocks_.find(key);
  return it == blocks_.end() ? nullptr : it->second;
}

absl::Status ParameterStore::Init(v1::Parameter param, const v1::ParameterConfig& config) {
  return InitBlock(std::move(param), config, Source::kCaller);
}

absl::Status ParameterStore::CheckSameLayout(const std::string& what, absl::string_view name,
                                             const Layout& layout) const {
  auto it = layouts_.find(name);
  if (it == layouts_.end()) return absl::OkStatus();
  const Layout& held = it->second;
  if (held.type == layout.type && held.shape == layout.shape && held.count == layout.count &&
      held.block_elements == layout.block_elements) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": this server holds the parameter's other blocks as ",
      LayoutString(held.type, held.shape, held.count, held.block_elements), ", this block says ",
      LayoutString(layout.type, layout.shape, layout.count, layout.block_elements),
      ": every client of a cluster must use the same block size"));
}

absl::Status ParameterStore::HeldBlockError(const Key& key, ElementType type,
                                            absl::Span<const int64_t> shape,
                                            const v1::ParameterConfig& config,
                                            const std::string& what) const {
  auto it = blocks_.find(key);
  if (it == blocks_.end()) return absl::OkStatus();
  const Block& held = *it->second;
  const std::string prefix =
      absl::StrCat(kAlreadyInitialized, ": ", what, " was initialized by an earlier InitParam ");
  if (held.type != type || !std::equal(held.shape.begin(), held.shape.end(), shape.begin(),
                                       shape.end())) {
    return absl::AlreadyExistsError(absl::StrCat(
        prefix, "as ", ElementTypeName(held.type), " ", ShapeString(held.shape), ", not ",
        ElementTypeName(type), " ", ShapeString(shape)));
  }
  if (!google::protobuf::util::MessageDifferencer::Equals(held.config, config)) {
    return absl::AlreadyExistsError(absl::StrCat(prefix, "with another config: {",
                                                 held.config.ShortDebugString(), "}, not {",
                                                 config.ShortDebugString(), "}"));
  }
  return absl::AlreadyExistsError(absl::StrCat(prefix, kSameInit));
}

absl::Status ParameterStore::InitBlock(v1::Parameter param, const v1::ParameterConfig& config,
                                       Source source) {
  if (source == Source::kCaller) {
    PS_RETURN_IF_ERROR(Reject(ValidateName("parameter", param.name())));
  } else if (param.name().empty()) {
    return Reject(absl::InvalidArgumentError("parameter name is empty"));
  }
  const std::string what = DescribeBlock(param.name(), param.block());
  const Key key(param.name(), param.block().index());
  if (initialized()) {
    absl::ReaderMutexLock lock(&mu_);
    PS_RETURN_IF_ERROR(Reject(HeldBlockError(
        key, param.element_type(), Shape(param.shape().begin(), param.shape().end()), config,
        what)));
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": FinishInitParams was called before InitParam of ", what)));
  }
  PS_RETURN_IF_ERROR(Reject(ValidateStorableType(param.element_type(), what)));
  PS_RETURN_IF_ERROR(Reject(CheckWireCompression(config, param.element_type(), what)));
  Shape shape(param.shape().begin(), param.shape().end());
  absl::StatusOr<int64_t> total = NumElements(shape);
  if (!total.ok()) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(what, ": ", total.status().message())));
  }
  if (*total == 0) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        what, ": shape ", ShapeString(shape), " has no elements (", kZeroSizeRefused, ")")));
  }
  const size_t elem = ElementSize(param.element_type());
  if (param.content().size() % elem != 0) {
    return Reject(absl::InvalidArgumentError(absl::StrCat(
        what, ": content of ", param.content().size(), " bytes is not a whole number of ",
        ElementTypeName(param.element_type()), " values")));
  }
  const int64_t elements = static_cast<int64_t>(param.content().size() / elem);
  absl::StatusOr<uint64_t> block_elements = CheckLayout(what, *total, elements, param.block());
  if (!block_elements.ok()) return Reject(block_elements.status());
  const Layout layout{param.element_type(), shape, BlockCount(param.block()), *block_elements};
  {
    // A block initialized before gets ALREADY_EXISTS below, whatever its layout.
    absl::ReaderMutexLock lock(&mu_);
    if (!blocks_.contains(key)) {
      PS_RETURN_IF_ERROR(Reject(CheckSameLayout(what, param.name(), layout)));
      // Refused before the storage is made when the values alone do not fit.
      if (source == Source::kCaller) {
        PS_RETURN_IF_ERROR(Reject(CheckRoom(what, param.content().size())));
      }
    }
  }
  if (source == Source::kCaller) {
    if (std::optional<NonFinite> bad = FindNonFinite(param.element_type(), param.content())) {
      return Reject(
          NonFiniteValueError(absl::StrCat(what, ": initial value"), *bad, param.block()));
    }
  }

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

  auto block = std::make_shared<Block>();
  block->name = std::move(spec.name);
  block->type = spec.type;
  block->shape = std::move(spec.shape);
  block->ref = std::move(spec.ref);
  block->num_elements = elements;
  block->config = std::move(spec.config);
  {
    absl::MutexLock data_lock(&block->mu);
    block->storage = *std::move(storage);
    block->budget_bytes = block->storage->value_bytes() + block->storage->state_bytes();
  }

  absl::MutexLock lock(&mu_);
  // Checked again under the lock: another Init of this block, then
  // FinishInit, may have run meanwhile. A block held is reported as such
  // first (a trainer racing another with the same init is told it matches,
  // not that the store was opened before it).
  PS_RETURN_IF_ERROR(
      Reject(HeldBlockError(key, block->type, block->shape, block->config, what)));
  if (initialized()) {
    return Reject(absl::AlreadyExistsError(absl::StrCat(
        kAlreadyInitialized, ": FinishInitParams was called before InitParam of ", what)));
  }
  PS_RETURN_IF_ERROR(Reject(CheckSameLayout(what, block->name, layout)));
  if (source == Source::kSnapshot) {
    budget_.Add(block->budget_bytes);
  } else if (!budget_.TryReserve(block->budget_bytes)) {
    return Reject(BudgetError(what, block->budget_bytes));
  }
  layouts_.try_emplace(block->name, layout);
  blocks_.emplace(key, std::move(block));
  return absl::OkStatus();
}

absl::Status ParameterStore::CheckRoom(const std::string& what, uint64_t bytes) const {
  const uint64_t used = budget_.used();
  if (bytes <= budget_.limit() && used <= budget_.limit() - bytes) return absl::OkStatus();
  return BudgetError(what, bytes);
}

absl::Status ParameterStore::BudgetError(const std::string& what, uint64_t bytes) const {
  return absl::ResourceExhaustedError(absl::StrCat(
      what, ": ", bytes, " bytes (values and optimizer state) do not fit: this server holds ",
      budget_.used(), " bytes of parameters, the most --max_param_bytes=", budget_.limit(),
      " allows; nothing was stored"));
}

std::vector<v1::ParamListing> ParameterStore::List(absl::string_view after,
                                                   size_t max_entries) const {
  std::vector<v1::ParamListing> out;
  if (max_entries == 0) return out;
  absl::ReaderMutexLock lock(&mu_);
  // The max_entries smallest names after `after`, kept in a bounded set.
  std::set<absl::string_view> names;
  for (const auto& [name, layout] : layouts_) {
    if (name <= after) continue;
    if (names.size() == max_entries) {
      if (name >= *names.rbegin()) continue;
      names.erase(std::prev(names.end()));
    }
    names.insert(name);
  }
  for (absl::string_view name : names) {
    const Layout& layout = layouts_.find(name)->second;
    v1::ParamListing& listing = out.emplace_back();
    listing.set_name(std::string(name));
    listing.set_type(layout.type);
    *listing.mutable_shape() = {layout.shape.begin(), layout.shape.end()};
    listing.set_block_count(layout.count);
    for (uint32_t i = 0; i < layout.count; ++i) {
      auto it = blocks_.find(Key(std::string(name), i));
      if (it == blocks_.end()) continue;
      listing.set_blocks_held(listing.blocks_held() + 1);
      if (listing.optimizer().empty()) {
        const v1::OptimizerConfig& optimizer = it->second->config.optimizer();
        const google::protobuf::FieldDescriptor* kind =
            optimizer.GetDescriptor()->FindFieldByNumber(optimizer.kind_case());
        listing.set_optimizer(kind == nullptr ? "sgd" : kind->name());
      }
    }
  }
  return out;
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
  PS_ASSIGN_OR_RETURN(OpenedBlock opened, Open(ref));
  out->Swap(&opened.header_);  // before reading: `read` may look at it
  return ReadOpened(opened, read);
}

absl::StatusOr<ParameterStore::OpenedBlock> ParameterStore::Open(const v1::ParamRef& ref) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  PS_RETURN_IF_ERROR(Reject(ValidateName("parameter", ref.name())));
  const bool layout_known = ref.block().count() != 0;
  if (layout_known && !BlockIndexInRange(ref.block())) {
    return Reject(BlockIndexError(DescribeBlock(ref.name(), ref.block()), ref.block()));
  }
  OpenedBlock opened;
  opened.block_ = Find(ref.name(), layout_known ? ref.block().index() : 0);
  const Block* const block = opened.block_.get();
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
  v1::Parameter* const out = &opened.header_;
  out->set_name(block->name);
  out->set_element_type(block->type);
  out->mutable_shape()->Assign(block->shape.begin(), block->shape.end());
  *out->mutable_block() = block->ref;
  out->set_clips_by_norm(block->config.clipping().clip_norm() > 0);
  out->set_non_finite(block->config.non_finite());
  if (block->config.has_wire_compression()) {
    *out->mutable_wire_compression() = block->config.wire_compression();
  }
  const ElementType wire_type = ref.wire_type();
  const bool narrow = wire_type != v1::ELEMENT_TYPE_UNSPECIFIED && wire_type != block->type;
  if (narrow) {
    PS_RETURN_IF_ERROR(Reject(CheckReadWireType(block->name, block->ref, block->type, wire_type)));
    out->set_content_type(wire_type);
    opened.wire_type_ = wire_type;
  }
  {
    absl::ReaderMutexLock lock(&block->mu);
    opened.host_ = block->storage->location() == "host";
    opened.content_bytes_ =
        narrow ? static_cast<size_t>(block->num_elements) * ElementSize(wire_type)
               : block->storage->value_bytes();
  }
  return opened;
}

absl::Status ParameterStore::ReadOpened(const OpenedBlock& opened,
                                        absl::FunctionRef<void(absl::string_view)> read) {
  const Block* const block = opened.block_.get();
  const ElementType wire_type = opened.wire_type_;
  {
    absl::ReaderMutexLock lock(&block->mu);
    absl::Status status = wire_type != v1::ELEMENT_TYPE_UNSPECIFIED
                              ? block->storage->Read([&](absl::string_view bytes) {
                                  read(NarrowFloats(wire_type, bytes));
                                })
                              : block->storage->Read(read);
    if (!status.ok()) {
      return Reject(absl::Status(status.code(), absl::StrCat(DescribeBlock(block->name, block->ref),
                                                             ": ", status.message())));
    }
  }
  gets_served_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<ParameterStore::Target> ParameterStore::CheckGradient(const GradientView& grad) {
  const absl::string_view name = grad.name;
  // Error messages only: built when one is returned, not for every gradient.
  auto what = [&] { return absl::StrCat("gradient for ", DescribeBlock(name, grad.block)); };
  PS_RETURN_IF_ERROR(ValidateName("parameter", name));
  if (!BlockIndexInRange(grad.block)) return BlockIndexError(what(), grad.block);
  std::shared_ptr<Block> block = Find(name, grad.block.index());
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
  std::string widened;
  const bool compressed =
      !grad.indices.empty() || (grad.type != block->type && IsWireFloatType(grad.type));
  if (compressed && block->type == v1::FLOAT32) {
    // Checked whole (type, lengths, indices) before anything is applied.
    PS_ASSIGN_OR_RETURN(widened, WidenGradient(grad.type, grad.content, grad.indices,
                                               block->num_elements, what()));
  } else if (!grad.indices.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": top-k indices (compression on the wire) need a float32 "
                             "parameter; this one is ",
                     ElementTypeName(block->type)));
  } else if (grad.type != block->type) {
    return absl::InvalidArgumentError(absl::StrCat(what(), ": element type ",
                                                   ElementTypeName(grad.type), " received, ",
                                                   ElementTypeName(block->type), " expected"));
  }
  const size_t want = static_cast<size_t>(block->num_elements) * ElementSize(block->type);
  if (!compressed && grad.content.size() != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": ", grad.content.size(), " bytes received, ", want, " expected (",
                     block->num_elements, " ", ElementTypeName(block->type), " values)"));
  }
  if (grad.global_norm.has_value() && *grad.global_norm < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what(), ": global_norm must be finite and >= 0, got ", *grad.global_norm));
  }
  {
    absl::ReaderMutexLock lock(&block->mu);
    if (!block->storage->can_apply()) {
      return block->storage->CheckCanApply(DescribeBlock(block->name, block->ref));
    }
  }
  // Last, as it reads every value: on the host bytes, so it serves every storage.
  const bool skip_non_finite = block->config.non_finite() == v1::ParameterConfig::SKIP;
  if (grad.skip_as_non_finite) {
    // The client saw a NaN or an infinity somewhere in the whole gradient.
    if (skip_non_finite) return Target{block, /*skip=*/true};
    non_finite_refused_.fetch_add(1, std::memory_order_relaxed);
    return absl::InvalidArgumentError(
        absl::StrCat(what(),
                     ": the client marked the gradient as holding a NaN or an infinity to be "
                     "skipped, but the parameter rejects such gradients (non_finite: REJECT)",
                     kNonFiniteHint));
  }
  if (grad.global_norm.has_value() && !std::isfinite(*grad.global_norm)) {
    if (skip_non_finite) return Target{block, /*skip=*/true};
    non_finite_refused_.fetch_add(1, std::memory_order_relaxed);
    return NonFiniteNormError(name, grad.block, *grad.global_norm);
  }
  if (std::optional<NonFinite> bad =
          grad.checked_finite ? std::nullopt : FindNonFinite(grad.type, grad.content)) {
    if (skip_non_finite) return Target{block, /*skip=*/true};
    if (!grad.indices.empty()) bad->index = TopKIndex(grad.indices, bad->index);
    non_finite_refused_.fetch_add(1, std::memory_order_relaxed);
    return NonFiniteGradientError(name, grad.block, *bad);
  }
  return Target{block, /*skip=*/false, std::move(widened)};
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const v1::Gradient* const> grads,
                                            ApplyResult* result) {
  std::vector<GradientView> views;
  views.reserve(grads.size());
  for (const v1::Gradient* grad : grads) views.push_back(GradientView::Of(*grad));
  return ApplyGradients(views, result);
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const GradientView> grads,
                                            ApplyResult* result) {
  return ApplyGradients(grads, result, [] {});
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const GradientView> grads,
                                            ApplyResult* result,
                                            absl::FunctionRef<void()> checked) {
  return ApplyGradients(grads, result, checked, [](size_t) {});
}

absl::Status ParameterStore::ApplyGradients(absl::Span<const GradientView> grads,
                                            ApplyResult* result,
                                            absl::FunctionRef<void()> checked,
                                            absl::FunctionRef<void(size_t)> applied) {
  if (!initialized()) return Reject(absl::FailedPreconditionError(kNotInitialized));
  std::vector<Target> targets;
  targets.reserve(grads.size());
  for (const GradientView& grad : grads) {
    absl::StatusOr<Target> target = CheckGradient(grad);
    if (!target.ok()) return Reject(target.status());
    targets.push_back(*target);
  }
  checked();
  ApplyResult done;
  absl::Status status;
  for (size_t i = 0; i < grads.size() && status.ok(); ++i) {
    Block* block = targets[i].block.get();
    if (targets[i].skip) {
      ++done.non_finite_skipped;
      applied(i);
      continue;
    }
    {
      absl::MutexLock lock(&block->mu);
      const bool widened = !targets[i].widened.empty();
      status = block->storage->Apply(widened ? targets[i].widened : grads[i].content,
                                     widened ? v1::FLOAT32 : grads[i].type,
                                     grads[i].global_norm);
    }
    if (status.ok()) {
      ++done.applied;
      applied(i);
    } else {
      status = absl::Status(
          status.code(), absl::StrCat("gradient for ", DescribeBlock(block->name, block->ref), ": ",
                                      status.message()));
    }
  }
  gradients_applied_.fetch_add(done.applied, std::memory_order_relaxed);
  non_finite_skipped_.fetch_add(done.non_finite_skipped, std::memory_order_relaxed);
  if (result != nullptr) *result = done;
  return Reject(status);
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
  out->set_non_finite_skipped(stats.non_finite_skipped);
  out->set_non_finite_refused(stats.non_finite_refused);
}

ParameterStore::Stats ParameterStore::GetStats() const {
  Stats stats;
  stats.initialized = initialized();
  stats.gradients_applied = gradients_applied_.load(std::memory_order_relaxed);
  stats.gets_served = gets_served_.load(std::memory_order_relaxed);
  stats.requests_rejected = rejected_.load(std::memory_order_relaxed);
  stats.non_finite_skipped = non_finite_skipped_.load(std::memory_order_relaxed);
  stats.non_finite_refused = non_finite_refused_.load(std::memory_order_relaxed);
  stats.budget_used = budget_.used();
  stats.budget_limit = budget_.limit();
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

std::vector<std::pair<std::string, uint32_t>> ParameterStore::BlockKeys() const {
  std::vector<Key> keys;
  {
    absl::ReaderMutexLock lock(&mu_);
    keys.reserve(blocks_.size());
    for (const auto& [key, block] : blocks_) keys.push_back(key);
  }
  std::sort(keys.begin(), keys.end());
  return keys;
}

uint64_t ParameterStore::EraseBlocks(absl::Span<const std::pair<std::string, uint32_t>> keys) {
  std::vector<std::shared_ptr<Block>> erased;
  {
    absl::MutexLock lock(&mu_);
    for (const Key& key : keys) {
      auto it = blocks_.find(key);
      if (it == blocks_.end()) continue;
      erased.push_back(std::move(it->second));
      blocks_.erase(it);
    }
    // A parameter none of whose blocks is left here is forgotten (a copy
    // of one of its blocks arriving later brings its layout again).
    for (const std::shared_ptr<Block>& block : erased) {
      auto layout = layouts_.find(block->name);
      if (layout == layouts_.end()) continue;  // forgotten already
      bool any = false;
      for (uint32_t i = 0; i < layout->second.count && !any; ++i) {
        any = blocks_.contains(Key(block->name, i));
      }
      if (!any) layouts_.erase(layout);
    }
    for (const std::shared_ptr<Block>& block : erased) budget_.Release(block->budget_bytes);
  }
  uint64_t bytes = 0;
  for (const std::shared_ptr<Block>& block : erased) {
    absl::ReaderMutexLock lock(&block->mu);
    bytes += block->storage->value_bytes() + block->storage->state_bytes();
  }
  return bytes;  // freed here, or by the last caller still using a block
}

absl::StatusOr<StoreSnapshot> ParameterStore::TakeSnapshot() const {
  return TakeSnapshot([](absl::string_view, uint32_t) { return true; });
}

absl::StatusOr<StoreSnapshot> ParameterStore::TakeSnapshot(
    absl::FunctionRef<bool(absl::string_view name, uint32_t index)> include) const {
  StoreSnapshot snapshot;
  std::vector<std::shared_ptr<const Block>> blocks;
  {
    absl::ReaderMutexLock lock(&mu_);
    snapshot.initialized = initialized();
    blocks.reserve(blocks_.size());
    for (const auto& [key, block] : blocks_) {
      if (include(key.first, key.second)) blocks.push_back(block);
    }
  }
  // Held by these pointers: a block erased meanwhile (EraseBlocks) stays
  // valid until the snapshot is taken.
  std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) {
    return Key(a->name, a->ref.index()) < Key(b->name, b->ref.index());
  });
  snapshot.blocks.reserve(blocks.size());
  for (const std::shared_ptr<const Block>& block : blocks) {
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

absl::Status ParameterStore::Restore(StoreSnapshot snapshot, bool replace) {
  auto not_empty = [] {
    return absl::FailedPreconditionError(
        "restore needs an empty store: it already holds parameters or was opened by "
        "FinishInitParams");
  };
  {
    absl::ReaderMutexLock lock(&mu_);
    if (!replace && (!blocks_.empty() || initialized())) return Reject(not_empty());
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
    absl::Status status = staging.InitBlock(std::move(param), block.config, Source::kSnapshot);
    if (status.code() == absl::StatusCode::kAlreadyExists) {
      return Reject(absl::InvalidArgumentError(absl::StrCat("snapshot holds ", what, " twice")));
    }
    if (!status.ok()) {
      return Reject(absl::Status(status.code(), absl::StrCat("restore: ", status.message())));
    }
    const std::shared_ptr<Block> restored = staging.Find(block.name, block.block.index());
    absl::MutexLock lock(&restored->mu);
    absl::Status imported = restored->storage->ImportState(block.optimizer);
    if (!imported.ok()) {
      return Reject(
          absl::Status(imported.code(), absl::StrCat("restore: ", what, ": ", imported.message())));
    }
  }
  absl::MutexLock lock(&mu_);
  if (!replace && (!blocks_.empty() || initialized())) return Reject(not_empty());
  absl::MutexLock staging_lock(&staging.mu_);
  uint64_t replaced = 0;
  for (const auto& [key, block] : blocks_) replaced += block->budget_bytes;
  budget_.Settle(replaced, staging.budget_.used());  // taken whole
  blocks_ = std::move(staging.blocks_);
  layouts_ = std::move(staging.layouts_);
  initialized_.store(snapshot.initialized, std::memory_order_release);
  return absl::OkStatus();
}

absl::Status ParameterStore::Merge(StoreSnapshot snapshot) {
  const bool open = snapshot.initialized;
  snapshot.initialized = false;
  // Built aside with Restore's checks; then each block joins this store or
  // gives a held one its storage (held Block objects stay: pointers to them
  // are used without mu_).
  ParameterStore staging(options_);
  PS_RETURN_IF_ERROR(Reject(staging.Restore(std::move(snapshot))));
  absl::MutexLock lock(&mu_);
  absl::MutexLock staging_lock(&staging.mu_);
  for (const auto& [key, block] : staging.blocks_) {
    const std::string what = DescribeBlock(block->name, block->ref);
    auto held = blocks_.find(key);
    if (held == blocks_.end()) {
      PS_RETURN_IF_ERROR(Reject(CheckSameLayout(what, key.first, staging.layouts_.at(key.first))));
      continue;
    }
    const Block& h = *held->second;
    if (h.type != block->type || h.shape != block->shape ||
        BlockCount(h.ref) != BlockCount(block->ref) ||
        !google::protobuf::util::MessageDifferencer::Equals(h.config, block->config)) {
      return Reject(absl::InvalidArgumentError(absl::StrCat(
          what, ": this server holds it as ", ElementTypeName(h.type), " ", ShapeString(h.shape),
          " {", h.config.ShortDebugString(), "}, the received copy is ",
          ElementTypeName(block->type), " ", ShapeString(block->shape), " {",
          block->config.ShortDebugString(), "}")));
    }
  }
  for (auto& [key, block] : staging.blocks_) {
    auto held = blocks_.find(key);
    if (held == blocks_.end()) {
      budget_.Add(block->budget_bytes);  // taken whole
      layouts_.try_emplace(key.first, staging.layouts_.at(key.first));
      blocks_.emplace(key, std::move(block));
      continue;
    }
    Block& h = *held->second;
    absl::MutexLock held_lock(&h.mu);
    absl::MutexLock block_lock(&block->mu);
    budget_.Settle(h.budget_bytes, block->budget_bytes);
    std::swap(h.storage, block->storage);
    std::swap(h.budget_bytes, block->budget_bytes);
  }
  if (open) initialized_.store(true, std::memory_order_release);
  return absl::OkStatus();
}

}  // namespace pserver
