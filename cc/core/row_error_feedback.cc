#include "cc/core/row_error_feedback.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/container/flat_hash_set.h"

namespace pserver {

RowErrorFeedback::RowErrorFeedback(size_t dim, size_t max_rows)
    : dim_(dim), max_rows_(std::max<size_t>(max_rows, 1)) {}

size_t RowErrorFeedback::DistinctKeys(absl::Span<const uint64_t> keys) {
  return absl::flat_hash_set<uint64_t>(keys.begin(), keys.end()).size();
}

RowErrorFeedback::RowList::iterator RowErrorFeedback::Touch(uint64_t key) {
  auto [it, inserted] = rows_.try_emplace(key);
  if (inserted) {
    lru_.push_front(Row{key, std::vector<float>(dim_, 0.0f)});
  } else {
    lru_.splice(lru_.begin(), lru_, it->second);
  }
  it->second = lru_.begin();
  return lru_.begin();
}

void RowErrorFeedback::Forget(RowList::iterator row) {
  rows_.erase(row->key);
  lru_.erase(row);
}

void RowErrorFeedback::DropOldest() {
  rows_.erase(lru_.back().key);
  lru_.pop_back();
  ++dropped_rows_;
}

SelectedRows RowErrorFeedback::AddAndSelect(absl::Span<const uint64_t> keys, const float* grads,
                                            size_t k) {
  // The distinct keys in the order first seen, with their rows.
  std::vector<RowList::iterator> touched;
  absl::flat_hash_map<uint64_t, size_t> position;
  for (size_t i = 0; i < keys.size(); ++i) {
    auto [it, first] = position.try_emplace(keys[i], touched.size());
    if (first) touched.push_back(Touch(keys[i]));
    float* r = touched[it->second]->residual.data();
    const float* g = grads + i * dim_;
    for (size_t j = 0; j < dim_; ++j) r[j] += g[j];
  }
  k = std::min(k, touched.size());
  // The k largest squared norms, ties to the first seen; then in that order.
  std::vector<std::pair<double, size_t>> order(touched.size());
  for (size_t t = 0; t < touched.size(); ++t) {
    double sum = 0;
    for (float v : touched[t]->residual) sum += static_cast<double>(v) * v;
    // A non-finite row goes first: the server refuses or skips it, as it
    // would have uncompressed.
    if (std::isnan(sum)) sum = std::numeric_limits<double>::infinity();
    order[t] = {-sum, t};
  }
  if (k < order.size()) std::nth_element(order.begin(), order.begin() + k, order.end());
  std::vector<size_t> chosen;
  chosen.reserve(k);
  for (size_t c = 0; c < k; ++c) chosen.push_back(order[c].second);
  std::sort(chosen.begin(), chosen.end());
  SelectedRows out;
  out.keys.reserve(k);
  out.values.reserve(k * dim_);
  for (size_t t : chosen) {
    RowList::iterator row = touched[t];
    out.keys.push_back(row->key);
    out.values.insert(out.values.end(), row->residual.begin(), row->residual.end());
    Forget(row);
  }
  // Rows left at zero hold nothing to send later.
  for (size_t c = k; c < order.size(); ++c) {
    if (order[c].first == 0) Forget(touched[order[c].second]);
  }
  while (rows_.size() > max_rows_) DropOldest();
  return out;
}

const float* RowErrorFeedback::ResidualOf(uint64_t key) const {
  auto it = rows_.find(key);
  return it == rows_.end() ? nullptr : it->second->residual.data();
}

}  // namespace pserver
