// TextWriter: Prometheus's text exposition format, version 0.0.4
// (https://prometheus.io/docs/instrumenting/exposition_formats/).
//
//   metrics::TextWriter out;
//   out.Family("pserver_table_rows", "Rows held.", metrics::Type::kGauge);
//   out.Sample("pserver_table_rows", {{"table", "emb"}}, 42);
//   std::string text = out.Take();
//   // # HELP pserver_table_rows Rows held.
//   // # TYPE pserver_table_rows gauge
//   // pserver_table_rows{table="emb"} 42
//
// Label values are escaped (backslash, double quote, newline; bytes that are
// not UTF-8 become U+FFFD), help text too (backslash, newline); names are the
// caller's and must be valid
// ([a-zA-Z_:][a-zA-Z0-9_:]*, labels without ':'): IsValidName checks one.
// Not thread-safe.
#ifndef PSERVER_CC_METRICS_TEXT_FORMAT_H_
#define PSERVER_CC_METRICS_TEXT_FORMAT_H_

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"

namespace pserver {
namespace metrics {

enum class Type { kCounter, kGauge, kHistogram };

using Labels = std::vector<std::pair<std::string, std::string>>;

// A metric name (or, with `label`, a label name) Prometheus accepts.
bool IsValidName(absl::string_view name, bool label = false);

class TextWriter {
 public:
  // Starts a family: its # HELP and # TYPE lines.
  void Family(absl::string_view name, absl::string_view help, Type type);
  // One sample line: name{labels} value. Integers are written exactly;
  // doubles shortest-round-trip, NaN and +Inf/-Inf as Prometheus spells them.
  void Sample(absl::string_view name, const Labels& labels, uint64_t value);
  void Sample(absl::string_view name, const Labels& labels, int64_t value);
  void Sample(absl::string_view name, const Labels& labels, double value);
  // A histogram's _bucket lines (cumulative, `le` in the exported unit, a
  // last le="+Inf"), _sum and _count. `bounds` and `buckets` as in
  // Histogram (buckets.size() == bounds.size() + 1); an observed integer
  // divided by `per_unit` is in the exported unit (1e9: nanoseconds to
  // seconds).
  void Histogram(absl::string_view name, const Labels& labels, absl::Span<const uint64_t> bounds,
                 absl::Span<const uint64_t> buckets, uint64_t sum, double per_unit);

  std::string Take() { return std::move(text_); }

 private:
  void Line(absl::string_view name, absl::string_view suffix, const Labels& labels,
            const std::pair<std::string, std::string>* extra, absl::string_view value);

  std::string text_;
};

// A double as the text format writes it: "NaN", "+Inf", "-Inf", else the
// shortest text that reads back as the same double.
std::string FormatDouble(double value);

}  // namespace metrics
}  // namespace pserver

#endif  // PSERVER_CC_METRICS_TEXT_FORMAT_H_
