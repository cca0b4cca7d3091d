#include "cc/trace/trace.h"

#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace pserver {
namespace trace {

int64_t NowMicros() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

namespace {

// The length of the well-formed UTF-8 sequence at text[i] (lead byte >=
// 0x80), or 0 when it is not one (as Python's and Perfetto's decoders judge).
size_t Utf8Length(absl::string_view text, size_t i) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  size_t n = 0;
  unsigned char low = 0x80, high = 0xBF;  // the range of the second byte
  if (lead >= 0xC2 && lead <= 0xDF) {
    n = 2;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    n = 3;
    if (lead == 0xE0) low = 0xA0;   // no overlong forms
    if (lead == 0xED) high = 0x9F;  // no surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    n = 4;
    if (lead == 0xF0) low = 0x90;
    if (lead == 0xF4) high = 0x8F;  // nothing past U+10FFFF
  } else {
    return 0;
  }
  if (i + n > text.size() || byte(i + 1) < low || byte(i + 1) > high) return 0;
  for (size_t k = 2; k < n; ++k) {
    if (byte(i + k) < 0x80 || byte(i + k) > 0xBF) return 0;
  }
  return n;
}

}  // namespace

std::string JsonString(absl::string_view text) {
  std::string out;
  out.reserve(text.size() + 2);
  out += '"';
  size_t plain = 0;  // start of the run of characters copied as they are
  size_t i = 0;
  while (i < text.size()) {
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      ++i;
      continue;
    }
    if (c >= 0x80) {
      if (const size_t n = Utf8Length(text, i); n > 0) {
        i += n;
        continue;
      }
    }
    out.append(text.data() + plain, i - plain);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x80) {
      out += "\\ufffd";  // a byte that is not UTF-8: names may be any bytes
    } else {
      absl::StrAppendFormat(&out, "\\u%04x", c);
    }
    plain = ++i;
  }
  out.append(text.data() + plain, text.size() - plain);
  out += '"';
  return out;
}

Args& Args::Add(absl::string_view key, int64_t value) {
  absl::StrAppend(&body_, body_.empty() ? "" : ",", JsonString(key), ":", value);
  return *this;
}

Args& Args::Add(absl::string_view key, absl::string_view value) {
  absl::StrAppend(&body_, body_.empty() ? "" : ",", JsonString(key), ":", JsonString(value));
  return *this;
}

Args& Args::AddHex(absl::string_view key, uint64_t value) {
  return Add(key, absl::StrCat(absl::Hex(value)));
}

Recorder::Recorder(const RecorderOptions& options)
    : options_(options),
      pid_(getpid()),
      start_monotonic_us_(NowMicros()),
      start_unix_us_(absl::ToUnixMicros(absl::Now())) {}

absl::StatusOr<std::unique_ptr<Recorder>> Recorder::Open(const RecorderOptions& options) {
  if (options.path.empty()) return absl::InvalidArgumentError("trace: no file named");
  if (options.max_events == 0) {
    return absl::InvalidArgumentError("trace: max_events must be at least 1");
  }
  std::FILE* file = std::fopen(options.path.c_str(), "w");
  if (file == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("trace: cannot create ", options.path, ": ", std::strerror(errno)));
  }
  std::fclose(file);
  return std::unique_ptr<Recorder>(new Recorder(options));
}

Recorder::~Recorder() {
  if (absl::Status status = Flush(); !status.ok()) {
    std::fprintf(stderr, "%s\n", status.ToString().c_str());
  }
}

void Recorder::Complete(absl::string_view name, const char* category, int64_t start_us,
                        int64_t end_us, uint32_t tid, std::string args_json) {
  Event event{std::string(name), category, start_us,
              end_us > start_us ? end_us - start_us : 0, tid, std::move(args_json)};
  absl::MutexLock lock(&mu_);
  ++recorded_;
  if (ring_.size() < options_.max_events) {
    ring_.push_back(std::move(event));
    return;
  }
  ring_[next_] = std::move(event);  // the old event is freed under the lock: short strings
  next_ = (next_ + 1) % ring_.size();
}

uint32_t Recorder::ThreadTrack() {
  thread_local const uint32_t tid = static_cast<uint32_t>(syscall(SYS_gettid));
  return tid;
}

void Recorder::NameTrack(uint32_t tid, absl::string_view name) {
  absl::MutexLock lock(&mu_);
  track_names_.emplace(tid, std::string(name));
}

int64_t Recorder::MonotonicMicrosOf(absl::Time wall) const {
  return absl::ToUnixMicros(wall) - start_unix_us_ + start_monotonic_us_;
}

uint64_t Recorder::recorded() const {
  absl::MutexLock lock(&mu_);
  return recorded_;
}

uint64_t Recorder::dropped() const {
  absl::MutexLock lock(&mu_);
  return recorded_ - ring_.size();
}

std::string Recorder::ToJson() const {
  std::vector<Event> events;
  std::map<uint32_t, std::string> tracks;
  uint64_t dropped = 0;
  {
    absl::MutexLock lock(&mu_);
    events.reserve(ring_.size());
    for (size_t i = 0; i < ring_.size(); ++i) events.push_back(ring_[(next_ + i) % ring_.size()]);
    tracks = track_names_;
    dropped = recorded_ - ring_.size();
  }
  std::string out = "{\"traceEvents\":[\n";
  absl::StrAppend(&out, "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":", pid_,
                  ",\"tid\":0,\"args\":{\"name\":", JsonString(options_.process_name), "}}");
  for (const auto& [tid, name] : tracks) {
    absl::StrAppend(&out, ",\n{\"ph\":\"M\",\"name\":\"thread_name\",\"pid\":", pid_,
                    ",\"tid\":", tid, ",\"args\":{\"name\":", JsonString(name), "}}");
  }
  for (const Event& e : events) {
    absl::StrAppend(&out, ",\n{\"ph\":\"X\",\"name\":", JsonString(e.name),
                    ",\"cat\":", JsonString(e.category), ",\"ts\":", e.start_us,
                    ",\"dur\":", e.duration_us, ",\"pid\":", pid_, ",\"tid\":", e.tid);
    if (!e.args_json.empty()) absl::StrAppend(&out, ",\"args\":", e.args_json);
    out += "}";
  }
  absl::StrAppend(&out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"clock\":\"CLOCK_MONOTONIC\"",
                  ",\"process_name\":", JsonString(options_.process_name), ",\"pid\":", pid_,
                  ",\"start_monotonic_us\":", start_monotonic_us_,
                  ",\"start_unix_us\":", start_unix_us_, ",\"max_events\":", options_.max_events,
                  ",\"dropped_events\":", dropped, "}}\n");
  return out;
}

absl::Status Recorder::Flush() {
  absl::MutexLock lock(&flush_mu_);
  const std::string json = ToJson();
  const std::string temporary = options_.path + ".tmp";
  std::FILE* file = std::fopen(temporary.c_str(), "w");
  if (file == nullptr) {
    return absl::InternalError(
        absl::StrCat("trace: cannot write ", temporary, ": ", std::strerror(errno)));
  }
  const bool written = std::fwrite(json.data(), 1, json.size(), file) == json.size();
  const bool closed = std::fclose(file) == 0;
  if (!written || !closed || std::rename(temporary.c_str(), options_.path.c_str()) != 0) {
    const std::string error = std::strerror(errno);
    std::remove(temporary.c_str());
    return absl::InternalError(absl::StrCat("trace: cannot write ", options_.path, ": ", error));
  }
  return absl::OkStatus();
}

uint32_t Lanes::Place(Recorder& recorder, int64_t start_us, int64_t end_us) {
  size_t lane = 0;
  {
    absl::MutexLock lock(&mu_);
    while (lane < last_end_.size() && last_end_[lane] > start_us) ++lane;
    if (lane == last_end_.size()) {
      if (last_end_.size() < max_lanes_) {
        last_end_.push_back(end_us);
        recorder.NameTrack(base_ + static_cast<uint32_t>(lane),
                           lane == 0 ? name_ : absl::StrCat(name_, " #", lane + 1));
        return base_ + static_cast<uint32_t>(lane);
      }
      lane = std::min_element(last_end_.begin(), last_end_.end()) - last_end_.begin();
    }
    last_end_[lane] = std::max(last_end_[lane], end_us);
  }
  return base_ + static_cast<uint32_t>(lane);
}

absl::StatusOr<std::unique_ptr<Recorder>> OpenFromPathOrEnvironment(absl::string_view path,
                                                                    const char* variable,
                                                                    std::string process_name,
                                                                    size_t max_events) {
  RecorderOptions options;
  options.path = std::string(path);
  options.process_name = std::move(process_name);
  if (max_events != 0) options.max_events = max_events;
  if (options.path.empty()) {
    const char* named = std::getenv(variable);
    if (named == nullptr || *named == '\0') return nullptr;
    options.path = named;
    const std::string max_variable = absl::StrCat(variable, "_MAX_EVENTS");
    if (const char* max = std::getenv(max_variable.c_str()); max != nullptr && *max != '\0') {
      uint64_t n = 0;
      if (!absl::SimpleAtoi(max, &n) || n == 0) {
        return absl::InvalidArgumentError(
            absl::StrCat(max_variable, "='", max, "' is not a positive integer"));
      }
      options.max_events = n;
    }
  }
  return Recorder::Open(options);
}

}  // namespace trace
}  // namespace pserver
