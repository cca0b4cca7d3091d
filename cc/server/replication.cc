#include "cc/server/replication.h"

#include <stdlib.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <utility>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "cc/core/status_macros.h"
#include "cc/etcd/keys.h"
#include "cc/etcd/shard_config.h"
#include "cc/rpc/byte_stream.h"
#include "cc/rpc/grpc_status.h"
#include "cc/server/move.h"
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
    : options_(std::move(options)),
      term_(options_.config->epoch()),
      base_lsn_(last_lsn),
      recent_(options_.catch_up_bytes > 0 ? std::make_unique<RecentWrites>(options_.catch_up_bytes)
                                          : nullptr),
      last_lsn_(last_lsn) {
  if (recent_ != nullptr) {  // every write numbered and kept from the start
    absl::MutexLock lock(&mu_);
    RebuildLog();
  }
}

PrimaryReplication::~PrimaryReplication() {
  stopping_.store(true);
  {
    // A catch-up waiting for its first write (join_first_write_wait) sees
    // stopping_ once its joiner's mutex is let go.
    absl::MutexLock lock(&mu_);
    for (const std::shared_ptr<Joiner>& joiner : joiners_) absl::MutexLock wake(&joiner->mu);
  }
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&threads_mu_);
    threads.swap(threads_);
  }
  for (std::thread& thread : threads) thread.join();
}

std::vector<std::string> PrimaryReplication::backups() const {
  absl::ReaderMutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const Backup& backup : backups_) ids.push_back(backup.id);
  return ids;
}

uint64_t PrimaryReplication::last_lsn() const {
  absl::ReaderMutexLock lock(&mu_);
  return log_ != nullptr ? log_->last_lsn() : last_lsn_;
}

absl::Status PrimaryReplication::Write(absl::string_view method,
                                       absl::FunctionRef<SharedBytes()> request,
                                       absl::FunctionRef<absl::Status(absl::FunctionRef<void()>)> apply) {
  absl::Status shipped;
  // This replica's own answer, and whether the write was shipped before it
  // was applied here (overlapped: its checks had passed).
  absl::Status applied;
  bool shipped_first = false;
  std::vector<std::pair<std::string, absl::Status>> failed;
  bool stale = false;
  {
    absl::ReaderMutexLock lock(&mu_);
    if (log_ == nullptr) return apply([] {});
    std::vector<absl::Status> acks;
    uint64_t lsn = 0;
    shipped = log_->WriteShippingFirst(
        method, request(),
        [&](absl::FunctionRef<void()> ship) {
          applied = apply([&] {
            shipped_first = true;
            ship();
          });
          return applied;
        },
        &acks, &lsn);
    // Every backup holds it (and, applying in LSN order, each before it).
    if (shipped.ok() && lsn != 0 && recent_ != nullptr && !KeepsAckedWrites()) {
      recent_->Release(lsn);
    }
    // Acknowledged by every backup and applied here; or refused here before
    // it was numbered (its own error, or writes in flight at their bound):
    // sent nowhere.
    if (shipped.ok() || acks.empty()) return shipped;
    for (size_t i = 0; i < acks.size() && i < backups_.size(); ++i) {
      if (acks[i].ok()) continue;
      stale = stale || absl::IsFailedPrecondition(acks[i]);
      failed.emplace_back(backups_[i].id, acks[i]);
    }
  }
  if (stale) {
    const std::string why =
        absl::StrCat("a backup of shard ", options_.shard, " refused a write: ", shipped.message());
    if (options_.step_down) options_.step_down(why);
    return absl::UnavailableError(absl::StrCat(why, "; not acknowledged; retry"));
  }
  // Shipped once its checks passed, then not applied here as the backups
  // applied it (a storage error past the checks: DATA_LOSS): this replica
  // no longer matches them. It acknowledges nothing more; a backup, which
  // holds every write acknowledged, takes the shard over. A write whose
  // apply here succeeded but is refused after it (the fence lapsed, an
  // injected fault) leaves the replicas equal: answered, not acknowledged.
  if (shipped_first && absl::IsDataLoss(applied)) {
    const std::string why = absl::StrCat("shard ", options_.shard,
                                         " no longer matches its backups: ", applied.message());
    if (options_.step_down) options_.step_down(why);
    return absl::UnavailableError(absl::StrCat(why, "; not acknowledged; retry"));
  }
  if (!failed.empty()) {
    absl::MutexLock lock(&mu_);
    // Another write may have dropped some of them already.
    PS_RETURN_IF_ERROR(DropBackups(failed));
  }
  // Applied here and on every backup the configuration still lists; this
  // replica's own answer decides (an error past its checks: not acknowledged).
  return applied;
}

bool PrimaryReplication::KeepsAckedWrites() const {
  if (!joiners_.empty() || backups_.size() < most_backups_) return true;
  return backups_.empty() && options_.predecessor_term != 0;
}

void PrimaryReplication::RebuildLog() {
  const uint64_t last = log_ != nullptr ? log_->last_lsn() : last_lsn_;
  last_lsn_ = last;
  const size_t sinks = backups_.size() + joiners_.size();
  if (sinks == 0 && recent_ == nullptr) {
    log_.reset();
    return;
  }
  log_ = std::make_unique<PrimaryLog>(
      term_, last, std::max<size_t>(sinks, 1), PrimaryLog::Options{},
      [this](size_t backup, const BackupLog::Write& write) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // Every write reaches sink 0 once: kept there for catch-ups.
        if (backup == 0 && recent_ != nullptr) recent_->Add(write);
        // Shipping holds mu_ shared: backups_ and joiners_ stay.
        if (backup < backups_.size()) return Send(backups_[backup], write);
        if (backup - backups_.size() < joiners_.size()) {
          return Enqueue(*joiners_[backup - backups_.size()], write);
        }
        return absl::OkStatus();  // no backup: only kept
      },
      [this](size_t backup, const BackupLog::Write& write)
          ABSL_NO_THREAD_SAFETY_ANALYSIS -> std::function<absl::Status()> {
        std::function<absl::Status()> done;
        if (backup < backups_.size()) {
          done = Post(backups_[backup], write);
        } else if (backup - backups_.size() < joiners_.size()) {
          // A joining standby's queue: taken at once.
          absl::Status queued = Enqueue(*joiners_[backup - backups_.size()], write);
          done = [queued] { return queued; };
        } else {
          done = [] { return absl::OkStatus(); };  // no backup: only kept
        }
        // Kept for catch-ups here when handed over; otherwise send keeps it.
        if (backup == 0 && done != nullptr && recent_ != nullptr) recent_->Add(write);
        return done;
      });
}

absl::Status PrimaryReplication::DropBackups(
    const std::vector<std::pair<std::string, absl::Status>>& failed) {
  std::vector<std::string> ids;
  std::string what;
  for (const auto& [id, failure] : failed) {
    for (const Backup& backup : backups_) {
      if (backup.id != id) continue;
      ids.push_back(id);
      absl::StrAppend(&what, what.empty() ? "" : "; ", "backup ", id, " at ", backup.address,
                      ": ", failure.message());
    }
  }
  if (ids.empty()) return absl::OkStatus();
  const std::string key = etcd_keys::ShardKey(options_.shard);
  auto refused = [&](absl::string_view why) {
    return absl::UnavailableError(absl::StrCat("a write was not acknowledged (", what, ") and ",
                                               why, "; not acknowledged; retry"));
  };
  absl::StatusOr<KeyValue> current = options_.etcd->Get(key);
  if (!current.ok()) {
    return refused(absl::StrCat("etcd ", key, " cannot be read: ", current.status().message()));
  }
  absl::StatusOr<ShardClaim> next =
      NextWithoutReplicas(options_.shard, *current, options_.instance_id, ids);
  if (!next.ok()) return refused(next.status().message());
  absl::StatusOr<TxnResult> written = options_.etcd->Txn(
      {next->unchanged, Compare::ValueEquals(key, options_.config->value())}, {next->put});
  if (!written.ok()) return refused(absl::StrCat("etcd failed: ", written.status().message()));
  if (!written->succeeded) return refused(absl::StrCat("etcd ", key, " changed meanwhile"));
  options_.config->Set(next->config.epoch(), next->value);
  std::vector<Backup> kept;
  for (Backup& backup : backups_) {
    if (std::find(ids.begin(), ids.end(), backup.id) == ids.end()) {
      kept.push_back(std::move(backup));
    } else {
      dropped_over_channel_.fetch_add(backup.channel->sent_over_channel());
      dropped_over_grpc_.fetch_add(backup.channel->sent_over_grpc());
    }
  }
  backups_ = std::move(kept);
  RebuildLog();
  if (options_.log) {
    options_.log(absl::StrCat("dropped backup(s) of shard ", options_.shard, " before "
                              "acknowledging a write they did not (", what, "): epoch ",
                              next->config.epoch(), ", ", backups_.size(), " backup(s) left"));
  }
  dropped_.fetch_add(ids.size(), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status PrimaryReplication::Send(const Backup& backup, const BackupLog::Write& write) {
  return Deliver(backup, write, absl::Now() + options_.replicate_timeout);
}

std::function<absl::Status()> PrimaryReplication::Post(const Backup& backup,
                                                       const BackupLog::Write& write) {
  const absl::Time deadline = absl::Now() + options_.replicate_timeout;
  std::shared_ptr<ReplicaChannel::Posted> posted = backup.channel->Post(write);
  if (posted == nullptr) return nullptr;  // sent after the apply instead
  return [this, &backup, &write, posted, deadline]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    absl::Status answer = backup.channel->Await(*posted, deadline);
    // Not applied there (the connection broke, the backup busy): resent as
    // any write is, until the deadline.
    if (absl::IsUnavailable(answer) && absl::Now() < deadline) {
      answer = Deliver(backup, write, deadline);
    }
    return answer;
  };
}

absl::Status PrimaryReplication::Enqueue(Joiner& joiner, const BackupLog::Write& write) {
  const uint64_t bytes = write.request_size() + write.method.size();
  absl::MutexLock lock(&joiner.mu);
  if (!joiner.failed.empty()) return absl::OkStatus();
  if (joiner.queued_bytes + bytes > options_.max_joining_bytes) {
    joiner.failed = absl::StrCat("the writes made since its copy passed ",
                                 options_.max_joining_bytes, " bytes before it caught up");
    joiner.queue.clear();
    joiner.queued_bytes = 0;
    return absl::OkStatus();
  }
  joiner.queued_bytes += bytes;
  joiner.queue.emplace(write.lsn, std::make_shared<const BackupLog::Write>(write));
  return absl::OkStatus();
}

absl::Status PrimaryReplication::Deliver(const Backup& backup, const BackupLog::Write& write,
                                         absl::Time deadline) {
  absl::Status status;
  for (int attempt = 0;; ++attempt) {
    // ABORTED: given up on (by this write before, or by another) and closed.
    status = backup.channel->Send(write, deadline);
    if (!absl::IsUnavailable(status) || absl::Now() >= deadline || attempt >= 1000) break;
    // A backup whose address refuses connections is gone (its process
    // died, or its standby left and was shut down): no use retrying until
    // the timeout, drop it now. Its channel is closed too: a later write
    // waiting for its turn behind this one (which never went out) would
    // otherwise wait for the timeout, holding up this backup's drop.
    if (absl::StatusOr<bool> refused = TcpConnectionRefused(backup.address, absl::Seconds(1));
        refused.ok() && *refused) {
      status = absl::UnavailableError(absl::StrCat("backup at ", backup.address,
                                                   " refuses connections: ", status.message()));
      backup.channel->Close(std::string(status.message()));
      return status;
    }
    absl::SleepFor(absl::Milliseconds(10));
  }
  // It left its shard (ABORTED): the same, at once (a closed channel's
  // answer is ABORTED too: closing it again does nothing).
  if (absl::IsAborted(status)) backup.channel->Close(std::string(status.message()));
  return status;
}

uint64_t PrimaryReplication::sent_over_channel() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t sent = dropped_over_channel_.load();
  for (const Backup& backup : backups_) sent += backup.channel->sent_over_channel();
  return sent;
}

uint64_t PrimaryReplication::sent_over_grpc() const {
  absl::ReaderMutexLock lock(&mu_);
  uint64_t sent = dropped_over_grpc_.load();
  for (const Backup& backup : backups_) sent += backup.channel->sent_over_grpc();
  return sent;
}

absl::StatusOr<v1::AttachStandbyResponse> PrimaryReplication::Attach(
    const v1::AttachStandbyRequest& request) {
  if (request.shard() != options_.shard) {
    return absl::InvalidArgumentError(
        absl::StrCat("this server holds shard ", options_.shard, ", not ", request.shard()));
  }
  if (request.check_join()) {
    PS_RETURN_IF_ERROR(CheckJoin(request.instance_id()));
    return v1::AttachStandbyResponse();
  }
  if (request.address().empty() || request.address().size() > 300) {
    return absl::InvalidArgumentError("a standby's address must be 1-300 bytes");
  }
  // Writes wait here only while the state is copied in memory (not at all
  // for a standby that catches up from its own LSN).
  StoreSnapshot snapshot;
  bool catch_up = false;
  std::shared_ptr<Joiner> joiner = std::make_shared<Joiner>();
  {
    absl::MutexLock lock(&mu_);
    // A standby let go while joining attaches again: its old joiner (which
    // its thread may not have taken out yet) gives way to the new one.
    std::shared_ptr<Joiner> replaced;
    for (const std::shared_ptr<Joiner>& other : joiners_) {
      if (other->backup.id != request.instance_id()) continue;
      absl::MutexLock joiner_lock(&other->mu);
      if (other->failed.empty()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "standby ", request.instance_id(), " is joining shard ", options_.shard, " already"));
      }
      replaced = other;
    }
    if (replaced != nullptr) RemoveJoiner(replaced, /*why=*/"");
    for (auto it = let_go_.begin(); it != let_go_.end(); ++it) {
      if (it->first == request.instance_id()) {
        let_go_.erase(it);
        break;
      }
    }
    if (backups_.size() + joiners_.size() >= options_.max_standbys) {
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard, " has ", backups_.size(), " backups and ", joiners_.size(),
          " joining, the most --max_standbys=", options_.max_standbys,
          " allows; attach to another shard"));
    }
    for (const Backup& backup : backups_) {
      if (backup.id == request.instance_id()) {
        return absl::FailedPreconditionError(
            absl::StrCat("standby ", request.instance_id(), " is a backup of shard ",
                         options_.shard, " already"));
      }
    }
    // This server may add it (the holder, the standby not listed): checked
    // now, so that a copy is not sent for nothing; written once it caught up.
    const std::string key = etcd_keys::ShardKey(options_.shard);
    PS_ASSIGN_OR_RETURN(KeyValue current, options_.etcd->Get(key));
    PS_RETURN_IF_ERROR(
        NextWithReplica(options_.shard, current, options_.instance_id, request.instance_id())
            .status());
    const uint64_t last = log_ != nullptr ? log_->last_lsn() : last_lsn_;
    if (request.have_epoch() != 0) {
      // It holds the shard up to an LSN already: only the writes after it,
      // when this primary still keeps them and the state is its lineage's.
      absl::StatusOr<std::vector<RecentWrites::Kept>> after = WritesAfter(request, last);
      if (after.ok()) {
        catch_up = true;
        joiner->from_lsn = request.have_lsn();
        absl::MutexLock joiner_lock(&joiner->mu);
        for (RecentWrites::Kept& write : *after) {
          joiner->queued_bytes += RecentWrites::Bytes(*write);
          joiner->queue.emplace(write->lsn, std::move(write));
        }
      } else if (options_.log) {
        options_.log(absl::StrCat("standby ", request.instance_id(), " holds shard ",
                                  options_.shard, " up to LSN ", request.have_lsn(), " of term ",
                                  request.have_epoch(), " but is sent a full copy: ",
                                  after.status().message()));
      }
    }
    if (!catch_up) {
      PS_ASSIGN_OR_RETURN(snapshot, options_.dispatcher->Snapshot());
      joiner->from_lsn = last;
    }
    joiner->backup.id = request.instance_id();
    joiner->backup.address = request.address();
    joiner->backup.stub =
        v1::ParameterServer::NewStub(PeerChannel(joiner->backup.address, options_.peer));
    // Its first LSN is the first after the copy, sent in order by CatchUp.
    joiner->backup.channel = std::make_unique<ReplicaChannel>(
        options_.shard, joiner->backup.address, joiner->backup.stub.get(), joiner->from_lsn + 1,
        options_.channel);
    joiners_.push_back(joiner);
    RebuildLog();
  }
  v1::AttachStandbyResponse response;
  response.set_epoch(term_);
  response.set_last_lsn(joiner->from_lsn);
  std::string what;  // for the log
  if (catch_up) {
    rejoined_without_copy_.fetch_add(1, std::memory_order_relaxed);
    response.set_catch_up(true);
    what = absl::StrCat(" rejoining shard ", options_.shard, " from its own LSN ",
                        joiner->from_lsn, " (term ", request.have_epoch(),
                        "): no copy; the writes after it");
  } else {
    // Writes go on: the ones after from_lsn queue for the joiner.
    CheckpointWriteOptions write_options = options_.write_options;
    write_options.epoch = options_.config->epoch();
    absl::StatusOr<std::vector<v1::SnapshotFile>> files =
        SnapshotToFiles(snapshot, options_.shard, write_options);
    if (!files.ok()) {
      absl::MutexLock lock(&mu_);
      RemoveJoiner(joiner, /*why=*/"");  // the standby gets the error
      return files.status();
    }
    for (v1::SnapshotFile& file : *files) *response.add_files() = std::move(file);
    what = absl::StrCat(" joining shard ", options_.shard, " at LSN ", joiner->from_lsn,
                        ": its copy is sent; the writes made since");
  }
  if (options_.log) {
    options_.log(absl::StrCat("standby ", joiner->backup.id, " at ", joiner->backup.address, what,
                              " are queued for it, and it is listed once it holds them all"));
  }
  {
    absl::MutexLock lock(&threads_mu_);
    threads_.emplace_back([this, joiner] { CatchUp(joiner); });
  }
  return response;
}

void PrimaryReplication::CatchUp(std::shared_ptr<Joiner> joiner) {
  uint64_t next = joiner->from_lsn + 1;
  uint64_t sent = 0;
  std::string why;
  // The write numbered `lsn`, out of the queue (null: not queued), and the
  // reason the joiner was let go ("": it was not).
  auto take = [&](uint64_t lsn) -> std::shared_ptr<const BackupLog::Write> {
    absl::MutexLock lock(&joiner->mu);
    if (!joiner->failed.empty()) {
      why = joiner->failed;
      return nullptr;
    }
    auto it = joiner->queue.find(lsn);
    if (it == joiner->queue.end()) return nullptr;
    std::shared_ptr<const BackupLog::Write> write = std::move(it->second);
    joiner->queued_bytes -= write->request_size() + write->method.size();
    joiner->queue.erase(it);
    return write;
  };
  // 1. Writes go on while the standby loads its copy: the first write made
  //    since (if any yet) is delivered once it has (join_timeout).
  {
    absl::MutexLock lock(&joiner->mu);
    auto ready = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(joiner->mu) {
      return !joiner->failed.empty() || joiner->queue.count(next) > 0 || stopping_.load();
    };
    joiner->mu.AwaitWithTimeout(absl::Condition(&ready), options_.join_first_write_wait);
  }
  if (stopping_.load()) return;
  if (std::shared_ptr<const BackupLog::Write> first = take(next); first != nullptr) {
    absl::Status delivered = Deliver(joiner->backup, *first, absl::Now() + options_.join_timeout);
    if (delivered.ok()) {
      ++next;
      ++sent;
    } else {
      why = absl::StrCat("write ", next, " was not delivered: ", delivered.ToString());
    }
  }
  // 2. Writes held (they cannot outrun it): the rest of the queue, then it
  //    is listed and every later write waits for it.
  absl::MutexLock lock(&mu_);
  if (stopping_.load()) return;
  const uint64_t last = log_ != nullptr ? log_->last_lsn() : last_lsn_;
  while (why.empty() && next <= last) {
    std::shared_ptr<const BackupLog::Write> write = take(next);
    if (write == nullptr) {
      if (why.empty()) why = absl::StrCat("write ", next, " is not in its queue");
      break;
    }
    absl::Status delivered =
        Deliver(joiner->backup, *write, absl::Now() + options_.replicate_timeout);
    if (!delivered.ok()) {
      why = absl::StrCat("write ", next, " was not delivered: ", delivered.ToString());
      break;
    }
    ++next;
    ++sent;
  }
  if (why.empty()) {
    if (absl::Status listed = List(joiner); listed.ok()) {
      joined_.fetch_add(1, std::memory_order_relaxed);
      caught_up_writes_.fetch_add(sent, std::memory_order_relaxed);
      if (options_.log) {
        options_.log(absl::StrCat("standby ", backups_.back().id, " at ", backups_.back().address,
                                  " caught up on ", sent, " writes made during its copy and is "
                                  "listed as backup ", backups_.size(), " of shard ",
                                  options_.shard, " at LSN ", last, ": epoch ",
                                  options_.config->epoch(), ", term ", term_));
      }
      return;
    } else {
      why = absl::StrCat("it caught up but was not listed: ", listed.message());
    }
  }
  RemoveJoiner(joiner, why);
  if (options_.log) {
    options_.log(absl::StrCat("standby ", joiner->backup.id, " at ", joiner->backup.address,
                              " did not catch up on shard ", options_.shard, " (", why,
                              "); let go unlisted: it copies the shard again"));
  }
}

absl::Status PrimaryReplication::List(const std::shared_ptr<Joiner>& joiner) {
  const std::string key = etcd_keys::ShardKey(options_.shard);
  PS_ASSIGN_OR_RETURN(KeyValue current, options_.etcd->Get(key));
  PS_ASSIGN_OR_RETURN(
      ShardClaim next,
      NextWithReplica(options_.shard, current, options_.instance_id, joiner->backup.id));
  PS_ASSIGN_OR_RETURN(
      TxnResult written,
      options_.etcd->Txn({next.unchanged, Compare::ValueEquals(key, options_.config->value())},
                         {next.put}));
  if (!written.succeeded) {
    return absl::FailedPreconditionError(
        absl::StrCat("etcd ", key, " changed while the standby joined"));
  }
  options_.config->Set(next.config.epoch(), next.value);
  backups_.push_back(std::move(joiner->backup));
  most_backups_ = std::max(most_backups_, backups_.size());
  joiners_.erase(std::find(joiners_.begin(), joiners_.end(), joiner));
  RebuildLog();
  return absl::OkStatus();
}

void PrimaryReplication::RemoveJoiner(const std::shared_ptr<Joiner>& joiner,
                                      const std::string& why) {
  auto it = std::find(joiners_.begin(), joiners_.end(), joiner);
  if (it == joiners_.end()) return;
  joiners_.erase(it);
  RebuildLog();
  if (why.empty()) return;
  for (auto old = let_go_.begin(); old != let_go_.end(); ++old) {
    if (old->first == joiner->backup.id) {
      let_go_.erase(old);
      break;
    }
  }
  let_go_.emplace_back(joiner->backup.id, why);
  if (let_go_.size() > kMaxLetGo) let_go_.pop_front();
}

absl::StatusOr<std::vector<RecentWrites::Kept>> PrimaryReplication::WritesAfter(
    const v1::AttachStandbyRequest& request, uint64_t last) const {
  if (recent_ == nullptr) {
    return absl::FailedPreconditionError("this primary keeps no writes (--catch_up_bytes=0)");
  }
  const uint64_t lsn = request.have_lsn();
  // This term's writes were all numbered (and shipped in that order) since
  // base_lsn_: a replica that applied them up to `lsn` holds this
  // primary's state at `lsn`. At base_lsn_ this primary held its
  // predecessor's state, as did any other backup of it that applied
  // exactly as far.
  const bool ours = request.have_epoch() == term_ && lsn >= base_lsn_ && lsn <= last;
  const bool predecessors = options_.predecessor_term != 0 &&
                            request.have_epoch() == options_.predecessor_term && lsn == base_lsn_;
  if (!ours && !predecessors) {
    return absl::FailedPreconditionError(absl::StrCat(
        "its state is not of this primary's lineage (this primary: term ", term_, " from LSN ",
        base_lsn_, ", now at LSN ", last,
        options_.predecessor_term != 0
            ? absl::StrCat(", after term ", options_.predecessor_term, " up to LSN ", base_lsn_)
            : std::string(),
        ")"));
  }
  PS_ASSIGN_OR_RETURN(std::vector<RecentWrites::Kept> after, recent_->Since(lsn, last));
  uint64_t bytes = 0;
  for (const RecentWrites::Kept& write : after) bytes += RecentWrites::Bytes(*write);
  if (bytes > options_.max_joining_bytes) {
    return absl::FailedPreconditionError(absl::StrCat("the ", after.size(), " writes after it (",
                                                      bytes, " bytes) pass --max_joining_bytes=",
                                                      options_.max_joining_bytes));
  }
  return after;
}

absl::Status PrimaryReplication::CheckJoin(const std::string& instance_id) const {
  auto let_go = [&](absl::string_view why) {
    return absl::FailedPreconditionError(
        absl::StrCat("the primary of shard ", options_.shard, " let standby ", instance_id,
                     " go while it joined: ", why, "; copy the shard again"));
  };
  absl::ReaderMutexLock lock(&mu_);
  for (const Backup& backup : backups_) {
    if (backup.id == instance_id) return absl::OkStatus();
  }
  for (const std::shared_ptr<Joiner>& joiner : joiners_) {
    if (joiner->backup.id != instance_id) continue;
    absl::MutexLock joiner_lock(&joiner->mu);
    if (joiner->failed.empty()) return absl::OkStatus();
    return let_go(joiner->failed);
  }
  for (const auto& [id, why] : let_go_) {
    if (id == instance_id) return let_go(why);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("standby ", instance_id, " is neither joining shard ", options_.shard,
                   " nor a backup of it (dropped since, or this primary never attached it); "
                   "copy the shard again"));
}

// ---- backup -------------------------------------------------------------------------

void BackupReplication::Attached(uint32_t shard, uint64_t epoch, uint64_t last_lsn) {
  auto log = std::make_shared<BackupLog>(
      epoch, last_lsn, BackupLog::Options{}, [this](const BackupLog::Write& write) {
        absl::Status applied;
        std::string storage;
        const absl::string_view request = write.request_view(&storage);
        if (write.method == "SendGrads") {
          applied = ApplyReplicatedPush(*dispatcher_, request, write.finite_scan.get());
        } else if (IsMoveWrite(write.method) && apply_move_write_) {
          applied = apply_move_write_(write.method, request);
        } else {
          applied = dispatcher_->ApplyWrite(write.method, request);
        }
        if (!applied.ok()) damaged_.store(true);  // no catch-up from this state
        return applied;
      });
  damaged_.store(false);
  absl::MutexLock lock(&mu_);
  shard_ = shard;
  term_ = epoch;
  log_ = std::move(log);
  held_.reset();
}

void BackupReplication::Detach() {
  std::shared_ptr<BackupLog> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(log_);
  }
  // Every write of the old log is refused from now on; one being applied
  // finishes first.
  if (old == nullptr) return;
  old->SetEpoch(std::numeric_limits<uint64_t>::max());
  absl::MutexLock lock(&mu_);
  if (!damaged_.load()) held_ = Held{shard_, term_, old->applied_lsn()};
}

std::optional<BackupReplication::Held> BackupReplication::held() const {
  absl::MutexLock lock(&mu_);
  return held_;
}

void BackupReplication::Forget() {
  absl::MutexLock lock(&mu_);
  held_.reset();
}

uint64_t BackupReplication::term() const {
  absl::MutexLock lock(&mu_);
  return term_;
}

std::shared_ptr<BackupLog> BackupReplication::log() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

absl::Status BackupReplication::Replicate(const v1::ReplicateRequest& request,
                                          absl::Duration wait) {
  BackupLog::Write write;
  write.epoch = request.epoch();
  write.lsn = request.lsn();
  write.method = request.method();
  write.request = request.request();
  return Deliver(request.shard(), std::move(write), wait);
}

absl::Status BackupReplication::Deliver(uint32_t shard_asked, BackupLog::Write write,
                                        absl::Duration wait) {
  std::shared_ptr<BackupLog> log;
  uint32_t shard = 0;
  {
    absl::MutexLock lock(&mu_);
    if (!left_.empty()) return absl::AbortedError(left_);
    auto loaded = [this]() ABSL_SHARED_LOCKS_REQUIRED(mu_) { return log_ != nullptr; };
    if (!mu_.AwaitWithTimeout(absl::Condition(&loaded), wait)) {
      return absl::UnavailableError(
          absl::StrCat("the copy of shard ", shard_asked, " is not loaded yet; retry"));
    }
    log = log_;
    shard = shard_;
  }
  if (shard_asked != shard) {
    return absl::InvalidArgumentError(
        absl::StrCat("this server is a backup of shard ", shard, ", not ", shard_asked));
  }
  absl::Status delivered = log->Deliver(std::move(write), absl::Now() + wait);
  // Refused by a log this backup detached from (it is loading a fresh copy):
  // the primary retries once the copy is loaded.
  if (!delivered.ok() && this->log() != log) {
    return absl::UnavailableError(absl::StrCat(
        "this backup is loading a fresh copy of shard ", shard, "; retry"));
  }
  return delivered;
}

void BackupReplication::Leave(const std::string& why) {
  absl::MutexLock lock(&mu_);
  left_ = absl::StrCat("this backup left shard ", shard_, ": ", why);
}

void BackupReplication::SetEpoch(uint64_t epoch) {
  if (std::shared_ptr<BackupLog> current = log(); current != nullptr) current->SetEpoch(epoch);
}

uint64_t BackupReplication::applied_lsn() const {
  std::shared_ptr<BackupLog> current = log();
  return current != nullptr ? current->applied_lsn() : 0;
}

bool PrimaryProbe::Refuses(const KeyValue& entry) {
  absl::StatusOr<etcd_keys::ServerEntry> server = etcd_keys::ParseServerValue(entry.value);
  if (!server.ok()) return false;
  if (channel_ == nullptr || server->address != address_) {
    address_ = server->address;
    channel_ = PeerChannel(address_, peer_);
  }
  if (channel_->GetState(/*try_to_connect=*/true) == GRPC_CHANNEL_READY) return false;
  absl::StatusOr<bool> refused = TcpConnectionRefused(address_, absl::Seconds(1));
  return refused.ok() && *refused;
}

}  // namespace pserver
