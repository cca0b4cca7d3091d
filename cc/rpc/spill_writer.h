// FrameWriter: writes one frame while it is still being produced, never
// waiting for the peer until Finish. SpillWriter is the one on a plain
// socket; AeadStream::StartFrame (cc/security/bulk_aead.h) the one that
// seals for the bulk channel's AEAD layer.
//
// SpillWriter: writes a frame to a socket while the frame is still being
// produced, never waiting for the peer until Finish.
//
//   SpillWriter out(&socket);
//   out.Add(header);            // sent now as far as the socket takes it
//   out.Add(block);             // (under a lock: Add never waits)
//   PS_RETURN_IF_ERROR(out.Finish());   // waits for the rest to go out
//
// Add sends what the socket's send buffer takes at once and copies the rest
// (the "spill"); later Adds send the spill first, so bytes go out in order.
// A caller may therefore Add from memory that may change once Add returns
// (a parameter under its read lock): no pointer to it is kept. The spill
// holds at most the bytes added, which the caller bounds (a reply budget).
//
// Not thread-safe: one producer.
#ifndef PSERVER_CC_RPC_SPILL_WRITER_H_
#define PSERVER_CC_RPC_SPILL_WRITER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "cc/rpc/byte_stream.h"

namespace pserver {

class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  // Writes `bytes` after everything added before, as far as the stream
  // takes them now, and keeps the rest (a copy: no pointer to `bytes` is
  // kept); never waits for the peer. After a write error, does nothing
  // (Finish returns the error).
  virtual void Add(absl::string_view bytes) = 0;
  // Writes what is left, waiting for the peer. The first write error.
  virtual absl::Status Finish() = 0;
  // Bytes added so far.
  virtual uint64_t added() const = 0;
};

// Starts the writer of one frame of `frame_bytes` bytes whose first
// `head_bytes` are its header (a record layer cuts its records there, as a
// Write of {header, rest} would); null: the stream cannot write a frame so.
using StartFrameFn =
    absl::FunctionRef<std::unique_ptr<FrameWriter>(uint64_t head_bytes, uint64_t frame_bytes)>;

class SpillWriter final : public FrameWriter {
 public:
  // `socket` must outlive the writer.
  explicit SpillWriter(SocketStream* socket) : socket_(socket) {}
  SpillWriter(const SpillWriter&) = delete;
  SpillWriter& operator=(const SpillWriter&) = delete;

  // Sends `bytes` after everything added before, as far as the socket
  // takes them now; copies the rest. After a write error, does nothing
  // (Finish returns the error).
  void Add(absl::string_view bytes) override;
  // Writes what is left, waiting for the peer. The first write error.
  absl::Status Finish() override;

  uint64_t added() const override { return added_; }
  // Bytes copied into the spill so far (not sent when added).
  uint64_t spilled() const { return spilled_; }

 private:
  SocketStream* const socket_;
  std::string spill_;       // bytes added, not yet sent, from spill_begin_
  size_t spill_begin_ = 0;
  uint64_t added_ = 0;
  uint64_t spilled_ = 0;
  absl::Status status_;
};

}  // namespace pserver

#endif  // PSERVER_CC_RPC_SPILL_WRITER_H_
