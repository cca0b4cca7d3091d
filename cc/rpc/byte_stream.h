// ByteStream: the one small interface the bulk channel (cc/rpc/frame.h) runs
// on, so that another stream (TLS, a later issue) can wrap or replace the
// plain socket. SocketStream is a connected TCP or Unix socket.
//
//   PS_ASSIGN_OR_RETURN(auto stream, ConnectTcp("10.0.0.2", 7001, absl::Seconds(5)));
//   PS_RETURN_IF_ERROR(stream->Write({header, payload}));
//   PS_RETURN_IF_ERROR(stream->Read(reply, sizeof(reply)));
//
// Write and Read block. One thread may write while another reads; Shutdown
// may be called from any thread and makes blocked and later calls fail
// (UNAVAILABLE).
#ifndef PSERVER_CC_RPC_BYTE_STREAM_H_
#define PSERVER_CC_RPC_BYTE_STREAM_H_

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace pserver {

class ByteStream {
 public:
  virtual ~ByteStream() = default;
  // Writes every part, in order. UNAVAILABLE when the stream is broken.
  virtual absl::Status Write(absl::Span<const absl::string_view> parts) = 0;
  // Reads exactly `n` bytes. UNAVAILABLE at the end of the stream or when
  // broken.
  virtual absl::Status Read(char* dest, size_t n) = 0;
  // Ends the stream for both directions; blocked calls return.
  virtual void Shutdown() = 0;
};

// Spinning before a small read blocks: a reader that expects its peer to
// answer within microseconds (a 4 KiB round trip) polls the socket for up to
// `most` before it sleeps, so that the answer does not also wait for the
// wake-up of a sleeping thread (on these virtual machines often tens of
// microseconds; the tail of a small round trip). Bounded three ways: at most
// `most` per read; only while the machine's runnable threads do not exceed
// its cores (`cores_idle`: /proc/loadavg, read at most once a millisecond
// per process), so it never takes a core another thread wants; and after two
// spins in a row that ended with nothing to read (an idle peer, a long
// call), the next 1, 2, 4 ... 256 reads do not spin.
struct ReadSpin {
  absl::Duration most = absl::ZeroDuration();  // 0: never spin
  // Whether a core is free for spinning now; null: RunnableThreadsFitCores.
  std::function<bool()> cores_idle;
};

// Whether this machine's runnable threads (this one included) do not exceed
// its cores, from /proc/loadavg read at most once a millisecond (a cached
// answer in between). false when it cannot be read.
bool RunnableThreadsFitCores();
// Whether /proc/loadavg's `text` says at most `cores` threads are runnable.
bool LoadavgFitsCores(absl::string_view text, long cores);

// Owns a connected stream socket; reads go through a small buffer so that a
// frame's header and a small payload cost one system call.
class SocketStream final : public ByteStream {
 public:
  explicit SocketStream(int fd);
  ~SocketStream() override;
  SocketStream(const SocketStream&) = delete;
  SocketStream& operator=(const SocketStream&) = delete;

  absl::Status Write(absl::Span<const absl::string_view> parts) override;
  absl::Status Read(char* dest, size_t n) override;
  void Shutdown() override;
  // Writes, in order, as much of `parts` as the socket takes without
  // waiting; the bytes written (0 when its send buffer is full).
  // UNAVAILABLE when the stream is broken.
  absl::StatusOr<size_t> WriteSome(absl::Span<const absl::string_view> parts);

  int fd() const { return fd_; }

  // Spins as `spin` says before a read that would block (small reads only:
  // a frame's header and small payloads; not while a large payload streams
  // in). Call before the stream is shared.
  void SpinBeforeBlocking(ReadSpin spin);

  struct SpinStats {
    uint64_t hits = 0;     // bytes came while spinning
    uint64_t misses = 0;   // spun `most`, then slept
    uint64_t backed_off = 0;  // reads that did not spin after misses
    uint64_t busy = 0;     // reads that did not spin: no core free
  };
  // Read by the thread that reads (or once reads are over).
  const SpinStats& spin_stats() const { return spin_stats_; }

 private:
  static constexpr size_t kBufferBytes = 64 << 10;
  // recv(2) of up to `n` bytes; spins first when `may_spin` and the spin
  // policy allow.
  ssize_t Receive(char* into, size_t n, bool may_spin);
  bool ShouldSpin();

  const int fd_;
  std::vector<char> buffer_;
  size_t begin_ = 0;
  size_t end_ = 0;
  ReadSpin spin_;
  int misses_in_row_ = 0;
  int back_off_ = 1;    // reads to skip after the next misses
  int skip_left_ = 0;   // reads still to skip
  SpinStats spin_stats_;
};

// The send and receive buffers asked for on every bulk channel socket
// (SO_SNDBUF/SO_RCVBUF, best effort: the kernel caps them at
// net.core.wmem_max/rmem_max). With the 208 KiB default a 1 MiB frame
// blocks its writer four times, and each time the reader has to be woken to
// drain it; with 4 MiB a frame of up to a few MiB is one write and one read.
inline constexpr int kSocketBufferBytes = 4 << 20;
// Asks for kSocketBufferBytes on `fd` (before connect or listen for TCP, so
// that the window scale covers it).
void SetSocketBuffers(int fd);

// Connects to `host` (name or address) and `port` within `timeout`, with
// Nagle's delay off. UNAVAILABLE naming the address and the cause.
absl::StatusOr<std::unique_ptr<ByteStream>> ConnectTcp(const std::string& host, int port,
                                                       absl::Duration timeout);
// Whether a TCP connection to gRPC target `target` ("host:port",
// "[v6]:port") is refused now: every address of the host answered that
// nothing listens on that port (a process that died on a live host). false
// when a connection opens (it is closed at once) or fails otherwise (a
// timeout after `timeout`: a silent host proves nothing). INVALID_ARGUMENT
// for a target that is not host:port; UNAVAILABLE when the name does not resolve.
absl::StatusOr<bool> TcpConnectionRefused(absl::string_view target, absl::Duration timeout);
// Connects to the abstract Unix socket `name` (Linux; the name carries no
// leading NUL). UNAVAILABLE when nothing listens there in this network
// namespace.
absl::StatusOr<std::unique_ptr<ByteStream>> ConnectAbstractUnix(const std::string& name);

// Listening sockets (blocking accept); the caller closes the descriptor.
// `*port` 0 picks a free port and is set to the one bound.
absl::StatusOr<int> ListenTcp(const std::string& host, int* port);
absl::StatusOr<int> ListenAbstractUnix(const std::string& name);

// The host part of a gRPC target "host:port" / "[v6]:port"; "" for a Unix
// target ("unix:...") or one without a port.
std::string TargetHost(absl::string_view target);

}  // namespace pserver

#endif  // PSERVER_CC_RPC_BYTE_STREAM_H_
