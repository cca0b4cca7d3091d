// FrameDeadlines: a bound on how long one bulk channel frame may take to
// arrive. A client that sends a frame header promising N payload bytes and
// then stalls would otherwise hold those N bytes of the request budget
// (--max_bulk_request_bytes_in_flight) and its connection's thread forever.
//
//   FrameDeadlines deadlines(absl::Seconds(60), /*on_expired=*/nullptr);
//   {
//     FrameDeadlines::Armed armed = deadlines.Arm(&socket);  // now + 60 s
//     PS_RETURN_IF_ERROR(stream.Read(payload, n));           // fails once shut down
//   }                                                         // disarmed here
//
// One thread waits for the earliest deadline armed; when one passes it shuts
// that connection's socket down (ByteStream::Shutdown, as a network failure
// would), which makes the blocked read fail whatever stream is layered on
// the socket (TLS records, the AEAD layer), and counts it (expired(), and
// `on_expired`). A zero or infinite timeout turns it off: Arm does nothing
// and no thread is started. The thread wakes when a deadline passes or,
// when nothing was armed, at the next Arm: not at every frame.
//
// Thread-safe. An Armed must be disarmed (or destroyed) before its stream.
#ifndef PSERVER_CC_SERVER_FRAME_DEADLINES_H_
#define PSERVER_CC_SERVER_FRAME_DEADLINES_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/rpc/byte_stream.h"

namespace pserver {

class FrameDeadlines {
 public:
  // `on_expired` (may be null) is called, under a lock, for each stream
  // shut down; it must not call back into this object.
  FrameDeadlines(absl::Duration timeout, std::function<void()> on_expired);
  ~FrameDeadlines();  // stops the thread; nothing may be armed any more
  FrameDeadlines(const FrameDeadlines&) = delete;
  FrameDeadlines& operator=(const FrameDeadlines&) = delete;

  // A deadline armed for one stream, disarmed by Disarm or the destructor.
  class Armed {
   public:
    Armed() = default;
    Armed(Armed&& other) noexcept;
    Armed& operator=(Armed&& other) noexcept;
    ~Armed() { Disarm(); }
    // Idempotent. Once it returns the stream is not shut down for this
    // deadline (it may have been already).
    void Disarm();

   private:
    friend class FrameDeadlines;
    Armed(FrameDeadlines* owner, uint64_t id) : owner_(owner), id_(id) {}
    FrameDeadlines* owner_ = nullptr;
    uint64_t id_ = 0;
  };

  // `stream` is shut down unless disarmed within the timeout from now.
  Armed Arm(ByteStream* stream) ABSL_LOCKS_EXCLUDED(mu_);

  bool enabled() const { return enabled_; }
  absl::Duration timeout() const { return timeout_; }
  // Streams shut down because their deadline passed.
  uint64_t expired() const { return expired_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    absl::Time deadline;
    ByteStream* stream;
  };
  void Disarm(uint64_t id) ABSL_LOCKS_EXCLUDED(mu_);
  void Loop() ABSL_LOCKS_EXCLUDED(mu_);
  // The waiting thread's wake-up while nothing is armed.
  bool ArmedOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !armed_.empty();
  }

  const absl::Duration timeout_;
  const bool enabled_;
  const std::function<void()> on_expired_;
  std::atomic<uint64_t> expired_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<uint64_t, Entry> armed_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

}  // namespace pserver

#endif  // PSERVER_CC_SERVER_FRAME_DEADLINES_H_
