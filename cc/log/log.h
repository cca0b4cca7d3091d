// The server's log: one line per message on stderr, each with a UTC
// timestamp, a level and the server's index, as text or as one JSON object
// per line (for log shippers), with repeats of the same message limited.
//
//   log::Logger logger;                      // text, INFO and above, on stderr
//   logger.Log(log::Level::kInfo, "0", "claimed index 0 of 2");
//   // 2026-11-24T11:12:13.123456Z INFO pserver 0: claimed index 0 of 2
//   // --log_format=json:
//   // {"time":"2026-11-24T11:12:13.123456Z","level":"INFO","server":"0",
//   //  "message":"claimed index 0 of 2"}
//
// Levels ERROR, WARNING and INFO are always written; DEBUG only with
// verbosity >= 1 (pserver --v=1). The same text at the same level is written
// at most `repeat_burst` times per `repeat_window`; the next one written after
// that says how many were suppressed (" [suppressed N repeats]", or
// "suppressed": N). At most kMaxTracked distinct messages are remembered
// (beyond that the oldest window is forgotten), so the log's own memory is
// bounded.
//
// Thread-safe: lines are written whole.
#ifndef PSERVER_CC_LOG_LOG_H_
#define PSERVER_CC_LOG_LOG_H_

#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace pserver {
namespace log {

enum class Level { kError, kWarning, kInfo, kDebug };
enum class Format { kText, kJson };

// "text" or "json"; INVALID_ARGUMENT naming the choices otherwise.
absl::StatusOr<Format> ParseFormat(absl::string_view text);

struct LogOptions {
  Format format = Format::kText;
  int verbosity = 0;  // DEBUG lines need >= 1
  absl::Duration repeat_window = absl::Seconds(10);
  int repeat_burst = 5;
  // Where lines go; null: stderr. Tests capture lines here.
  std::function<void(absl::string_view line)> sink;
  // The clock; null: absl::Now. Tests step it.
  std::function<absl::Time()> now;
};

class Logger {
 public:
  static constexpr size_t kMaxTracked = 1024;

  explicit Logger(LogOptions options = {});

  // Writes `message` from server `server` (its index, "(no index yet)"
  // while it claims one, "" for the process: "pserver: ..."), unless its
  // level is above the verbosity or it is a suppressed repeat.
  void Log(Level level, absl::string_view server, absl::string_view message);
  bool Enabled(Level level) const;

 private:
  struct Repeats {
    absl::Time window_start;
    int written = 0;
    uint64_t suppressed = 0;
  };
  std::string Format(Level level, absl::Time time, absl::string_view server,
                     absl::string_view message, uint64_t suppressed) const;

  const LogOptions options_;
  absl::Mutex mu_;
  absl::flat_hash_map<std::string, Repeats> repeats_ ABSL_GUARDED_BY(mu_);
};

// The process's logger: what the pserver binary configures from its flags
// (--log_format, --v) before starting its server, and what servers write to.
Logger& Default();
// Replaces the process's logger; call before any thread logs.
void SetDefault(LogOptions options);

}  // namespace log
}  // namespace pserver

#endif  // PSERVER_CC_LOG_LOG_H_
