#include "cc/core/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <system_error>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "cc/core/crc32c.h"
#include "cc/core/status_macros.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

constexpr char kCheckpointPrefix[] = "ckpt-";
constexpr char kTempPrefix[] = ".tmp-ckpt-";
constexpr size_t kSequenceDigits = 20;

// ---- paths and errors ---------------------------------------------------------

std::string JoinPath(const std::string& dir, absl::string_view name) {
  if (dir.empty()) return std::string(name);
  if (dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

absl::Status IoError(int error, absl::string_view what, const std::string& path) {
  return absl::ErrnoToStatus(error, absl::StrCat(what, " ", path));
}

absl::Status FsError(const std::error_code& ec, absl::string_view what,
                     const std::string& path) {
  return IoError(ec.value(), what, path);
}

// Every integrity failure of a checkpoint's files reads the same way.
absl::Status Corrupt(const std::string& file, absl::string_view detail) {
  return absl::DataLossError(absl::StrCat(kChecksumValidationFailed, ": ", file, ": ", detail));
}

std::string Hex32(uint32_t value) { return absl::StrFormat("0x%08x", value); }

// ---- file descriptors -----------------------------------------------------------

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  Fd(Fd&& other) noexcept : fd_(std::exchange(other.fd_, -1)) {}
  Fd& operator=(Fd&& other) noexcept {
    if (this != &other) {
      Reset();
      fd_ = std::exchange(other.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { Reset(); }

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  void Reset() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }
  // close(2) can report a delayed write error; a writer must see it.
  absl::Status Close(const std::string& path) {
    const int fd = std::exchange(fd_, -1);
    if (fd >= 0 && ::close(fd) != 0 && errno != EINTR) {
      return IoError(errno, "cannot close", path);
    }
    return absl::OkStatus();
  }

 private:
  int fd_ = -1;
};

absl::StatusOr<Fd> OpenFile(const std::string& path, int flags, mode_t mode = 0) {
  int fd;
  do {
    fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
  } while (fd < 0 && errno == EINTR);
  if (fd < 0) return IoError(errno, "cannot open", path);
  return Fd(fd);
}

// Opens a checkpoint file for reading without ever blocking: a FIFO in its
// place would block open(2) until a writer came, so the file is opened
// O_NONBLOCK and accepted only if it is a regular file; then reads block as
// usual. Symbolic links are refused (the writer never makes one). NOT_FOUND
// if it is missing; DATA_LOSS naming the file for anything not regular.
absl::StatusOr<Fd> OpenRegularFile(const std::string& path) {
  int raw;
  do {
    raw = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
  } while (raw < 0 && errno == EINTR);
  if (raw < 0) {
    if (errno == ELOOP) return Corrupt(path, "is a symbolic link, not a regular file");
    return IoError(errno, "cannot open", path);
  }
  Fd fd(raw);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return IoError(errno, "cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    const char* kind = S_ISFIFO(st.st_mode)   ? "a FIFO"
                       : S_ISDIR(st.st_mode)  ? "a directory"
                       : S_ISSOCK(st.st_mode) ? "a socket"
                       : S_ISCHR(st.st_mode)  ? "a character device"
                       : S_ISBLK(st.st_mode)  ? "a block device"
                                              : "of an unknown kind";
    return Corrupt(path, absl::StrCat("is ", kind, ", not a regular file"));
  }
  const int flags = ::fcntl(fd.get(), F_GETFL);
  if (flags < 0 || ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK) != 0) {
    return IoError(errno, "cannot clear O_NONBLOCK on", path);
  }
  return fd;
}

// Creates a new file with exactly `mode`, whatever the umask.
absl::StatusOr<Fd> CreateFile(const std::string& path, mode_t mode) {
  PS_ASSIGN_OR_RETURN(Fd fd, OpenFile(path, O_WRONLY | O_CREAT | O_EXCL, mode));
  if (::fchmod(fd.get(), mode) != 0) return IoError(errno, "cannot chmod", path);
  return fd;
}

// Creates directory `dir` with exactly `mode`; false if it existed.
absl::StatusOr<bool> MakeDirectory(const std::string& dir, mode_t mode) {
  if (::mkdir(dir.c_str(), mode) != 0) {
    if (errno == EEXIST) return false;
    return IoError(errno, "cannot create directory", dir);
  }
  if (::chmod(dir.c_str(), mode) != 0) return IoError(errno, "cannot chmod", dir);
  return true;
}

// Creates `dir` and its missing parents, each with `mode`. An existing `dir`
// (or a symbolic link to one) is kept as it is.
absl::Status MakeDirectories(const std::string& dir, mode_t mode) {
  auto not_a_directory = [&] {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot create directory ", dir, ": it exists and is not a directory"));
  };
  struct stat st;
  if (::stat(dir.c_str(), &st) == 0)
    return S_ISDIR(st.st_mode) ? absl::OkStatus() : not_a_directory();
  if (errno != ENOENT) return IoError(errno, "cannot create directory", dir);
  const std::string parent = fs::path(dir).parent_path().string();
  if (!parent.empty() && parent.size() < dir.size()) {
    PS_RETURN_IF_ERROR(MakeDirectories(parent, mode));
  }
  PS_ASSIGN_OR_RETURN(bool created, MakeDirectory(dir, mode));
  if (created) return absl::OkStatus();
  // Made meanwhile by someone else (or `dir` ends in '/'): what is it?
  if (::stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return absl::OkStatus();
  return not_a_directory();
}

// The placement a manifest records: the options', with the server count
// and, unless set, kind JUMP (every writer lays data out by cc/core/placement).
v1::Placement WrittenPlacement(const CheckpointWriteOptions& options) {
  v1::Placement placement = options.placement;
  if (placement.num_servers() == 0 && placement.kind() == v1::Placement::MODULO &&
      placement.version() == 0) {
    placement.set_kind(v1::Placement::JUMP);
  }
  placement.set_num_servers(options.num_servers);
  return placement;
}

}  // namespace

absl::Status CheckCheckpointFileMode(uint32_t mode) {
  if ((mode & ~uint32_t{0666}) != 0 || (mode & 0600) != 0600) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "checkpoint file mode %04o must have only permission bits of 0666 and include 0600 "
        "(the owner reads and writes), e.g. 0600 or 0640",
        mode));
  }
  return absl::OkStatus();
}

namespace {

absl::Status WriteAll(int fd, absl::string_view data, const std::string& path) {
  while (!data.empty()) {
    const ssize_t n = ::write(fd, data.data(), std::min(data.size(), size_t{1} << 30));
    if (n < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "cannot write", path);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return absl::OkStatus();
}

// Reads up to n bytes at `offset`; fewer only at the end of the file.
absl::StatusOr<size_t> ReadAt(int fd, char* buf, size_t n, uint64_t offset,
                              const std::string& path) {
  size_t done = 0;
  while (done < n) {
    const ssize_t r = ::pread(fd, buf + done, std::min(n - done, size_t{1} << 30),
                              static_cast<off_t>(offset + done));
    if (r < 0) {
      if (errno == EINTR) continue;
      return IoError(errno, "cannot read", path);
    }
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  return done;
}

absl::StatusOr<uint64_t> FileSize(int fd, const std::string& path) {
  struct stat st;
  if (::fstat(fd, &st) != 0) return IoError(errno, "cannot stat", path);
  return static_cast<uint64_t>(st.st_size);
}

absl::Status Sync(int fd, const std::string& path) {
  if (::fsync(fd) != 0) return IoError(errno, "cannot fsync", path);
  return absl::OkStatus();
}

// A directory's entries (creations, renames) are durable only once the
// directory itself is fsynced.
absl::Status SyncDir(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(Fd fd, OpenFile(dir, O_RDONLY | O_DIRECTORY));
  PS_RETURN_IF_ERROR(Sync(fd.get(), dir));
  return fd.Close(dir);
}

// ---- little-endian framing ------------------------------------------------------

void PutLe32(char* out, uint32_t value) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((value >> (8 * i)) & 0xff);
}

uint32_t GetLe32(const char* in) {
  uint32_t value = 0;
  for (int i = 0; i < 4; ++i) value |= uint32_t{static_cast<unsigned char>(in[i])} << (8 * i);
  return value;
}

// ---- names ----------------------------------------------------------------------

std::string SequenceDigits(uint64_t sequence) {
  return absl::StrFormat("%020u", sequence);
}

// The sequence of a ckpt-<20 digits> name.
bool ParseCheckpointName(absl::string_view name, uint64_t* sequence) {
  if (!absl::ConsumePrefix(&name, kCheckpointPrefix)) return false;
  if (name.size() != kSequenceDigits) return false;
  for (char c : name) {
    if (!absl::ascii_isdigit(static_cast<unsigned char>(c))) return false;
  }
  return absl::SimpleAtoi(name, sequence);
}

std::string RandomSuffix() {
  absl::BitGen gen;
  return absl::StrFormat("%016x", absl::Uniform<uint64_t>(gen));
}

// A name a manifest may give a data file: a plain name in the checkpoint.
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." && name != kManifestFileName &&
         name.find('/') == absl::string_view::npos &&
         name.find('\0') == absl::string_view::npos;
}

// Removes leftovers of saves or prunes that crashed. Best effort: a leftover
// that cannot be removed harms nobody, since readers ignore it.
void RemoveTempDirs(const std::string& dir) {
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec) return;
  std::vector<fs::path> stale;
  for (const fs::directory_entry& entry : it) {
    if (absl::StartsWith(entry.path().filename().string(), kTempPrefix)) {
      stale.push_back(entry.path());
    }
  }
  for (const fs::path& path : stale) fs::remove_all(path, ec);
}

// ---- writing --------------------------------------------------------------------

// Where a checkpoint's files go: a directory on disk (SaveCheckpoint) or
// memory (CheckpointToMemory). One file is open at a time.
class FileSink {
 public:
  virtual ~FileSink() = default;
  // Starts a new file `name`.
  virtual absl::Status Create(const std::string& name) = 0;
  virtual absl::Status Append(absl::string_view data) = 0;
  // The current file is complete (durable, on disk).
  virtual absl::Status Close() = 0;
  // Every file is complete (their names durable, on disk).
  virtual absl::Status Finish() = 0;
};

class DiskSink : public FileSink {
 public:
  DiskSink(std::string dir, uint32_t file_mode) : dir_(std::move(dir)), file_mode_(file_mode) {}
  absl::Status Create(const std::string& name) override {
    path_ = JoinPath(dir_, name);
    PS_ASSIGN_OR_RETURN(fd_, CreateFile(path_, file_mode_));
    return absl::OkStatus();
  }
  absl::Status Append(absl::string_view data) override { return WriteAll(fd_.get(), data, path_); }
  absl::Status Close() override {
    PS_RETURN_IF_ERROR(Sync(fd_.get(), path_));
    return fd_.Close(path_);
  }
  absl::Status Finish() override { return SyncDir(dir_); }

 private:
  const std::string dir_;
  const uint32_t file_mode_;
  Fd fd_;
  std::string path_;
};

class MemorySink : public FileSink {
 public:
  absl::Status Create(const std::string& name) override {
    files_.push_back({name, ""});
    return absl::OkStatus();
  }
  absl::Status Append(absl::string_view data) override {
    files_.back().content.append(data.data(), data.size());
    return absl::OkStatus();
  }
  absl::Status Close() override { return absl::OkStatus(); }
  absl::Status Finish() override { return absl::OkStatus(); }
  std::vector<CheckpointFile> Take() { return std::move(files_); }

 private:
  std::vector<CheckpointFile> files_;
};

// Appends items to data-00000.bin, data-00001.bin, ... in one sink.
class DataWriter {
 public:
  DataWriter(FileSink* sink, const CheckpointWriteOptions& options)
      : sink_(sink), options_(options) {}

  absl::StatusOr<v1::DataRef> Append(absl::string_view data) {
    const uint64_t max = options_.max_data_file_bytes;
    if (!open_ || (size_ > 0 && (size_ >= max || data.size() > max - size_))) {
      PS_RETURN_IF_ERROR(CloseCurrent());
      name_ = absl::StrFormat("data-%05d.bin", files_.size());
      PS_RETURN_IF_ERROR(sink_->Create(name_));
      open_ = true;
      size_ = 0;
    }
    v1::DataRef ref;
    ref.set_file(name_);
    ref.set_offset(size_);
    ref.set_length(data.size());
    ref.set_chunk_size(options_.chunk_size);
    for (size_t at = 0; at < data.size(); at += options_.chunk_size) {
      ref.add_chunk_crc32c(Crc32c(data.substr(at, options_.chunk_size)));
    }
    PS_RETURN_IF_ERROR(sink_->Append(data));
    size_ += data.size();
    return ref;
  }

  // Makes every data file durable and lists them in `manifest`.
  absl::Status Finish(v1::CheckpointManifest* manifest) {
    PS_RETURN_IF_ERROR(CloseCurrent());
    for (v1::DataFile& file : files_) *manifest->add_data_files() = std::move(file);
    return absl::OkStatus();
  }

 private:
  absl::Status CloseCurrent() {
    if (!open_) return absl::OkStatus();
    PS_RETURN_IF_ERROR(sink_->Close());
    open_ = false;
    v1::DataFile& file = files_.emplace_back();
    file.set_name(name_);
    file.set_length(size_);
    return absl::OkStatus();
  }

  FileSink* const sink_;
  const CheckpointWriteOptions options_;
  bool open_ = false;
  std::string name_;
  uint64_t size_ = 0;
  std::vector<v1::DataFile> files_;
};

absl::Status CheckSnapshot(const StoreSnapshot& snapshot) {
  std::set<std::pair<std::string, uint32_t>> seen;
  for (const BlockSnapshot& block : snapshot.blocks) {
    if (block.name.empty()) {
      return absl::InvalidArgumentError("snapshot holds a block without a name");
    }
    if (!seen.emplace(block.name, block.block.index()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("snapshot holds ", DescribeBlock(block.name, block.block), " twice"));
    }
  }
  for (const auto& [name, value] : snapshot.extensions) {
    if (name.empty()) return absl::InvalidArgumentError("snapshot holds an unnamed extension");
  }
  return absl::OkStatus();
}

// Writes the data files and MANIFEST of a checkpoint into `sink`, all durable.
absl::StatusOr<uint32_t> WriteCheckpointFiles(const StoreSnapshot& snapshot,
                                              FileSink& sink, uint32_t shard,
                                              uint64_t sequence, absl::Time time,
                                              const CheckpointWriteOptions& options) {
  v1::CheckpointManifest manifest;
  manifest.set_format_version(kCheckpointFormatVersion);
  manifest.set_shard(shard);
  manifest.set_sequence(sequence);
  manifest.set_create_time_micros(absl::ToUnixMicros(time));
  manifest.set_initialized(snapshot.initialized);
  manifest.set_cluster(options.cluster);
  manifest.set_num_servers(options.num_servers);
  manifest.set_epoch(options.epoch);
  *manifest.mutable_placement() = WrittenPlacement(options);

  std::vector<const BlockSnapshot*> blocks;
  for (const BlockSnapshot& block : snapshot.blocks) blocks.push_back(&block);
  std::sort(blocks.begin(), blocks.end(), [](const BlockSnapshot* a, const BlockSnapshot* b) {
    if (a->name != b->name) return a->name < b->name;
    return a->block.index() < b->block.index();
  });

  DataWriter data(&sink, options);
  for (const BlockSnapshot* block : blocks) {
    v1::CheckpointParameter* param = manifest.add_parameters();
    param->set_name(block->name);
    param->set_element_type(block->type);
    param->mutable_shape()->Assign(block->shape.begin(), block->shape.end());
    *param->mutable_block() = block->block;
    if (param->block().count() == 0) param->mutable_block()->set_count(1);
    *param->mutable_config() = block->config;
    param->set_optimizer(OptimizerName(block->config.optimizer()));
    if (IsInteger(block->type) &&
        block->config.optimizer().kind_case() == v1::OptimizerConfig::KIND_NOT_SET) {
      param->set_optimizer("none");
    }
    PS_ASSIGN_OR_RETURN(*param->mutable_content(), data.Append(block->content));
    param->set_optimizer_steps(block->optimizer.steps);
    for (const auto& [name, bytes] : block->optimizer.slots) {
      v1::OptimizerSlot* slot = param->add_optimizer_slots();
      slot->set_name(name);
      PS_ASSIGN_OR_RETURN(*slot->mutable_data(), data.Append(bytes));
    }
  }
  for (const auto& [name, value] : snapshot.extensions) {  // std::map: by name
    v1::CheckpointExtension* extension = manifest.add_extensions();
    extension->set_name(name);
    PS_ASSIGN_OR_RETURN(*extension->mutable_data(), data.Append(value));
  }
  PS_RETURN_IF_ERROR(data.Finish(&manifest));

  // No map fields, so the serialization is deterministic.
  std::string body;
  if (manifest.ByteSizeLong() > static_cast<size_t>(INT_MAX) ||
      !manifest.SerializeToString(&body)) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "checkpoint manifest of ", manifest.ByteSizeLong(), " bytes is too large"));
  }
  const uint32_t crc = Crc32c(body);
  std::string framed(kManifestHeaderSize, '\0');
  std::memcpy(framed.data(), kManifestMagic, 8);
  PutLe32(framed.data() + 8, static_cast<uint32_t>(body.size()));
  PutLe32(framed.data() + 12, crc);
  framed += body;

  PS_RETURN_IF_ERROR(sink.Create(kManifestFileName));
  PS_RETURN_IF_ERROR(sink.Append(framed));
  PS_RETURN_IF_ERROR(sink.Close());
  PS_RETURN_IF_ERROR(sink.Finish());
  return crc;
}

// ---- reading --------------------------------------------------------------------

uint64_t ChunkCount(uint64_t length, uint32_t chunk_size) {
  return length / chunk_size + (length % chunk_size != 0 ? 1 : 0);
}

// Checks that a manifest whose checksum matched is also consistent, so that
// reading it can trust every offset and length.
absl::Status CheckManifest(const v1::CheckpointManifest& manifest,
                           const std::string& manifest_path) {
  auto bad = [&](absl::string_view detail) { return Corrupt(manifest_path, detail); };
  std::map<std::string, uint64_t> files;
  for (const v1::DataFile& file : manifest.data_files()) {
    if (!IsPlainFileName(file.name())) {
      return bad(absl::StrCat("data file name '", absl::CEscape(file.name()),
                              "' is not a plain file name"));
    }
    if (!files.emplace(file.name(), file.length()).second) {
      return bad(absl::StrCat("data file ", file.name(), " is listed twice"));
    }
  }
  // (offset, length) of every non-empty item, per file.
  std::map<std::string, std::vector<std::pair<uint64_t, uint64_t>>> items;
  auto check_ref = [&](const v1::DataRef& ref, const std::string& what) -> absl::Status {
    auto file = files.find(ref.file());
    if (file == files.end()) {
      return bad(absl::StrCat(what, " is in data file '", absl::CEscape(ref.file()),
                              "', which the manifest does not list"));
    }
    if (ref.chunk_size() == 0 || ref.chunk_size() > kCheckpointMaxChunkSize) {
      return bad(absl::StrCat(what, " has chunk size ", ref.chunk_size(), ", not in [1, ",
                              kCheckpointMaxChunkSize, "]"));
    }
    if (ref.offset() > file->second || ref.length() > file->second - ref.offset()) {
      return bad(absl::StrCat(what, " spans bytes [", ref.offset(), ", +", ref.length(),
                              ") of ", ref.file(), ", which has ", file->second));
    }
    if (static_cast<uint64_t>(ref.chunk_crc32c_size()) !=
        ChunkCount(ref.length(), ref.chunk_size())) {
      return bad(absl::StrCat(what, " has ", ref.chunk_crc32c_size(), " chunk checksums for ",
                              ref.length(), " bytes in chunks of ", ref.chunk_size()));
    }
    if (ref.length() > 0) items[ref.file()].emplace_back(ref.offset(), ref.length());
    return absl::OkStatus();
  };
  std::set<std::pair<std::string, uint32_t>> blocks;
  for (const v1::CheckpointParameter& param : manifest.parameters()) {
    const std::string what = DescribeBlock(param.name(), param.block());
    if (param.name().empty()) return bad("a parameter has no name");
    if (!blocks.emplace(param.name(), param.block().index()).second) {
      return bad(absl::StrCat(what, " is listed twice"));
    }
    PS_RETURN_IF_ERROR(check_ref(param.content(), absl::StrCat(what, " content")));
    for (const v1::OptimizerSlot& slot : param.optimizer_slots()) {
      PS_RETURN_IF_ERROR(check_ref(
          slot.data(), absl::StrCat(what, " optimizer slot '", slot.name(), "'")));
    }
  }
  std::set<std::string> extensions;
  for (const v1::CheckpointExtension& extension : manifest.extensions()) {
    if (extension.name().empty()) return bad("an extension has no name");
    if (!extensions.insert(extension.name()).second) {
      return bad(absl::StrCat("extension '", extension.name(), "' is listed twice"));
    }
    PS_RETURN_IF_ERROR(
        check_ref(extension.data(), absl::StrCat("extension '", extension.name(), "'")));
  }
  // Items tile each data file: every byte is under exactly one checksum.
  for (const auto& [name, length] : files) {
    std::vector<std::pair<uint64_t, uint64_t>>& spans = items[name];
    std::sort(spans.begin(), spans.end());
    uint64_t at = 0;
    for (const auto& [offset, size] : spans) {
      if (offset != at) {
        return bad(absl::StrCat("data file ", name, ": byte ", std::min(at, offset),
                                offset < at ? " is in two items" : " is in no item"));
      }
      at = offset + size;
    }
    if (at != length) {
      return bad(absl::StrCat("data file ", name, ": bytes [", at, ", ", length,
                              ") are in no item"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

uint32_t CheckpointDirMode(uint32_t file_mode) {
  uint32_t mode = file_mode & 0777;
  if (mode & 0400) mode |= 0100;
  if (mode & 0040) mode |= 0010;
  if (mode & 0004) mode |= 0001;
  return mode;
}

absl::StatusOr<uint32_t> ParseCheckpointFileMode(absl::string_view octal) {
  uint32_t mode = 0;
  const bool digits = !octal.empty() && octal.size() <= 5 &&
                      octal.find_first_not_of("01234567") == absl::string_view::npos;
  if (!digits) {
    return absl::InvalidArgumentError(absl::StrCat("checkpoint file mode '", absl::CEscape(octal),
                                                   "' is not an octal mode such as 0600"));
  }
  for (char c : octal) mode = mode * 8 + static_cast<uint32_t>(c - '0');
  PS_RETURN_IF_ERROR(CheckCheckpointFileMode(mode));
  return mode;
}

absl::Status CheckWritableDirectory(const std::string& dir, uint32_t file_mode) {
  auto not_writable = [&](const absl::Status& why) {
    return absl::Status(
        why.code(), absl::StrCat("checkpoint directory ", dir, " is not usable: ", why.message()));
  };
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  PS_RETURN_IF_ERROR(CheckCheckpointFileMode(file_mode));
  absl::Status made = MakeDirectories(dir, CheckpointDirMode(file_mode));
  if (!made.ok()) return not_writable(made);
  // Named like a crashed save's leftovers, which the next save removes.
  const std::string probe = JoinPath(dir, absl::StrCat(kTempPrefix, "probe-", RandomSuffix()));
  absl::Status written = [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(Fd fd, CreateFile(probe, file_mode));
    PS_RETURN_IF_ERROR(WriteAll(fd.get(), "pserver write probe\n", probe));
    PS_RETURN_IF_ERROR(Sync(fd.get(), probe));
    return fd.Close(probe);
  }();
  if (::unlink(probe.c_str()) != 0 && errno != ENOENT && written.ok()) {
    written = IoError(errno, "cannot remove", probe);
  }
  if (!written.ok()) return not_writable(written);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& dir) { return SyncDir(dir); }

std::string CheckpointDirName(uint64_t sequence) {
  return absl::StrCat(kCheckpointPrefix, SequenceDigits(sequence));
}

namespace {

absl::Status CheckWriteArguments(const StoreSnapshot& snapshot,
                                 const CheckpointWriteOptions& options) {
  if (options.chunk_size == 0 || options.chunk_size > kCheckpointMaxChunkSize) {
    return absl::InvalidArgumentError(absl::StrCat(
        "checkpoint chunk_size must be in [1, ", kCheckpointMaxChunkSize, "], got ",
        options.chunk_size));
  }
  if (options.max_data_file_bytes == 0) {
    return absl::InvalidArgumentError("checkpoint max_data_file_bytes must be > 0");
  }
  PS_RETURN_IF_ERROR(CheckCheckpointFileMode(options.file_mode));
  return CheckSnapshot(snapshot);
}

absl::Time WriteTime(const CheckpointWriteOptions& options) {
  return options.time == absl::InfinitePast() ? absl::Now() : options.time;
}

}  // namespace

absl::StatusOr<std::vector<CheckpointFile>> CheckpointToMemory(
    const StoreSnapshot& snapshot, uint32_t shard, uint64_t sequence,
    const CheckpointWriteOptions& options) {
  PS_RETURN_IF_ERROR(CheckWriteArguments(snapshot, options));
  MemorySink sink;
  PS_RETURN_IF_ERROR(
      WriteCheckpointFiles(snapshot, sink, shard, sequence, WriteTime(options), options)
          .status());
  return sink.Take();
}

absl::StatusOr<CheckpointInfo> SaveCheckpoint(const StoreSnapshot& snapshot,
                                              const std::string& dir, uint32_t shard,
                                              uint64_t sequence,
                                              const CheckpointWriteOptions& options) {
  if (dir.empty()) return absl::InvalidArgumentError("checkpoint directory is empty");
  PS_RETURN_IF_ERROR(CheckWriteArguments(snapshot, options));
  const mode_t dir_mode = CheckpointDirMode(options.file_mode);

  std::error_code ec;
  PS_RETURN_IF_ERROR(MakeDirectories(dir, dir_mode));
  const std::string final_path = JoinPath(dir, CheckpointDirName(sequence));
  struct stat st;
  if (::lstat(final_path.c_str(), &st) == 0) {
    return absl::AlreadyExistsError(absl::StrCat("checkpoint ", final_path, " already exists"));
  }
  RemoveTempDirs(dir);

  std::string tmp;
  for (int attempt = 0;; ++attempt) {
    tmp = JoinPath(dir, absl::StrCat(kTempPrefix, SequenceDigits(sequence), "-", RandomSuffix()));
    absl::StatusOr<bool> created = MakeDirectory(tmp, dir_mode);
    if (!created.ok()) return created.status();
    if (*created) break;
    if (attempt == 10) return IoError(EEXIST, "cannot create", tmp);
  }
  const absl::Time time = WriteTime(options);
  DiskSink sink(tmp, options.file_mode);
  absl::StatusOr<uint32_t> crc =
      WriteCheckpointFiles(snapshot, sink, shard, sequence, time, options);
  if (crc.ok() && ::rename(tmp.c_str(), final_path.c_str()) != 0) {
    crc = IoError(errno, absl::StrCat("cannot rename ", tmp, " to"), final_path);
  }
  if (!crc.ok()) {
    fs::remove_all(tmp, ec);
    return crc.status();
  }
  PS_RETURN_IF_ERROR(SyncDir(dir));

  CheckpointInfo info;
  info.path = final_path;
  info.shard = shard;
  info.sequence = sequence;
  info.manifest_crc32c = *crc;
  info.time = absl::FromUnixMicros(absl::ToUnixMicros(time));
  info.cluster = options.cluster;
  info.num_servers = options.num_servers;
  info.epoch = options.epoch;
  info.placement = WrittenPlacement(options);
  return info;
}

absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpoints(const std::string& dir) {
  std::vector<CheckpointEntry> entries;
  std::error_code ec;
  fs::directory_iterator it(dir, ec);
  if (ec == std::errc::no_such_file_or_directory) return entries;
  if (ec == std::errc::not_a_directory) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot list checkpoint directory ", dir, ": it is not a directory"));
  }
  if (ec) return FsError(ec, "cannot list checkpoint directory", dir);
  for (const fs::directory_entry& entry : it) {
    uint64_t sequence;
    if (!ParseCheckpointName(entry.path().filename().string(), &sequence)) continue;
    // Only real directories: a ckpt-* link could point anywhere.
    if (entry.is_symlink(ec) || !entry.is_directory(ec)) continue;
    entries.push_back(CheckpointEntry{JoinPath(dir, entry.path().filename().string()), sequence});
  }
  std::sort(entries.begin(), entries.end(),
            [](const CheckpointEntry& a, const CheckpointEntry& b) {
              return a.sequence < b.sequence;
            });
  return entries;
}

absl::StatusOr<std::vector<CheckpointEntry>> ListCheckpointsInLoadOrder(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> entries, ListCheckpoints(dir));
  for (CheckpointEntry& entry : entries) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(entry.path);
    entry.epoch = reader.ok() ? (*reader)->info().epoch : 0;
  }
  std::stable_sort(entries.begin(), entries.end(),
                   [](const CheckpointEntry& a, const CheckpointEntry& b) {
                     if (a.epoch != b.epoch) return a.epoch < b.epoch;
                     return a.sequence < b.sequence;
                   });
  return entries;
}

absl::StatusOr<std::vector<std::string>> PruneCheckpoints(const std::string& dir, size_t keep,
                                                          const std::vector<std::string>& spare) {
  if (keep == 0) {
    return absl::InvalidArgumentError(
        "PruneCheckpoints keeps at least 1 checkpoint: the published one");
  }
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> entries, ListCheckpointsInLoadOrder(dir));
  std::vector<std::string> removed;
  if (entries.size() <= keep) return removed;
  for (size_t i = 0; i + keep < entries.size(); ++i) {
    if (std::find(spare.begin(), spare.end(), entries[i].path) != spare.end()) continue;
    // Renamed first, so that it vanishes from listings at once; a crash in
    // remove_all leaves a .tmp-ckpt-* directory the next save removes.
    const std::string doomed = JoinPath(
        dir, absl::StrCat(kTempPrefix, SequenceDigits(entries[i].sequence), "-", RandomSuffix(),
                          "-pruned"));
    if (::rename(entries[i].path.c_str(), doomed.c_str()) != 0) {
      return IoError(errno, absl::StrCat("cannot rename ", entries[i].path, " to"), doomed);
    }
    std::error_code ec;
    fs::remove_all(doomed, ec);
    if (ec) return FsError(ec, "cannot remove", doomed);
    removed.push_back(entries[i].path);
  }
  return removed;
}

// ---- CheckpointReader -------------------------------------------------------------

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) {
      return absl::NotFoundError(absl::StrCat("checkpoint ", path, " not found"));
    }
    return IoError(errno, "cannot stat checkpoint", path);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("checkpoint ", path, " is not a directory"));
  }
  const std::string manifest_path = JoinPath(path, kManifestFileName);
  absl::StatusOr<Fd> fd = OpenRegularFile(manifest_path);
  if (!fd.ok()) {
    if (absl::IsNotFound(fd.status())) return Corrupt(manifest_path, "missing");
    return fd.status();
  }
  PS_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd->get(), manifest_path));
  if (size < kManifestHeaderSize) {
    return Corrupt(manifest_path, absl::StrCat("truncated: ", size, " bytes, a manifest has at least ",
                                               kManifestHeaderSize));
  }
  char header[kManifestHeaderSize];
  PS_ASSIGN_OR_RETURN(size_t got, ReadAt(fd->get(), header, sizeof(header), 0, manifest_path));
  if (got != sizeof(header)) return Corrupt(manifest_path, "truncated while reading");
  if (std::memcmp(header, kManifestMagic, 8) != 0) {
    return Corrupt(manifest_path, absl::StrCat("does not start with the magic ", kManifestMagic,
                                               ": not a pserver checkpoint manifest"));
  }
  const uint32_t length = GetLe32(header + 8);
  const uint32_t stored_crc = GetLe32(header + 12);
  if (size - kManifestHeaderSize != length) {
    return Corrupt(manifest_path,
                   absl::StrCat("the header says ", length, " manifest bytes follow, the file has ",
                                size - kManifestHeaderSize, " (truncated or overwritten)"));
  }
  std::string body(length, '\0');
  PS_ASSIGN_OR_RETURN(got, ReadAt(fd->get(), body.data(), length, kManifestHeaderSize,
                                  manifest_path));
  if (got != length) return Corrupt(manifest_path, "truncated while reading");
  const uint32_t crc = Crc32c(body);
  if (crc != stored_crc) {
    return Corrupt(manifest_path, absl::StrCat("crc32c is ", Hex32(crc), ", the header says ",
                                               Hex32(stored_crc)));
  }
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  if (length > static_cast<uint32_t>(INT_MAX) ||
      !reader->manifest_.ParseFromArray(body.data(), static_cast<int>(length))) {
    return Corrupt(manifest_path, "does not parse as a pserver.v1.CheckpointManifest");
  }
  const v1::CheckpointManifest& manifest = reader->manifest_;
  if (manifest.format_version() != kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(
        "checkpoint ", path, " has format version ", manifest.format_version(),
        "; this reader reads version ", kCheckpointFormatVersion));
  }
  PS_RETURN_IF_ERROR(CheckManifest(manifest, manifest_path));
  reader->path_ = path;
  reader->info_.path = path;
  reader->info_.shard = manifest.shard();
  reader->info_.sequence = manifest.sequence();
  reader->info_.manifest_crc32c = crc;
  reader->info_.time = absl::FromUnixMicros(manifest.create_time_micros());
  reader->info_.cluster = manifest.cluster();
  reader->info_.num_servers = manifest.num_servers();
  reader->info_.epoch = manifest.epoch();
  if (manifest.has_placement()) {
    reader->info_.placement = manifest.placement();
  } else {  // written before placements were recorded
    reader->info_.placement.set_kind(v1::Placement::MODULO);
    reader->info_.placement.set_num_servers(manifest.num_servers());
  }
  return reader;
}

absl::StatusOr<int> CheckpointReader::FindParameter(absl::string_view name,
                                                    uint32_t block_index) const {
  for (int i = 0; i < manifest_.parameters_size(); ++i) {
    const v1::CheckpointParameter& param = manifest_.parameters(i);
    if (param.name() == name && param.block().index() == block_index) return i;
  }
  return absl::NotFoundError(absl::StrCat("parameter '", name, "' block ", block_index,
                                          " is not in checkpoint ", path_));
}

namespace {

// Opens a data file of a checkpoint and checks its size against the manifest.
absl::StatusOr<Fd> OpenDataFile(const std::string& checkpoint,
                                const v1::CheckpointManifest& manifest,
                                const std::string& name) {
  const std::string path = JoinPath(checkpoint, name);
  const v1::DataFile* listed = nullptr;
  for (const v1::DataFile& file : manifest.data_files()) {
    if (file.name() == name) listed = &file;
  }
  if (listed == nullptr) return Corrupt(path, "not listed in the manifest");
  absl::StatusOr<Fd> fd = OpenRegularFile(path);
  if (!fd.ok()) {
    if (absl::IsNotFound(fd.status())) return Corrupt(path, "missing");
    return fd.status();
  }
  PS_ASSIGN_OR_RETURN(uint64_t size, FileSize(fd->get(), path));
  if (size != listed->length()) {
    return Corrupt(path, absl::StrCat("file has ", size, " bytes, the manifest says ",
                                      listed->length(),
                                      size < listed->length() ? " (truncated)" : ""));
  }
  return fd;
}

// Reads `ref` chunk by chunk, checking each chunk's CRC32C. With `out` the
// bytes land there; without, one chunk is held at a time.
absl::Status ReadVerified(const std::string& checkpoint, const v1::CheckpointManifest& manifest,
                          const v1::DataRef& ref, std::string* out) {
  const std::string path = JoinPath(checkpoint, ref.file());
  PS_ASSIGN_OR_RETURN(Fd fd, OpenDataFile(checkpoint, manifest, ref.file()));
  std::string scratch;
  if (out != nullptr) {
    out->resize(ref.length());
  } else {
    scratch.resize(std::min<uint64_t>(ref.length(), ref.chunk_size()));
  }
  const uint64_t chunks = ChunkCount(ref.length(), ref.chunk_size());
  for (uint64_t k = 0; k < chunks; ++k) {
    const uint64_t begin = k * ref.chunk_size();
    const size_t n = static_cast<size_t>(std::min<uint64_t>(ref.chunk_size(), ref.length() - begin));
    char* buf = out != nullptr ? out->data() + begin : scratch.data();
    PS_ASSIGN_OR_RETURN(size_t got, ReadAt(fd.get(), buf, n, ref.offset() + begin, path));
    const std::string where = absl::StrCat(path, " chunk ", k);
    if (got != n) return Corrupt(where, "file ends early (truncated while reading)");
    const uint32_t crc = Crc32c(absl::string_view(buf, n));
    const uint32_t want = ref.chunk_crc32c(static_cast<int>(k));
    if (crc != want) {
      return Corrupt(where, absl::StrCat("bytes [", ref.offset() + begin, ", ",
                                         ref.offset() + begin + n, ") have crc32c ", Hex32(crc),
                                         ", the manifest says ", Hex32(want)));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::string> CheckpointReader::ReadData(const v1::DataRef& ref) const {
  std::string out;
  PS_RETURN_IF_ERROR(ReadVerified(path_, manifest_, ref, &out));
  return out;
}

absl::StatusOr<BlockSnapshot> CheckpointReader::ReadBlock(int index) const {
  if (index < 0 || index >= manifest_.parameters_size()) {
    return absl::OutOfRangeError(absl::StrCat("checkpoint ", path_, " has ",
                                              manifest_.parameters_size(),
                                              " parameter blocks, asked for #", index));
  }
  const v1::CheckpointParameter& param = manifest_.parameters(index);
  BlockSnapshot block;
  block.name = param.name();
  block.type = param.element_type();
  block.shape.assign(param.shape().begin(), param.shape().end());
  block.block = param.block();
  block.config = param.config();
  PS_ASSIGN_OR_RETURN(block.content, ReadData(param.content()));
  block.optimizer.steps = param.optimizer_steps();
  for (const v1::OptimizerSlot& slot : param.optimizer_slots()) {
    PS_ASSIGN_OR_RETURN(std::string bytes, ReadData(slot.data()));
    block.optimizer.slots.emplace_back(slot.name(), std::move(bytes));
  }
  return block;
}

absl::StatusOr<StoreSnapshot> CheckpointReader::ReadAll() const {
  // Sizes first, so that a damaged file no item reads is reported too.
  for (const v1::DataFile& file : manifest_.data_files()) {
    PS_RETURN_IF_ERROR(OpenDataFile(path_, manifest_, file.name()).status());
  }
  StoreSnapshot snapshot;
  snapshot.initialized = manifest_.initialized();
  snapshot.blocks.reserve(manifest_.parameters_size());
  for (int i = 0; i < manifest_.parameters_size(); ++i) {
    PS_ASSIGN_OR_RETURN(BlockSnapshot block, ReadBlock(i));
    snapshot.blocks.push_back(std::move(block));
  }
  for (const v1::CheckpointExtension& extension : manifest_.extensions()) {
    PS_ASSIGN_OR_RETURN(snapshot.extensions[extension.name()], ReadData(extension.data()));
  }
  return snapshot;
}

absl::Status CheckpointReader::Verify() const {
  for (const v1::DataFile& file : manifest_.data_files()) {
    PS_RETURN_IF_ERROR(OpenDataFile(path_, manifest_, file.name()).status());
  }
  for (const v1::CheckpointParameter& param : manifest_.parameters()) {
    PS_RETURN_IF_ERROR(ReadVerified(path_, manifest_, param.content(), nullptr));
    for (const v1::OptimizerSlot& slot : param.optimizer_slots()) {
      PS_RETURN_IF_ERROR(ReadVerified(path_, manifest_, slot.data(), nullptr));
    }
  }
  for (const v1::CheckpointExtension& extension : manifest_.extensions()) {
    PS_RETURN_IF_ERROR(ReadVerified(path_, manifest_, extension.data(), nullptr));
  }
  return absl::OkStatus();
}

// ---- whole checkpoints ------------------------------------------------------------

absl::StatusOr<LoadedCheckpoint> LoadCheckpoint(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  LoadedCheckpoint loaded;
  loaded.info = reader->info();
  PS_ASSIGN_OR_RETURN(loaded.snapshot, reader->ReadAll());
  return loaded;
}

absl::StatusOr<CheckpointInfo> VerifyCheckpoint(const std::string& path) {
  PS_ASSIGN_OR_RETURN(std::unique_ptr<CheckpointReader> reader, CheckpointReader::Open(path));
  PS_RETURN_IF_ERROR(reader->Verify());
  return reader->info();
}

absl::StatusOr<LoadedCheckpoint> LoadLatestCheckpoint(const std::string& dir) {
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointEntry> entries, ListCheckpointsInLoadOrder(dir));
  if (entries.empty()) {
    return absl::NotFoundError(absl::StrCat("no checkpoint in ", dir));
  }
  std::vector<SkippedCheckpoint> skipped;
  for (auto it = entries.rbegin(); it != entries.rend(); ++it) {
    absl::StatusOr<LoadedCheckpoint> loaded = LoadCheckpoint(it->path);
    if (loaded.ok() && loaded->info.sequence != it->sequence) {
      loaded = absl::DataLossError(absl::StrCat(
          "checkpoint ", it->path, " holds sequence ", loaded->info.sequence,
          ", its name says ", it->sequence));
    }
    if (loaded.ok()) {
      loaded->skipped = std::move(skipped);
      return loaded;
    }
    skipped.push_back(SkippedCheckpoint{it->path, it->sequence, loaded.status()});
  }
  std::vector<std::string> reasons;
  for (const SkippedCheckpoint& skip : skipped) reasons.push_back(skip.status.ToString());
  return absl::DataLossError(absl::StrCat("no good checkpoint in ", dir, ": ",
                                          absl::StrJoin(reasons, "; ")));
}

}  // namespace pserver
