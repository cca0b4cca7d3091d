#include "cc/server/replication.h"

#include <stdlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/service.h"
#include "grpcpp/grpcpp.h"

namespace pserver {
namespace {

namespace fs = std::filesystem;

// A fresh directory under the system's temporary directory, removed with
// everything in it when the guard goes.
class TempDir {
 public:
  static absl::StatusOr<TempDir> Make() {
    std::error_code ec;
    std::string pattern = (fs::temp_directory_path(ec) / "pserver-replica-XXXXXX").string();
    if (ec || mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("cannot create a directory like ", pattern, ": ",
                                              ec ? ec.message() : std::strerror(errno)));
    }
    return TempDir(pattern);
  }
  TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, "")) {}
  TempDir(const TempDir&) = delete;
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  std::string path_;
};

bool IsPlainName(const std::string& name) {
  return !name.empty() && name != "." && name != ".." && name.find('/') == std::string::npos &&
         name.find('\0') == std::string::npos;
}

}  // namespace

absl::StatusOr<std::vector<v1::SnapshotFile>> SnapshotToFiles(
    const StoreSnapshot& snapshot, uint32_t shard, const CheckpointWriteOptions& options) {
  PS_ASSIGN_OR_RETURN(std::vector<CheckpointFile> written,
                      CheckpointToMemory(snapshot, shard, /*sequence=*/1, options));
  std::vector<v1::SnapshotFile> files;
  files.reserve(written.size());
  for (CheckpointFile& written_file : written) {
    v1::SnapshotFile& file = files.emplace_back();
    file.set_name(std::move(written_file.name));
    file.set_content(std::move(written_file.content));
  }
  return files;
}

absl::StatusOr<LoadedCheckpoint> LoadSnapshotFiles(
    const google::protobuf::RepeatedPtrField<v1::SnapshotFile>& files) {
  std::set<std::string> names;
  for (const v1::SnapshotFile& file : files) {
    if (!IsPlainName(file.name()) || !names.insert(file.name()).second) {
      return absl::InvalidArgumentError(absl::StrCat("a shard copy names file '",
                                                     absl::CHexEscape(file.name()),
                                                     "': not a plain file name, or given twice"));
    }
  }
  PS_ASSIGN_OR_RETURN(TempDir dir, TempDir::Make());
  const std::string path = absl::StrCat(dir.path(), "/", CheckpointDirName(1));
  std::error_code ec;
  fs::create_directory(path, ec);
  if (ec) return absl::InternalError(absl::StrCat("cannot create ", path, ": ", ec.message()));
  for (const v1::SnapshotFile& file : files) {
    std::ofstream out(absl::StrCat(path, "/", file.name()), std::ios::binary);
    out.write(file.content().data(), static_cast<std::streamsize>(file.content().size()));
    out.close();
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", path, "/", file.name()));
  }
  return LoadCheckpoint(path);
}

// ---- primary ------------------------------------------------------------------------

PrimaryReplication::PrimaryReplication(PrimaryReplicationOptions options, uint64_t last_lsn)
    : options_(std::move(options)), last_lsn_(last_lsn) {}

PrimaryReplication::~PrimaryReplication() = default;

std::string PrimaryReplication::backup() const {
  absl::ReaderMutexLock lock(&mu_);
  return backup_id_;
}

uint64_t PrimaryReplication::last_lsn() const {
  absl::ReaderMutexLock lock(&mu_);
  return log_ != nullptr ? log_->last_lsn() : last_lsn_;
}

absl::Status PrimaryReplication::Write(absl::string_view method,
                                       absl::FunctionRef<std::string()> request,
                                       absl::FunctionRef<absl::Status()> apply) {
  absl::Status shipped;
  const PrimaryLog* failed = nullptr;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (log_ == nullptr) return apply();
    bool applied_ok = false;
    shipped = log_->Write(method, request(), [&] {
      absl::Status applied = apply();
      applied_ok = applied.ok();
      return applied;
    });
    // Acknowledged by the backup; or not applied here (the write's own
    // error, or writes in flight at their bound): sent nowhere.
    if (shipped.ok() || !applied_ok) return shipped;
    failed = log_.get();
  }
  if (absl::IsFailedPrecondition(shipped)) {
    const std::string why =
        absl::StrCat("a backup of shard ", options_.shard, " refused a write: ", shipped.message());
    if (options_.step_down) options_.step_down(why);
    return absl::UnavailableError(absl::StrCat(why, "; not acknowledged; retry"));
  }
  absl::MutexLock lock(&mu_);
  // Another write may have dropped it already.
  if (log_.get() == failed) PS_RETURN_IF_ERROR(DropBackup(shipped));
  // Applied here, and the configuration lists no replica that lacks it.
  return absl::OkStatus();
}

absl::Status PrimaryReplication::DropBackup(const absl::Status& failure) {
  const std::string key = etcd_keys::ShardKey(options_.shard);
  auto refused = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("backup ", backup_id_, " at ", backup_address_,
                                               " did not acknowledge a write (", failure.message(),
                                               ") and ", why, "; not acknowledged; retry"));
  };
  absl::StatusOr<KeyValue> current = options_.etcd->Get(key);
  if (!current.ok()) {
    return refused(absl::StrCat("etcd ", key, " cannot be read: ", current.status().message()));
  }
  absl::StatusOr<ShardClaim> next =
      NextWithoutReplica(options_.shard, *current, options_.instance_id, backup_id_);
  if (!next.ok()) return refused(next.status().message());
  absl::StatusOr<TxnResult> written = options_.etcd->Txn(
      {next->unchanged, Compare::ValueEquals(key, options_.config->value())}, {next->put});
  if (!written.ok()) return refused(absl::StrCat("etcd failed: ", written.status().message()));
  if (!written->succeeded) return refused(absl::StrCat("etcd ", key, " changed meanwhile"));
  options_.config->Set(next->config.epoch(), next->value);
  if (options_.log) {
    options_.log(absl::StrCat("dropped backup ", backup_id_, " at ", backup_address_, " of shard ",
                              options_.shard, " (", failure.message(), "): epoch ",
                              next->config.epoch(), ", no backup"));
  }
  last_lsn_ = log_->last_lsn();
  dropped_.fetch_add(1, std::memory_order_relaxed);
  log_.reset();
  stub_.reset();
  backup_id_.clear();
  backup_address_.clear();
  return absl::OkStatus();
}

absl::Status PrimaryReplication::Send(const BackupLog::Write& write) {
  v1::ReplicateRequest request;
  request.set_shard(options_.shard);
  request.set_epoch(write.epoch);
  request.set_lsn(write.lsn);
  request.set_method(write.method);
  request.set_request(write.request);
  const absl::Time deadline = absl::Now() + options_.replicate_timeout;
  // Shipping holds mu_ shared: stub_ and backup_address_ stay.
  v1::ParameterServer::Stub* const stub = stub_.get();
  const std::string& address = backup_address_;
  absl::Status status;
  for (int attempt = 0;; ++attempt) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(deadline));
    v1::ReplicateResponse response;
    status = FromGrpcStatus(stub->Replicate(&context, request, &response));
    if (!absl::IsUnavailable(status) || absl::Now() >= deadline || attempt >= 1000) break;
    // A backup whose address refuses connections is gone (its process
    // died): no use retrying until the timeout, drop it now.
    if (absl::StatusOr<bool> refused = TcpConnectionRefused(address, absl::Seconds(1));
        refused.ok() && *refused) {
      return absl::UnavailableError(absl::StrCat("backup at ", address,
                                                 " refuses connections: ", status.message()));
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  return status;
}

absl::StatusOr<v1::AttachStandbyResponse> PrimaryReplication::Attach(
    const v1::AttachStandbyRequest& request) {
  if (request.shard() != options_.shard) {
    return absl::InvalidArgumentError(
        absl::StrCat("this server holds shard ", options_.shard, ", not ", request.shard()));
  }
  if (request.address().empty() || request.address().size() > 300) {
    return absl::InvalidArgumentError("a standby's address must be 1-300 bytes");
  }
  // Writes wait here until the copy is taken and the configuration written.
  absl::MutexLock lock(&mu_);
  if (log_ != nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard, " already has backup ", backup_id_,
                     "; a standby attaches to a shard without one"));
  }
  const std::string key = etcd_keys::ShardKey(options_.shard);
  PS_ASSIGN_OR_RETURN(KeyValue current, options_.etcd->Get(key));
  PS_ASSIGN_OR_RETURN(
      ShardClaim next,
      NextWithReplica(options_.shard, current, options_.instance_id, request.instance_id()));
  PS_ASSIGN_OR_RETURN(StoreSnapshot snapshot, options_.dispatcher->Snapshot());
  CheckpointWriteOptions write_options = options_.write_options;
  write_options.epoch = next.config.epoch();
  PS_ASSIGN_OR_RETURN(std::vector<v1::SnapshotFile> files,
                      SnapshotToFiles(snapshot, options_.shard, write_options));
  PS_ASSIGN_OR_RETURN(
      TxnResult written,
      options_.etcd->Txn({next.unchanged, Compare::ValueEquals(key, options_.config->value())},
                         {next.put}));
  if (!written.succeeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", key, " changed while the standby attached; try again"));
  }
  options_.config->Set(next.config.epoch(), next.value);
  backup_id_ = request.instance_id();
  backup_address_ = request.address();
  stub_ = v1::ParameterServer::NewStub(
      grpc::CreateChannel(backup_address_, grpc::InsecureChannelCredentials()));
  log_ = std::make_unique<PrimaryLog>(
      next.config.epoch(), last_lsn_, /*backups=*/1, PrimaryLog::Options{},
      [this](size_t, const BackupLog::Write& write) { return Send(write); });
  if (options_.log) {
    options_.log(absl::StrCat("standby ", backup_id_, " at ", backup_address_,
                              " attached as backup of shard ", options_.shard, " at LSN ",
                              last_lsn_, ": epoch ", next.config.epoch()));
  }
  v1::AttachStandbyResponse response;
  response.set_epoch(next.config.epoch());
  response.set_last_lsn(last_lsn_);
  for (v1::SnapshotFile& file : files) *response.add_files() = std::move(file);
  return response;
}

// ---- backup -------------------------------------------------------------------------

void BackupReplication::Attached(uint32_t shard, uint64_t epoch, uint64_t last_lsn) {
  shard_ = shard;
  log_ = std::make_unique<BackupLog>(epoch, last_lsn, BackupLog::Options{},
                                     [this](const BackupLog::Write& write) {
                                       if (write.method == "SendGrads")
                                         return ApplyReplicatedPush(*dispatcher_, write.request);
                                       return dispatcher_->ApplyWrite(write.method, write.request);
                                     });
  attached_.Notify();
}

absl::Status BackupReplication::Replicate(const v1::ReplicateRequest& request,
                                          absl::Duration wait) {
  if (!attached_.WaitForNotificationWithTimeout(wait)) {
    return absl::UnavailableError(
        absl::StrCat("the copy of shard ", request.shard(), " is not loaded yet; retry"));
  }
  if (request.shard() != shard_) {
    return absl::InvalidArgumentError(
        absl::StrCat("this server is a backup of shard ", shard_, ", not ", request.shard()));
  }
  BackupLog::Write write;
  write.epoch = request.epoch();
  write.lsn = request.lsn();
  write.method = request.method();
  write.request = request.request();
  return log_->Deliver(std::move(write), absl::Now() + wait);
}

void BackupReplication::SetEpoch(uint64_t epoch) {
  if (attached_.HasBeenNotified()) log_->SetEpoch(epoch);
}

uint64_t BackupReplication::applied_lsn() const {
  return attached_.HasBeenNotified() ? log_->applied_lsn() : 0;
}

bool PrimaryProbe::Refuses(const KeyValue& entry) {
  absl::StatusOr<etcd_keys::ServerEntry> server = etcd_keys::ParseServerValue(entry.value);
  if (!server.ok()) return false;
  if (channel_ == nullptr || server->address != address_) {
    address_ = server->address;
    channel_ = grpc::CreateChannel(address_, grpc::InsecureChannelCredentials());
  }
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return false;
  absl::StatusOr<bool> refused = TcpConnectionRefused(address_, absl::Seconds(1));
  return refused.ok() && *refused;
}

}  // namespace pserver
