#include "cc/metrics/text_format.h"

#include <charconv>
#include <cmath>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "cc/core/names.h"

namespace pserver {
namespace metrics {
namespace {

const char* TypeName(Type type) {
  switch (type) {
    case Type::kCounter:
      return "counter";
    case Type::kGauge:
      return "gauge";
    case Type::kHistogram:
      return "histogram";
  }
  return "untyped";
}

// Escapes backslash and newline, and also double quote in label values.
// Bytes that are not valid UTF-8 (the format allows only UTF-8, and one bad
// byte would fail the whole scrape) become U+FFFD.
void AppendEscaped(absl::string_view text, bool quote, std::string* out) {
  std::string valid;
  if (FirstInvalidUtf8(text) != text.size()) {
    while (!text.empty()) {
      const size_t good = FirstInvalidUtf8(text);
      valid.append(text.data(), good);
      if (good == text.size()) break;
      valid.append("\xEF\xBF\xBD");
      text.remove_prefix(good + 1);
    }
    text = valid;
  }
  for (char c : text) {
    if (c == '\\') {
      out->append("\\\\");
    } else if (c == '\n') {
      out->append("\\n");
    } else if (c == '"' && quote) {
      out->append("\\\"");
    } else {
      out->push_back(c);
    }
  }
}

}  // namespace

bool IsValidName(absl::string_view name, bool label) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool ok = absl::ascii_isalpha(static_cast<unsigned char>(c)) || c == '_' ||
                    (c == ':' && !label) || (i > 0 && absl::ascii_isdigit(static_cast<unsigned char>(c)));
    if (!ok) return false;
  }
  return true;
}

std::string FormatDouble(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  char buffer[32];
  const std::to_chars_result result = std::to_chars(buffer, buffer + sizeof(buffer), value);
  return std::string(buffer, result.ptr);
}

void TextWriter::Family(absl::string_view name, absl::string_view help, Type type) {
  absl::StrAppend(&text_, "# HELP ", name, " ");
  AppendEscaped(help, /*quote=*/false, &text_);
  absl::StrAppend(&text_, "\n# TYPE ", name, " ", TypeName(type), "\n");
}

void TextWriter::Line(absl::string_view name, absl::string_view suffix, const Labels& labels,
                      const std::pair<std::string, std::string>* extra, absl::string_view value) {
  absl::StrAppend(&text_, name, suffix);
  if (!labels.empty() || extra != nullptr) {
    text_.push_back('{');
    bool first = true;
    auto add = [&](const std::pair<std::string, std::string>& label) {
      if (!first) text_.push_back(',');
      first = false;
      absl::StrAppend(&text_, label.first, "=\"");
      AppendEscaped(label.second, /*quote=*/true, &text_);
      text_.push_back('"');
    };
    for (const auto& label : labels) add(label);
    if (extra != nullptr) add(*extra);
    text_.push_back('}');
  }
  absl::StrAppend(&text_, " ", value, "\n");
}

void TextWriter::Sample(absl::string_view name, const Labels& labels, uint64_t value) {
  Line(name, "", labels, nullptr, absl::StrCat(value));
}

void TextWriter::Sample(absl::string_view name, const Labels& labels, int64_t value) {
  Line(name, "", labels, nullptr, absl::StrCat(value));
}

void TextWriter::Sample(absl::string_view name, const Labels& labels, double value) {
  Line(name, "", labels, nullptr, FormatDouble(value));
}

void TextWriter::Histogram(absl::string_view name, const Labels& labels,
                           absl::Span<const uint64_t> bounds, absl::Span<const uint64_t> buckets,
                           uint64_t sum, double per_unit) {
  uint64_t cumulative = 0;
  for (size_t i = 0; i < buckets.size(); ++i) {
    cumulative += buckets[i];
    const std::pair<std::string, std::string> le(
        "le", i < bounds.size() ? FormatDouble(static_cast<double>(bounds[i]) / per_unit) : "+Inf");
    Line(name, "_bucket", labels, &le, absl::StrCat(cumulative));
  }
  Line(name, "_sum", labels, nullptr, FormatDouble(static_cast<double>(sum) / per_unit));
  Line(name, "_count", labels, nullptr, absl::StrCat(cumulative));
}

}  // namespace metrics
}  // namespace pserver
