// GradientView: a gradient (or one block of one) whose bytes are borrowed,
// and the words client and server use for a gradient they refuse. Small and
// free of the store, so that a client links no server code.
//
//   GradientView view = GradientView::Of(proto_gradient);
//   if (bad) return NonFiniteGradientError(view.name, view.block, *bad);
//
// Plain values; thread-compatible.
#ifndef PSERVER_CC_CORE_GRADIENT_VIEW_H_
#define PSERVER_CC_CORE_GRADIENT_VIEW_H_

#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cc/core/finite.h"
#include "cc/core/tensor.h"
#include "pserver/v1/types.pb.h"

namespace pserver {

// A gradient (or one block of one) whose bytes are borrowed: from a request
// buffer, a caller's tensor or the network. Valid as long as what it points at.
struct GradientView {
  absl::string_view name;
  ElementType type = v1::ELEMENT_TYPE_UNSPECIFIED;
  v1::BlockRef block;
  std::optional<double> global_norm;
  absl::string_view content;
  // The client found a NaN or an infinity in the whole gradient (types.proto
  // Gradient.skip_as_non_finite): skipped where the parameter skips them,
  // refused where it rejects them.
  bool skip_as_non_finite = false;
  // Top-k (types.proto Gradient.indices): little-endian uint32 element
  // indices within the block, one per value of `content`; empty: dense.
  absl::string_view indices;
  // Set by the server only, never decoded: it scanned `content` as `type`
  // while the request arrived (wire.h PushFiniteScan) and found no NaN or
  // infinity, so the store does not scan it again.
  bool checked_finite = false;

  static GradientView Of(const v1::Gradient& grad);
};

// "; nothing of the request was applied (...)": ends every refusal of a
// non-finite gradient.
extern const char kNonFiniteHint[];

// "parameter 'w'" or "parameter 'w' block 2 of 4": how errors name a block.
std::string DescribeBlock(absl::string_view name, const v1::BlockRef& block);

// INVALID_ARGUMENT "<what>: element 1 of the block (element 2049 of the
// parameter) is NaN": where in `block` the value `bad` is.
absl::Status NonFiniteValueError(const std::string& what, const NonFinite& bad,
                                 const v1::BlockRef& block);

// The refusal of a gradient for (block `block` of) parameter `name` whose
// element `bad.index` of the block is NaN or infinite, or whose global norm
// is not finite: INVALID_ARGUMENT "gradient for parameter 'w' block 2 of 3:
// element 1 of the block (element 2049 of the parameter) is NaN; nothing of
// the request was applied (...)". The server and the client (which checks a
// batch split over several servers before sending it) say the same.
absl::Status NonFiniteGradientError(absl::string_view name, const v1::BlockRef& block,
                                    const NonFinite& bad);
absl::Status NonFiniteNormError(absl::string_view name, const v1::BlockRef& block, double norm);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_GRADIENT_VIEW_H_
