// The C ABI: the checkpoint reader, forwarding to pserver::CheckpointSet
// (cc/core/checkpoint_set.h), offline resharding (cc/core/reshard.h), and
// live moves (cc/server/move_coordinator.h).
#include <unistd.h>

#include <cerrno>

#include "absl/types/span.h"
#include "cc/capi/internal.h"
#include "cc/core/reshard.h"
#include "cc/core/status_macros.h"
#include "cc/server/move_coordinator.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"

using pserver_capi::NameBytes;
using pserver_capi::NameOut;
using pserver_capi::Null;
using pserver_capi::Run;

namespace {

absl::StatusOr<const pserver::CheckpointSet*> SetOf(const pserver_checkpoint_reader_t* reader) {
  if (reader == nullptr) return Null("reader");
  return reader->rep.get();
}

// Name i of `names`, or NULL (and 0) when i is out of range.
const char* NameAt(const std::vector<std::string>* names, size_t i, size_t* name_len) {
  return NameOut(names != nullptr && i < names->size() ? &(*names)[i] : nullptr, name_len);
}

// Writes `line` and a newline to `fd`; best effort (progress only).
void WriteLine(int fd, const std::string& line) {
  const std::string out = line + "\n";
  for (size_t at = 0; at < out.size();) {
    const ssize_t n = ::write(fd, out.data() + at, out.size() - at);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    at += static_cast<size_t>(n);
  }
}

// pserver_cluster_scale and pserver_cluster_scale_with: the rest of
// `options` from the arguments, then ScaleCluster.
absl::Status Scale(pserver::ScaleOptions options, uint32_t num_servers, int64_t timeout_ms,
                   int32_t progress_fd, uint32_t* from, uint64_t* version,
                   uint64_t* blocks_moved, uint64_t* bytes_moved) {
  if (timeout_ms <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("timeout_ms must be > 0, got ", timeout_ms));
  }
  options.to = num_servers;
  options.timeout = absl::Milliseconds(timeout_ms);
  if (progress_fd >= 0) {
    options.progress = [progress_fd](const std::string& line) { WriteLine(progress_fd, line); };
  }
  PS_ASSIGN_OR_RETURN(pserver::ScaleResult result, pserver::ScaleCluster(options));
  if (from != nullptr) *from = result.from;
  if (version != nullptr) *version = result.version;
  if (blocks_moved != nullptr) *blocks_moved = result.blocks_moved;
  if (bytes_moved != nullptr) *bytes_moved = result.bytes_moved;
  return absl::OkStatus();
}

}  // namespace

extern "C" {

void pserver_checkpoint_reshard(const char* from, const char* to, uint32_t num_servers,
                                int32_t progress_fd, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (from == nullptr) return Null("from");
    if (to == nullptr) return Null("to");
    pserver::ReshardOptions options;
    options.num_servers = num_servers;
    if (progress_fd >= 0) {
      options.progress = [progress_fd](const std::string& line) { WriteLine(progress_fd, line); };
    }
    return pserver::ReshardCheckpoints(from, to, options).status();
  });
}

void pserver_cluster_scale(const char* etcd_endpoints, const char* cluster, uint32_t num_servers,
                           int64_t timeout_ms, int32_t progress_fd, uint32_t* from,
                           uint64_t* version, uint64_t* blocks_moved, uint64_t* bytes_moved,
                           pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (etcd_endpoints == nullptr) return Null("etcd_endpoints");
    if (cluster == nullptr) return Null("cluster");
    pserver::ScaleOptions options;
    options.etcd_endpoints = absl::StrSplit(etcd_endpoints, ',', absl::SkipEmpty());
    options.cluster = cluster;
    return Scale(std::move(options), num_servers, timeout_ms, progress_fd, from, version,
                 blocks_moved, bytes_moved);
  });
}

void pserver_cluster_scale_with(const pserver_client_options_t* client_options,
                                uint32_t num_servers, int64_t timeout_ms, int32_t progress_fd,
                                uint32_t* from, uint64_t* version, uint64_t* blocks_moved,
                                uint64_t* bytes_moved, pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    if (client_options == nullptr) return Null("options");
    const pserver::ClientOptions& client = client_options->rep;
    if (client.etcd_endpoints.empty()) {
      return absl::InvalidArgumentError(
          "the options name no etcd (pserver_client_options_set_etcd): the placement lives "
          "there");
    }
    pserver::ScaleOptions options;
    options.etcd_endpoints = client.etcd_endpoints;
    options.cluster = client.cluster;
    options.tls = client.tls;
    options.token = client.token;
    options.etcd_tls = client.etcd_tls;
    return Scale(std::move(options), num_servers, timeout_ms, progress_fd, from, version,
                 blocks_moved, bytes_moved);
  });
}

pserver_checkpoint_reader_t* pserver_checkpoint_reader_new(const char* path,
                                                           pserver_status_t* status) {
  pserver_checkpoint_reader_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    if (path == nullptr) return Null("path");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::CheckpointSet> set,
                        pserver::CheckpointSet::Open(path));
    out = new pserver_checkpoint_reader_t{std::move(set)};
    return absl::OkStatus();
  });
  return out;
}

void pserver_checkpoint_reader_delete(pserver_checkpoint_reader_t* reader) { delete reader; }

size_t pserver_checkpoint_reader_num_checkpoints(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->rep->num_checkpoints();
}

const char* pserver_checkpoint_reader_checkpoint_path(const pserver_checkpoint_reader_t* reader,
                                                      size_t i) {
  if (reader == nullptr || i >= reader->rep->num_checkpoints()) return nullptr;
  return reader->rep->checkpoint_path(i).c_str();
}

size_t pserver_checkpoint_reader_num_params(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->rep->param_names().size();
}

const char* pserver_checkpoint_reader_param_name(const pserver_checkpoint_reader_t* reader,
                                                 size_t i, size_t* name_len) {
  return NameAt(reader == nullptr ? nullptr : &reader->rep->param_names(), i, name_len);
}

void pserver_checkpoint_reader_param_info(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, int32_t* dtype,
                                          int64_t* shape, size_t shape_capacity, size_t* ndim,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(const pserver::CheckpointSet* set, SetOf(reader));
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::CheckpointSet::ParamInfo info, set->param_info(n));
    if (dtype != nullptr) *dtype = static_cast<int32_t>(info.type);
    pserver_capi::WriteShape(info.shape, shape, shape_capacity, ndim);
    return absl::OkStatus();
  });
}

void pserver_checkpoint_reader_read(const pserver_checkpoint_reader_t* reader, const char* name,
                                    size_t name_len, int32_t dtype, void* out, size_t out_size,
                                    pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(const pserver::CheckpointSet* set, SetOf(reader));
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::CheckpointSet::ParamInfo info, set->param_info(n));
    PS_RETURN_IF_ERROR(pserver_capi::CheckDtype(dtype));
    if (out == nullptr && out_size != 0) return Null("out");
    PS_RETURN_IF_ERROR(pserver_capi::CheckBuffer(pserver_capi::ParamWhat(n), info.type, info.shape,
                                                 dtype, out_size));
    return set->ReadParam(n, absl::Span<char>(static_cast<char*>(out), out_size));
  });
}

void pserver_checkpoint_reader_verify(const pserver_checkpoint_reader_t* reader,
                                      pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(const pserver::CheckpointSet* set, SetOf(reader));
    return set->Verify();
  });
}

size_t pserver_checkpoint_reader_num_tables(const pserver_checkpoint_reader_t* reader) {
  return reader == nullptr ? 0 : reader->rep->table_names().size();
}

const char* pserver_checkpoint_reader_table_name(const pserver_checkpoint_reader_t* reader,
                                                 size_t i, size_t* name_len) {
  return NameAt(reader == nullptr ? nullptr : &reader->rep->table_names(), i, name_len);
}

void pserver_checkpoint_reader_table_info(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, uint32_t* dim,
                                          int32_t* dtype, uint64_t* rows,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(const pserver::CheckpointSet* set, SetOf(reader));
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    PS_ASSIGN_OR_RETURN(pserver::CheckpointSet::TableInfo info, set->table_info(n));
    if (dim != nullptr) *dim = info.dim;
    if (dtype != nullptr) *dtype = static_cast<int32_t>(info.type);
    if (rows != nullptr) *rows = info.rows;
    return absl::OkStatus();
  });
}

void pserver_checkpoint_reader_read_table(const pserver_checkpoint_reader_t* reader,
                                          const char* name, size_t name_len, uint64_t* keys,
                                          size_t keys_size, void* values, size_t values_size,
                                          pserver_status_t* status) {
  Run(status, [&]() -> absl::Status {
    PS_ASSIGN_OR_RETURN(const pserver::CheckpointSet* set, SetOf(reader));
    PS_ASSIGN_OR_RETURN(const std::string n, NameBytes(name, name_len));
    return set->ReadTable(n, keys, keys_size, values, values_size);
  });
}

}  // extern "C"
