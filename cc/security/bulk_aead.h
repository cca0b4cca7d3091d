// The bulk channel's AEAD record layer: after the TLS handshake, two pserver
// ends that both offer it (OpenChannelResponse.bulk_aead, the in-band switch
// in cc/security/tls_byte_stream.cc) seal their bulk bytes with AES-128-GCM
// from Intel's ipsec-mb (its AVX-512/VAES code where the CPU has it) instead
// of TLS records, keyed per direction from the TLS exporter
// (RFC 8446 7.5). Design and threat analysis: docs/security.md.
//
// A record on the wire:
//   header (8 bytes): plaintext length (4, little-endian, 1..kMaxAeadRecordBytes),
//                     type (1 byte, 1: data), 3 zero bytes
//   ciphertext (length bytes), tag (16 bytes)
// The header is the AAD; the 96-bit nonce is the direction's 4-byte prefix
// and the record's 64-bit counter (big-endian), never sent: a replayed,
// reordered or dropped record fails its tag. Any failure (tag, header, a
// connection ending inside a record) closes the stream for good.
//
// Read returns only bytes from records whose tag checked; a record that fits
// in what Read still wants is decrypted in place in the caller's buffer
// (zeroed again when its tag fails), a larger one goes through a buffer of
// at most kMaxAeadRecordBytes. A large record is received in pieces of at
// most 256 KiB, each decrypted while it is in the cache; its last piece
// takes its tag and the next header in the same recvmsg(). (SO_RCVLOWAT,
// set to what a record still owed, was tried and dropped: fewer recv calls,
// no CPU saved, bench/RESULTS.md.)
// Write seals its first part (a frame's header) in records of its own and
// the other parts together in records of kSealRecordBytes (the last one
// shorter; a record may span parts), so that a frame's payload starts a
// record and a reader that takes it in kSealRecordBytes pieces decrypts
// every record where it lands (buffered_record_bytes() stays 0); it seals
// through a send buffer of 1 MiB + 64 KiB, sent once per Write when the
// frame fits.
#ifndef PSERVER_CC_SECURITY_BULK_AEAD_H_
#define PSERVER_CC_SECURITY_BULK_AEAD_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/spill_writer.h"

namespace pserver {

inline constexpr size_t kAeadKeyBytes = 16;        // AES-128
inline constexpr size_t kAeadNoncePrefixBytes = 4;  // + 8 bytes of counter
inline constexpr size_t kAeadHeaderBytes = 8;
inline constexpr size_t kAeadTagBytes = 16;
inline constexpr size_t kMaxAeadRecordBytes = 1 << 20;
// The records a writer makes: at most 256 KiB, the piece the bulk listener
// reads a large push in (kScanChunkBytes), so that each of its reads takes
// whole records, decrypted where they land.
inline constexpr size_t kSealRecordBytes = 256 << 10;
// Bytes one direction of one connection may seal: 2^38 (256 GiB), 2^34
// AES blocks, which keeps AES-GCM's confidentiality bound under 2^-60
// (the margin RFC 8446 5.5 keeps for TLS). Past it the writer fails and
// the client opens a new connection (new keys); the counter (2^64) cannot
// come near wrapping before.
inline constexpr uint64_t kMaxAeadBytesPerKey = uint64_t{1} << 38;

// One direction's key material.
struct AeadKeys {
  uint8_t key[kAeadKeyBytes] = {};
  uint8_t nonce_prefix[kAeadNoncePrefixBytes] = {};
};

// Whether ipsec-mb found AES-NI on this CPU (IMB_ARCH SSE, AVX, AVX2 or
// AVX512); without it pserver neither offers nor asks for the AEAD layer and
// the bulk channel stays on TLS records.
bool BulkAeadAvailable();
// The ipsec-mb code in use: "avx512", "avx2", "avx", "sse" or "none".
std::string BulkAeadArch();

// Waits until `fd` is ready for `events` (poll) or `deadline`
// (InfiniteFuture: no limit). False on timeout.
bool WaitForSocket(int fd, short events, absl::Time deadline);
// The deadline a blocking read on `fd` would have (SO_RCVTIMEO; none: InfiniteFuture).
absl::Time SocketReceiveDeadline(int fd);

class SealedFrameWriter;

// The record layer on connected, non-blocking socket `fd` (not owned: the
// caller closes it after this is gone). One thread may write while another
// reads; Shutdown may be called from any thread.
class AeadStream final : public ByteStream {
 public:
  AeadStream(int fd, const AeadKeys& send, const AeadKeys& receive);
  ~AeadStream() override;
  AeadStream(const AeadStream&) = delete;
  AeadStream& operator=(const AeadStream&) = delete;

  absl::Status Write(absl::Span<const absl::string_view> parts) override;
  absl::Status Read(char* dest, size_t n) override;
  void Shutdown() override;

  // A frame of `frame_bytes` written while it is produced (FrameWriter,
  // cc/rpc/spill_writer.h; the streamed PushPull reply,
  // cc/server/streamed_push_pull.h), cut into records exactly as
  // Write({its first head_bytes, the rest}) cuts them. Each Add seals its
  // bytes and sends what the socket takes now; the rest stays sealed (at
  // most the frame with its records' headers and tags) until a later Add
  // or Finish, so Add never waits for the peer. A record's ciphertext may
  // go out before its tag: the reader returns none of it before the tag
  // checks. The writing side is the writer's until it is gone (no Write
  // meanwhile, on this thread or another); one gone before its whole frame
  // was sent, or given more than `frame_bytes`, closes the stream.
  std::unique_ptr<FrameWriter> StartFrame(uint64_t head_bytes, uint64_t frame_bytes);

  // Bytes of records larger than what the Read that met them still wanted:
  // those are decrypted in a buffer and copied out, not decrypted in place.
  uint64_t buffered_record_bytes() const { return buffered_record_bytes_.load(); }

 private:
  friend class SealedFrameWriter;
  struct Direction;  // key schedule, counter, bytes sealed

  // Seals the bytes of `parts`, one after another, in records of at most
  // kSealRecordBytes (a record may span parts).
  absl::Status SealParts(absl::Span<const absl::string_view> parts)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // A record of `size` bytes: its header, then SealBytes until `size` bytes
  // are sealed, then its tag.
  absl::Status BeginRecord(size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status SealBytes(const char* data, size_t size) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status EndRecord() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  absl::Status SendBuffered() ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Writes the header of a record of `size` bytes at `header` and starts
  // sealing it (the next nonce). An error: the key sealed all it may.
  absl::Status StartRecord(size_t size, char* header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(write_mu_);
  // Opens the next record: into `dest` when it fits in `wanted` (*placed:
  // its size), else into plain_. *started: some of its header was taken.
  absl::Status OpenRecord(char* dest, size_t wanted, absl::Time deadline, size_t* placed,
                          bool* started) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  // Receives exactly `size` bytes into `out` (from the read-ahead buffer,
  // then the socket); `decrypt`: each piece is decrypted in place as it
  // lands. *received (when set): the bytes taken before an error.
  absl::Status Receive(char* out, size_t size, absl::Time deadline, bool decrypt,
                       size_t* received = nullptr) ABSL_EXCLUSIVE_LOCKS_REQUIRED(read_mu_);
  absl::Status Fail(absl::Status why);

  const int fd_;
  std::atomic<bool> shut_down_{false};
  std::atomic<bool> broken_{false};
  std::atomic<uint64_t> buffered_record_bytes_{0};

  absl::Mutex write_mu_;
  std::unique_ptr<Direction> send_ ABSL_GUARDED_BY(write_mu_);
  // The send buffer (not zeroed: pages an idle stream never fills stay unused).
  const std::unique_ptr<char[]> out_ ABSL_GUARDED_BY(write_mu_);
  size_t out_used_ ABSL_GUARDED_BY(write_mu_) = 0;

  absl::Mutex read_mu_;
  std::unique_ptr<Direction> receive_ ABSL_GUARDED_BY(read_mu_);
  std::vector<char> in_ ABSL_GUARDED_BY(read_mu_);  // socket read-ahead
  size_t in_begin_ ABSL_GUARDED_BY(read_mu_) = 0;
  size_t in_end_ ABSL_GUARDED_BY(read_mu_) = 0;
  std::vector<char> plain_ ABSL_GUARDED_BY(read_mu_);  // a verified record Read has not taken
  size_t plain_begin_ ABSL_GUARDED_BY(read_mu_) = 0;
  size_t plain_end_ ABSL_GUARDED_BY(read_mu_) = 0;
};

}  // namespace pserver

#endif  // PSERVER_CC_SECURITY_BULK_AEAD_H_
