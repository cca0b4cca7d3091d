// Checkpoints: one shard's parameters, optimizer state and extensions as a
// directory of checksummed files that survives crashes at any point.
//
//   // Saving (the server's checkpoint scheduler):
//   StoreSnapshot snapshot = store.Snapshot();
//   PS_ASSIGN_OR_RETURN(CheckpointInfo info,
//                       SaveCheckpoint(snapshot, dir, shard, sequence));
//   ... publish info to etcd /checkpoints/<shard> ...
//   PS_RETURN_IF_ERROR(PruneCheckpoints(dir, /*keep=*/3).status());
//
//   // Restarting:
//   PS_ASSIGN_OR_RETURN(LoadedCheckpoint loaded, LoadLatestCheckpoint(dir));
//   PS_RETURN_IF_ERROR(store.Restore(std::move(loaded.snapshot)));
//
// Layout: <dir>/ckpt-<sequence as 20 digits>/ holds MANIFEST (a
// v1::CheckpointManifest framed as "PSCKPT01" | length | crc32c | proto) and
// data files data-00000.bin, data-00001.bin, ... into which every block's
// content, optimizer slot and extension is appended, each checksummed with
// CRC32C per chunk of at most 4 MiB. docs/checkpoint-format.md has the bytes.
//
// Saving writes into <dir>/.tmp-ckpt-<sequence>-<random>, fsyncs every file
// and that directory, renames it to its final name and fsyncs <dir>: a crash
// leaves either no new checkpoint or a complete one. Readers ignore
// .tmp-ckpt-* directories; the next save removes them. Old checkpoints are
// deleted only by PruneCheckpoints, which the caller runs after publishing.
//
// Files and modes: every file a checkpoint is read from must be a regular
// file (never a FIFO, device or symbolic link: they are refused with
// DATA_LOSS naming the file, and opening never blocks); the checkpoint
// directories the writer creates are real directories, and ListCheckpoints
// ignores ckpt-* symbolic links. A directory a caller names (`dir`, `path`)
// may itself be a symbolic link. Files are written with
// CheckpointWriteOptions::file_mode (0600 by default: they hold the model)
// and the directories created with CheckpointDirMode(file_mode) (0700).
//
// Errors: every integrity failure (a checksum, a size, a truncated, missing or
// garbled file) is DATA_LOSS with a message that starts with
// kChecksumValidationFailed and names the file, e.g.
// "checkpoint file checksum validation failed: /ckpt/ckpt-…07/data-00000.bin
// chunk 3: crc32c is 0x1a2b3c4d, the manifest says 0x5e6f7a8b". Nothing here
// aborts on bad files.
//
// Functions are thread-safe; a CheckpointReader's const methods may be called
// from several threads. Two saves into one directory at once are not
// supported (one writer per shard).
#ifndef PSERVER_CC_CORE_CHECKPOINT_H_
#define PSERVER_CC_CORE_CHECKPOINT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"
#include "cc/core/parameter_store.h"
#include "pserver/v1/checkpoint.pb.h"

namespace pserver {

inline constexpr char kChecksumValidationFailed[] =
    "checkpoint file checksum validation failed";
inline constexpr uint32_t kCheckpointFormatVersion = 1;
inline constexpr uint32_t kCheckpointMaxChunkSize = 4u << 20;  // 4 MiB
inline constexpr char kManifestMagic[] = "PSCKPT01";           // 8 bytes, no NUL
inline constexpr size_t kManifestHeaderSize = 16;  // magic, length, crc32c
inline constexpr char kManifestFileName[] = "MANIFEST";
inline constexpr uint32_t kDefaultCheckpointFileMode = 0600;

// The mode of a directory holding files of `file_mode`: each class that may
// read the files may also enter the directory (0600 -> 0700, 0640 -> 0750).
uint32_t CheckpointDirMode(uint32_t file_mode);

// Parses an octal file mode such as "0600" or "640" (pserver
// --checkpoint_mode). INVALID_ARGUMENT unless it is octal, has only
// permission bits of 0666 (no execute, setuid or sticky bits) and lets the
// owner read and write (0600).
absl::StatusOr<uint32_t> ParseCheckpointFileMode(absl::string_view octal);
// The same check of a mode already parsed.
absl::Status CheckCheckpointFileMode(uint32_t mode);

// Creates `dir` (and missing parents, with CheckpointDirMode(file_mode)) and
// proves it writable: writes, fsyncs and removes a probe file in it. An error
// names `dir` and why (e.g. "not a directory", "read-only file system").
absl::Status CheckWritableDirectory(const std::string& dir,
                                    uint32_t file_mode = kDefaultCheckpointFileMode);

// What a caller publishes about a saved checkpoint (etcd /checkpoints/<idx>).
struct CheckpointInfo {
  std::string path;              // the checkpoint directory
  uint32_t shard = 0;
  uint64_t sequence = 0;
  uint32_t manifest_crc32c = 0;  // CRC32C of the manifest's proto bytes
  absl::Time time;               // when it was written
  std::string cluster;           // CheckpointWriteOptions::cluster
  uint32_t num_servers = 0;      // CheckpointWriteOptions::num_servers
  uint64_t epoch = 0;            // CheckpointWriteOptions::epoch
  // The placement the checkpoint was written for: the manifest's, or for one
  // written before placements were recorded, MODULO over num_servers.
  v1::Placement placement;
};

struct CheckpointWriteOptions {
  // Bytes per checksummed chunk, 1 .. kCheckpointMaxChunkSize.
  uint32_t chunk_size = kCheckpointMaxChunkSize;
  // A data file is closed and the next one started once appending an item
  // would take it past this size; an item is never split over files.
  uint64_t max_data_file_bytes = uint64_t{1} << 30;
  // Creation time written into the manifest; InfinitePast means absl::Now().
  absl::Time time = absl::InfinitePast();
  // Permission bits of every file written (see ParseCheckpointFileMode);
  // directories created get CheckpointDirMode(file_mode). Applied exactly,
  // whatever the umask.
  uint32_t file_mode = kDefaultCheckpointFileMode;
  // Recorded in the manifest: the cluster and its server count (0: unknown).
  std::string cluster;
  uint32_t num_servers = 0;
  // Recorded in the manifest: the shard epoch (etcd /shards/<shard>) of the
  // server writing it; 0: none. Loading and pruning order by (epoch,
  // sequence).
  uint64_t epoch = 0;
  // Recorded in the manifest: the placement the shard's data is laid out
  // for. Its num_servers is set to num_servers; its kind is JUMP unless set.
  v1::Placement placement;
};

// fsyncs directory `dir`, so that the entries created or renamed in it are
// durable. I/O errors as their errno's code, naming `dir`.
absl::Status SyncDirectory(const std::string& dir);

// "ckpt-00000000000000000042" for sequence 42.
std::string CheckpointDirName(uint64_t sequence);

// Writes `snapshot` as <dir>/ckpt-<sequence> (creating `dir` if needed) and
// removes leftover .tmp-ckpt-* directories of earlier crashed saves. On
// return the checkpoint is durable. ALREADY_EXISTS if that checkpoint exists;
// INVALID_ARGUMENT for bad options or a snapshot with duplicate blocks or
// unnamed extensions; I/O errors as their errno's code, naming the path.
// On any error nothing new is left under a ckpt-* name.
absl::StatusOr<CheckpointInfo> SaveCheckpoint(const StoreSnapshot& snapshot,
                                              const std::string& dir, uint32_t shard,
                                              uint64_t sequence,
                                              const CheckpointWriteOptions& options = {});

// One file of a checkpoint held in memory: its name in the checkpoint
// directory and its bytes.
struct CheckpointFile {
  std::string name;
  std::string content;
};

// The files SaveCheckpoint would write into <dir>/ckpt-<sequence>, byte for
// byte (given the same options.time), produced in memory: nothing touches
// the disk. Data files first, in order, then MANIFEST. INVALID_ARGUMENT as
// SaveCheckpoint.
absl::StatusOr<std::vector<CheckpointFile>> CheckpointToMemory(
    const StoreSnapshot& snapshot, uint32_t shard, uint64_t sequence,
    const CheckpointWriteOptions& options = {});

struct CheckpointEntry {
  std::string path;
  uint64_t sequence = 0;
  uint64_t epoch = 0;  // ListCheckpointsInLoadOrder only: the manifest's (0: none or unreadable)
};

// The ckpt-<20 digits> directories in `dir`, oldest first, read from their
// names alone (nothing is verified; symbolic links are not listed). Empty if
// `dir` does not exist; FAILED_PRECONDITION if it is not a directory.
absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir);

// ListCheckpoints, each with the epoch its MANIFEST records, ordered by
// (epoch, sequence), oldest first: a stale server's checkpoint (an older
// epoch) comes before every one of the current holder's, whatever its
// sequence. A checkpoint whose MANIFEST does not open counts as epoch 0.
// Checkpoints without an epoch (older ones, or no etcd) are epoch 0, so
// among themselves they keep their sequence order.
absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpointsInLoadOrder(const std::string& dir);

// Deletes all but the newest `keep` (>= 1) checkpoints in `dir`, newest in
// ListCheckpointsInLoadOrder's order, and returns the paths it deleted. Call
// it only after the newest one is published. Checkpoints whose path is in
// `spare` are never deleted (a server keeps the newest of the previous
// placement, which servers of the new one still starting reshard from).
absl::StatusOr<std::vector<std::string>> PruneCheckpoints(
    const std::string& dir, size_t keep, const std::vector<std::string>& spare = {});

// Reads one checkpoint. Open reads and checks the manifest only; data is
// read, and its chunks verified, when asked for.
class CheckpointReader {
 public:
  // NOT_FOUND if `path` does not exist; DATA_LOSS if its MANIFEST is missing,
  // fails its checksum or is inconsistent; FAILED_PRECONDITION for a format
  // version this reader does not know.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(const std::string& path);

  const std::string& path() const { return path_; }
  const v1::CheckpointManifest& manifest() const { return manifest_; }
  CheckpointInfo info() const { return info_; }

  // Index into manifest().parameters() of a block; NOT_FOUND if absent.
  absl::StatusOr<int> FindParameter(absl::string_view name, uint32_t block_index = 0) const;

  // The bytes `ref` points at, every chunk verified.
  absl::StatusOr<std::string> ReadData(const v1::DataRef& ref) const;

  // manifest().parameters(index) with its content and optimizer state.
  absl::StatusOr<BlockSnapshot> ReadBlock(int index) const;

  // Everything, every chunk verified.
  absl::StatusOr<StoreSnapshot> ReadAll() const;

  // Verifies every data file's size and every chunk, holding one chunk in
  // memory at a time.
  absl::Status Verify() const;

 private:
  CheckpointReader() = default;

  std::string path_;
  v1::CheckpointManifest manifest_;
  CheckpointInfo info_;
};

// A checkpoint read back whole.
struct SkippedCheckpoint {
  std::string path;
  uint64_t sequence = 0;
  absl::Status status;  // why it was not used
};
struct LoadedCheckpoint {
  CheckpointInfo info;
  StoreSnapshot snapshot;
  // LoadLatestCheckpoint: the newer checkpoints that failed, newest first.
  std::vector<SkippedCheckpoint> skipped;
};

// Reads the checkpoint at `path` (a ckpt-* directory), verifying every checksum.
absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path);

// Verifies the checkpoint at `path` without keeping its data in memory.
absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& path);

// Loads the newest checkpoint in `dir` (ListCheckpointsInLoadOrder: by
// epoch, then sequence) that reads back whole, skipping (and listing in
// `skipped`) newer ones that fail. NOT_FOUND if `dir` holds no
// checkpoint; DATA_LOSS naming each one and its error if none is good.
absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir);

}  // namespace pserver

#endif  // PSERVER_CC_CORE_CHECKPOINT_H_
