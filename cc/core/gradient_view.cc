#include "cc/core/gradient_view.h"

#include "absl/strings/str_cat.h"

namespace pserver {
namespace {

uint32_t BlockCount(const v1::BlockRef& block) { return block.count() == 0 ? 1 : block.count(); }

}  // namespace

const char kNonFiniteHint[] =
    "; nothing of the request was applied (a parameter configured with non_finite: SKIP skips "
    "such gradients instead)";

GradientView GradientView::Of(const v1::Gradient& grad) {
  GradientView view;
  view.name = grad.name();
  view.type = grad.element_type();
  view.block = grad.block();
  if (grad.has_global_norm()) view.global_norm = grad.global_norm();
  view.content = grad.content();
  view.skip_as_non_finite = grad.skip_as_non_finite();
  view.indices = grad.indices();
  return view;
}

std::string DescribeBlock(absl::string_view name, const v1::BlockRef& block) {
  if (BlockCount(block) <= 1) return absl::StrCat("parameter '", name, "'");
  return absl::StrCat("parameter '", name, "' block ", block.index(), " of ", BlockCount(block));
}

absl::Status NonFiniteValueError(const std::string& what, const NonFinite& bad,
                                 const v1::BlockRef& block) {
  std::string where = absl::StrCat("element ", bad.index);
  if (BlockCount(block) > 1) {
    absl::StrAppend(&where, " of the block (element ", block.offset() + bad.index,
                    " of the parameter)");
  }
  return absl::InvalidArgumentError(absl::StrCat(what, ": ", where, " is ", bad.kind));
}

absl::Status NonFiniteGradientError(absl::string_view name, const v1::BlockRef& block,
                                    const NonFinite& bad) {
  const std::string what = absl::StrCat("gradient for ", DescribeBlock(name, block));
  return absl::InvalidArgumentError(
      absl::StrCat(NonFiniteValueError(what, bad, block).message(), kNonFiniteHint));
}

absl::Status NonFiniteNormError(absl::string_view name, const v1::BlockRef& block, double norm) {
  return absl::InvalidArgumentError(absl::StrCat("gradient for ", DescribeBlock(name, block),
                                                 ": global_norm must be finite and >= 0, got ",
                                                 norm, kNonFiniteHint));
}

}  // namespace pserver
