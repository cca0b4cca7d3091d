#include "cc/rpc/spill_writer.h"

#include "absl/status/statusor.h"

namespace pserver {

void SpillWriter::Add(absl::string_view bytes) {
  added_ += bytes.size();
  if (!status_.ok() || bytes.empty()) return;
  const absl::string_view pending =
      absl::string_view(spill_).substr(spill_begin_);
  const absl::string_view parts[] = {pending, bytes};
  absl::StatusOr<size_t> sent = socket_->WriteSome(parts);
  if (!sent.ok()) {
    status_ = sent.status();
    spill_.clear();
    spill_begin_ = 0;
    return;
  }
  size_t n = *sent;
  if (n < pending.size()) {
    spill_begin_ += n;
    n = 0;
  } else {
    n -= pending.size();
    spill_.clear();
    spill_begin_ = 0;
  }
  const absl::string_view rest = bytes.substr(n);
  spill_.append(rest.data(), rest.size());
  spilled_ += rest.size();
}

absl::Status SpillWriter::Finish() {
  if (status_.ok() && spill_begin_ < spill_.size()) {
    const absl::string_view pending = absl::string_view(spill_).substr(spill_begin_);
    status_ = socket_->Write({&pending, 1});
  }
  spill_.clear();
  spill_begin_ = 0;
  return status_;
}

}  // namespace pserver
