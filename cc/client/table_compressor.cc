#include "cc/client/table_compressor.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "cc/core/compression.h"

namespace pserver {
namespace {

// `bytes` of float32 values as an aligned array.
std::vector<float> Floats(absl::string_view bytes) {
  std::vector<float> out(bytes.size() / sizeof(float));
  if (!out.empty()) std::memcpy(out.data(), bytes.data(), out.size() * sizeof(float));
  return out;
}

}  // namespace

std::shared_ptr<TableCompressor> TableCompressor::For(const v1::TableConfig& config) {
  if (!config.has_wire_compression() || !Compresses(config.wire_compression())) return nullptr;
  return std::shared_ptr<TableCompressor>(
      new TableCompressor(config.wire_compression(), config.dim()));
}

TableCompressor::TableCompressor(const v1::WireCompression& config, size_t dim)
    : config_(config),
      dim_(dim),
      wire_type_(WireValueType(config)),
      topk_(TopKCount(config, 1) > 0),
      feedback_(dim, config.max_residual_rows() > 0 ? config.max_residual_rows()
                                                    : kDefaultMaxResidualRows) {}

TableCompressor::Encoded TableCompressor::EncodePush(absl::Span<const uint64_t> keys,
                                                     absl::string_view grads) {
  Encoded out;
  std::vector<float> rows = Floats(grads);
  if (topk_) {
    const size_t k = TopKCount(config_, RowErrorFeedback::DistinctKeys(keys));
    absl::MutexLock lock(&mu_);
    SelectedRows sent = feedback_.AddAndSelect(keys, rows.data(), k);
    out.keys = std::move(sent.keys);
    rows = std::move(sent.values);
  } else {
    out.keys.assign(keys.begin(), keys.end());
  }
  out.values.resize(rows.size() * ElementSize(wire_type_));
  EncodeFloats(wire_type_, rows.data(), rows.size(), out.values.data());
  return out;
}

absl::StatusOr<absl::string_view> TableCompressor::DecodePull(ElementType content_type,
                                                              absl::string_view values,
                                                              std::string* widened,
                                                              const std::string& what) const {
  if (content_type == v1::ELEMENT_TYPE_UNSPECIFIED || content_type == v1::FLOAT32) return values;
  if (content_type != v1::FLOAT16 && content_type != v1::BFLOAT16) {
    return absl::DataLossError(absl::StrCat(what, ": rows came as ", ElementTypeName(content_type),
                                            ", not float32, float16 or bfloat16"));
  }
  const size_t esize = ElementSize(content_type);
  if (values.size() % esize != 0) {
    return absl::DataLossError(absl::StrCat(what, ": ", values.size(), " bytes of ",
                                            ElementTypeName(content_type),
                                            " rows are not a whole number of values"));
  }
  const size_t n = values.size() / esize;
  widened->resize(n * sizeof(float));
  std::vector<float> out(n);
  DecodeFloats(content_type, values.data(), n, out.data());
  if (n > 0) std::memcpy(widened->data(), out.data(), n * sizeof(float));
  return absl::string_view(*widened);
}

size_t TableCompressor::residual_rows() const {
  absl::MutexLock lock(&mu_);
  return feedback_.rows();
}

uint64_t TableCompressor::dropped_rows() const {
  absl::MutexLock lock(&mu_);
  return feedback_.dropped_rows();
}

}  // namespace pserver
