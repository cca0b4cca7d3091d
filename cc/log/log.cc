#include "cc/log/log.h"

#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace pserver {
namespace log {
namespace {

const char* LevelName(Level level) {
  switch (level) {
    case Level::kError:
      return "ERROR";
    case Level::kWarning:
      return "WARNING";
    case Level::kInfo:
      return "INFO";
    case Level::kDebug:
      return "DEBUG";
  }
  return "INFO";
}

// A JSON string's contents: quotes, backslashes and control characters escaped.
void AppendJsonEscaped(absl::string_view text, std::string* out) {
  for (unsigned char c : text) {
    switch (c) {
      case '"':
        out->append("\\\"");
        break;
      case '\\':
        out->append("\\\\");
        break;
      case '\n':
        out->append("\\n");
        break;
      case '\r':
        out->append("\\r");
        break;
      case '\t':
        out->append("\\t");
        break;
      default:
        if (c < 0x20) {
          absl::StrAppendFormat(out, "\\u%04x", c);
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
}

std::unique_ptr<Logger>& DefaultSlot() {
  static auto* slot = new std::unique_ptr<Logger>(new Logger());
  return *slot;
}

}  // namespace

absl::StatusOr<Format> ParseFormat(absl::string_view text) {
  if (text == "text") return Format::kText;
  if (text == "json") return Format::kJson;
  return absl::InvalidArgumentError(
      absl::StrCat("log format must be 'text' or 'json', got '", text, "'"));
}

Logger::Logger(LogOptions options) : options_(std::move(options)) {}

bool Logger::Enabled(Level level) const {
  return level != Level::kDebug || options_.verbosity >= 1;
}

std::string Logger::Format(Level level, absl::Time time, absl::string_view server,
                           absl::string_view message, uint64_t suppressed) const {
  const std::string stamp = absl::FormatTime("%Y-%m-%dT%H:%M:%E6SZ", time, absl::UTCTimeZone());
  std::string line;
  if (options_.format == Format::kJson) {
    absl::StrAppend(&line, "{\"time\":\"", stamp, "\",\"level\":\"", LevelName(level),
                    "\",\"server\":\"");
    AppendJsonEscaped(server, &line);
    line.append("\",\"message\":\"");
    AppendJsonEscaped(message, &line);
    line.push_back('"');
    if (suppressed > 0) absl::StrAppend(&line, ",\"suppressed\":", suppressed);
    line.append("}\n");
    return line;
  }
  absl::StrAppend(&line, stamp, " ", LevelName(level), " pserver", server.empty() ? "" : " ",
                  server, ": ", message);
  if (suppressed > 0) absl::StrAppend(&line, " [suppressed ", suppressed, " repeats]");
  line.push_back('\n');
  return line;
}

void Logger::Log(Level level, absl::string_view server, absl::string_view message) {
  if (!Enabled(level)) return;
  const absl::Time now = options_.now ? options_.now() : absl::Now();
  uint64_t suppressed = 0;
  {
    absl::MutexLock lock(&mu_);
    if (repeats_.size() >= kMaxTracked) {
      // Forget the windows that are over; if none is, forget all (bounded).
      absl::erase_if(repeats_, [&](const auto& entry) {
        return now - entry.second.window_start >= options_.repeat_window;
      });
      if (repeats_.size() >= kMaxTracked) repeats_.clear();
    }
    Repeats& r = repeats_[absl::StrCat(static_cast<int>(level), ":", server, ":", message)];
    if (r.written == 0 || now - r.window_start >= options_.repeat_window) {
      suppressed = r.suppressed;
      r = Repeats{now, 1, 0};
    } else if (r.written < options_.repeat_burst) {
      ++r.written;
    } else {
      ++r.suppressed;
      return;
    }
  }
  const std::string line = Format(level, now, server, message, suppressed);
  if (options_.sink) {
    options_.sink(line);
  } else {
    std::fwrite(line.data(), 1, line.size(), stderr);
    std::fflush(stderr);
  }
}

Logger& Default() { return *DefaultSlot(); }

void SetDefault(LogOptions options) { DefaultSlot() = std::make_unique<Logger>(std::move(options)); }

}  // namespace log
}  // namespace pserver
