#include "cc/client/call_group.h"

#include "absl/strings/str_cat.h"
#include "cc/client/cancellation.h"

namespace pserver {

CallGroup::~CallGroup() { Wait().IgnoreError(); }

Transport::Done CallGroup::Add(std::string label) {
  absl::MutexLock lock(&mu_);
  const size_t slot = results_.size();
  results_.emplace_back();
  labels_.push_back(std::move(label));
  ++pending_;
  return [this, slot](absl::Status status) {
    absl::MutexLock lock(&mu_);
    results_[slot] = std::move(status);
    --pending_;
  };
}

absl::Status CallGroup::Wait() {
  absl::MutexLock lock(&mu_);
  Cancellation::Await(mu_, absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  for (size_t i = 0; i < results_.size(); ++i) {
    if (!results_[i].ok()) {
      return absl::Status(results_[i].code(),
                          absl::StrCat(results_[i].message(), " (server ", labels_[i], ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<absl::Status> CallGroup::WaitAll() {
  absl::MutexLock lock(&mu_);
  Cancellation::Await(mu_, absl::Condition(
      +[](int* pending) { return *pending == 0; }, &pending_));
  return results_;
}

}  // namespace pserver
