// The trainer's side of compression on the wire (ParameterConfig.
// wire_compression, cc/core/compression.h): gradient blocks narrowed to
// float16/bfloat16 and/or cut to their top-k with error feedback before they
// are sent, and pulled blocks widened back into the caller's float32 tensor.
//
//   WireCompressor compressor;
//   std::deque<std::string> buffers;     // what the views point at
//   compressor.Compress(name, config, elements, absl::MakeSpan(views), &norm, &buffers);
//   ... send views ...
//
// Top-k residuals: one float per element of every top-k parameter this
// client has pushed (as much memory as the gradients it pushes), created at
// the first push and kept for the client's life. A push is encoded once:
// retries resend the same bytes (exactly-once), and a push that fails loses
// what it carried, as an uncompressed push would. Thread-safe; pushes of
// one parameter encode one at a time.
#ifndef PSERVER_CC_CLIENT_WIRE_COMPRESSOR_H_
#define PSERVER_CC_CLIENT_WIRE_COMPRESSOR_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "cc/core/compression.h"
#include "cc/core/gradient_view.h"
#include "cc/core/tensor.h"
#include "pserver/v1/config.pb.h"

namespace pserver {

class WireCompressor {
 public:
  // Replaces the float32 blocks `views` of a gradient for parameter `name`
  // (`elements` values in all) by their encoding under `config`, held in
  // *buffers. `*norm`, if set (a split gradient of a parameter that clips by
  // norm), becomes the norm of what is sent.
  void Compress(const std::string& name, const v1::WireCompression& config, uint64_t elements,
                absl::Span<GradientView> views, std::optional<double>* norm,
                std::deque<std::string>* buffers);

  // Residual of `name` (tests): empty if it has none.
  std::vector<float> Residual(const std::string& name) const;

 private:
  struct Feedback {
    explicit Feedback(size_t elements) : state(elements) {}
    absl::Mutex mu;
    ErrorFeedback state ABSL_GUARDED_BY(mu);
  };
  Feedback* FeedbackFor(const std::string& name, uint64_t elements);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Feedback>> feedback_ ABSL_GUARDED_BY(mu_);
};

// Widens a pulled block that arrived as `content_type` values (float16 or
// bfloat16) into float32 at `dest`, which has room for `room` values.
// DATA_LOSS naming `what` if it is not a whole number of values or does not
// fit.
absl::Status WidenPulledBlock(ElementType content_type, const Segments& content, uint64_t room,
                              float* dest, const std::string& what);

}  // namespace pserver

#endif  // PSERVER_CC_CLIENT_WIRE_COMPRESSOR_H_
