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
  return Completion{this, slot};
}

void CallGroup::Completion::operator()(absl::Status status) const {
  absl::MutexLock lock(&group->mu_);
  group->results_[slot] = std::move(status);
  --group->pending_;
}

void CallGroup::AddHelper(Helper help, bool small) {
  absl::MutexLock lock(&mu_);
  helpers_.push_back(std::move(help));
  all_small_ = all_small_ && small;
}

bool CallGroup::DoneOrHelp() const { return pending_ == 0 || !helpers_.empty(); }

absl::Status CallGroup::Wait() {
  const std::vector<absl::Status> results = WaitAll();
  absl::MutexLock lock(&mu_);
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      return absl::Status(results[i].code(),
                          absl::StrCat(results[i].message(), " (server ", labels_[i], ")"));
    }
  }
  return absl::OkStatus();
}

std::vector<absl::Status> CallGroup::WaitAll() {
  while (true) {
    std::vector<Helper> helpers;
    bool read = false;
    {
      absl::MutexLock lock(&mu_);
      Cancellation::Await(mu_, absl::Condition(this, &CallGroup::DoneOrHelp));
      if (helpers_.empty()) return results_;
      helpers.swap(helpers_);
      // One after another on this thread when each waits little for the
      // others (small replies), else in parallel on the transport's.
      read = (helpers.size() == 1 && pending_ == 1) || all_small_;
      all_small_ = true;
    }
    for (Helper& help : helpers) help(read);
  }
}

}  // namespace pserver
