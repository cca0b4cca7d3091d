#include "cc/client/wire_compressor.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

// `n` float32 values as `type` (FLOAT32, FLOAT16, BFLOAT16) in a new buffer.
absl::string_view Encode(ElementType type, const float* values, size_t n,
                         std::deque<std::string>* buffers) {
  std::string& out = buffers->emplace_back(n * ElementSize(type), '\0');
  EncodeFloats(type, values, n, out.data());
  return out;
}

}  // namespace

WireCompressor::Feedback* WireCompressor::FeedbackFor(const std::string& name, uint64_t elements) {
  absl::MutexLock lock(&mu_);
  std::unique_ptr<Feedback>& slot = feedback_[name];
  if (slot == nullptr) {  // a parameter's size never changes
    slot = std::make_unique<Feedback>(elements);
  }
  return slot.get();
}

void WireCompressor::Compress(const std::string& name, const v1::WireCompression& config,
                              uint64_t elements, absl::Span<GradientView> views,
                              std::optional<double>* norm, std::deque<std::string>* buffers) {
  const ElementType type = WireValueType(config);
  if (TopKCount(config, 1) == 0) {  // dense, narrowed
    for (GradientView& view : views) {
      view.content = Encode(type, reinterpret_cast<const float*>(view.content.data()),
                            view.content.size() / sizeof(float), buffers);
      view.type = type;
    }
    return;
  }
  Feedback* feedback = FeedbackFor(name, elements);
  absl::MutexLock lock(&feedback->mu);
  double sum_squares = 0;
  for (GradientView& view : views) {
    const size_t n = view.content.size() / sizeof(float);
    SparseGradient sent =
        feedback->state.AddAndSelect(reinterpret_cast<const float*>(view.content.data()),
                                     view.block.offset(), n, TopKCount(config, n));
    for (float v : sent.values) sum_squares += static_cast<double>(v) * v;
    std::string& indices = buffers->emplace_back(sent.indices.size() * sizeof(uint32_t), '\0');
    std::memcpy(indices.data(), sent.indices.data(), indices.size());
    view.indices = indices;
    view.content = Encode(type, sent.values.data(), sent.values.size(), buffers);
    view.type = type;
  }
  if (norm->has_value()) *norm = std::sqrt(sum_squares);
}

std::vector<float> WireCompressor::Residual(const std::string& name) const {
  Feedback* feedback = nullptr;
  {
    absl::MutexLock lock(&mu_);
    auto it = feedback_.find(name);
    if (it == feedback_.end()) return {};
    feedback = it->second.get();
  }
  absl::MutexLock lock(&feedback->mu);
  return feedback->state.residual();
}

absl::Status WidenPulledBlock(ElementType content_type, const Segments& content, uint64_t room,
                              float* dest, const std::string& what) {
  const size_t esize = ElementSize(content_type);
  const size_t size = SegmentsSize(content);
  if (!IsWireFloatType(content_type) || size % esize != 0 || size / esize > room) {
    return absl::DataLossError(absl::StrCat(what, ": ", size, " bytes of ",
                                            ElementTypeName(content_type),
                                            " do not fit the parameter's layout"));
  }
  if (content.size() == 1) {
    DecodeFloats(content_type, content[0].data(), size / esize, dest);
    return absl::OkStatus();
  }
  std::string flat(size, '\0');
  CopySegments(content, flat.data());
  DecodeFloats(content_type, flat.data(), size / esize, dest);
  return absl::OkStatus();
}

}  // namespace pserver
