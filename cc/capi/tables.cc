// The C ABI: sparse tables, their KV workers, and worker groups
// (collectives), all made from a client.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "cc/capi/internal.h"
#include "cc/core/status_macros.h"

using pserver_capi::Alive;
using pserver_capi::CallOf;
using pserver_capi::Null;
using pserver_capi::Run;

namespace {

absl::Span<const uint64_t> KeySpan(const uint64_t* keys, size_t n) {
  return n == 0 ? absl::Span<const uint64_t>() : absl::Span<const uint64_t>(keys, n);
}

absl::Span<char> OutBytes(void* out, size_t size) {
  return absl::Span<char>(static_cast<char*>(out), size);
}

absl::string_view InBytes(const void* data, size_t size) {
  return absl::string_view(size == 0 ? "" : static_cast<const char*>(data), size);
}

// Rows per chunk of `table`.
size_t ChunkRows(const pserver::Table& table) {
  return std::max<uint32_t>(1, table.config().chunk_size());
}

// Checks the `n` keys of a call to `verb` `table` and the caller's buffer
// of rows: exactly `rows` rows (`unit` in the error) of the table.
absl::Status CheckRows(const pserver::Table& table, const char* verb, const uint64_t* keys,
                       size_t n, const void* data, size_t size, size_t rows, const char* unit) {
  if (keys == nullptr && n != 0) return Null("keys");
  if (data == nullptr && size != 0) return Null("buffer");
  const size_t want = rows * table.row_bytes();
  if (size != want) {
    return absl::InvalidArgumentError(
        absl::StrCat(verb, " table '", table.name(), "': ", rows, " ", unit, " of ", table.dim(),
                     " ", pserver::ElementTypeName(table.element_type()), " need ", want,
                     " bytes, the buffer has ", size));
  }
  return absl::OkStatus();
}

// "<what> is NULL", or UNAVAILABLE once the handle's local cluster stopped.
template <typename T>
absl::Status AliveMade(const pserver_capi::MadeFromClient<T>* handle, const char* what) {
  if (handle == nullptr) return Null(what);
  return pserver_capi::AliveRef(handle->ref);
}

absl::Status AliveTable(const pserver_table_t* table) { return AliveMade(table, "table"); }
absl::Status AliveWorker(const pserver_kv_worker_t* worker) { return AliveMade(worker, "worker"); }
absl::Status AliveGroup(const pserver_group_t* group) { return AliveMade(group, "group"); }

// Copies a collective's result back into the caller's buffer (the view of
// it was copied on the first write: the buffer changes only on success).
void CopyBack(const pserver::Tensor& t, void* data, size_t size) {
  if (t.byte_size() > 0 && t.byte_size() == size && t.data() != data) {
    std::memcpy(data, t.data(), size);
  }
}

}  // namespace

extern "C" {

// ------------------------------------------------------------------ tables

pserver_table_t* pserver_client_create_table(pserver_client_t* client, const char* name,
                                             size_t name_len, const pserver_table_config_t* config,
                                             pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  pserver_table_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, pserver_capi::NameOf(name, name_len, "table"));
    pserver::v1::TableConfig defaults;
    defaults.set_dim(1);
    PS_ASSIGN_OR_RETURN(pserver::Table table,
                        pserver::Table::Create(*client->rep, std::move(n),
                                               config == nullptr ? defaults : config->rep, call));
    auto handle = std::make_unique<pserver_table_t>();
    handle->ref = pserver_capi::ClientRef{client->cluster, client->rep};
    handle->rep = std::make_unique<pserver::Table>(std::move(table));
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_table_delete(pserver_table_t* table) {
  delete table;  // NULL is fine; destructors do not throw
}

const char* pserver_table_name(const pserver_table_t* table, size_t* name_len) {
  static const std::string* const kNone = new std::string();
  return pserver_capi::NameOut(table == nullptr ? kNone : &table->rep->name(), name_len);
}

uint32_t pserver_table_dim(const pserver_table_t* table) {
  return table == nullptr ? 0 : table->rep->dim();
}

int32_t pserver_table_dtype(const pserver_table_t* table) {
  return table == nullptr ? PSERVER_DTYPE_UNSPECIFIED
                          : static_cast<int32_t>(table->rep->element_type());
}

size_t pserver_table_row_bytes(const pserver_table_t* table) {
  return table == nullptr ? 0 : table->rep->row_bytes();
}

uint32_t pserver_table_chunk_size(const pserver_table_t* table) {
  return table == nullptr ? 0 : static_cast<uint32_t>(ChunkRows(*table->rep));
}

int32_t pserver_table_server_of(const pserver_table_t* table, uint64_t key,
                                pserver_status_t* status) {
  int32_t server = -1;
  Run(status, [&]() -> absl::Status {
    if (table == nullptr) return Null("table");
    PS_ASSIGN_OR_RETURN(int s, table->rep->ServerOf(key));
    server = s;
    return absl::OkStatus();
  });
  return server;
}

void pserver_table_pull(pserver_table_t* table, const uint64_t* keys, size_t n, void* out,
                        size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    PS_RETURN_IF_ERROR(CheckRows(*table->rep, "pull from", keys, n, out, out_size, n, "keys"));
    return table->rep->Pull(KeySpan(keys, n), OutBytes(out, out_size), call);
  });
}

void pserver_table_push(pserver_table_t* table, const uint64_t* keys, size_t n, const void* data,
                        size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    PS_RETURN_IF_ERROR(CheckRows(*table->rep, "push to", keys, n, data, size, n, "keys"));
    return table->rep->Push(KeySpan(keys, n), InBytes(data, size), call);
  });
}

size_t pserver_table_stats(pserver_table_t* table, pserver_table_stats_t* out, size_t capacity,
                           size_t struct_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  size_t n = 0;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    if (out == nullptr && capacity != 0) return Null("out");
    PS_ASSIGN_OR_RETURN(std::vector<pserver::v1::TableStats> stats, table->rep->Stats(call));
    n = pserver_capi::WriteStructs(
        stats, out, capacity, struct_size,
        [](const pserver::v1::TableStats& s, size_t i, pserver_table_stats_t* c) {
          c->server = static_cast<uint32_t>(i);
          c->rows = s.rows();
          c->bytes = s.bytes();
          c->evictions = s.evictions();
          c->pending_keys = s.pending_keys();
          c->keys_pulled = s.keys_pulled();
          c->keys_pushed = s.keys_pushed();
          c->min_clock = s.min_clock();
          c->workers = s.workers();
        });
    return absl::OkStatus();
  });
  return n;
}

// -------------------------------------------------------------- KV workers

pserver_kv_worker_t* pserver_kv_worker_join(pserver_table_t* table, const char* worker_id,
                                            pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  pserver_kv_worker_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveTable(table));
    if (worker_id == nullptr) return Null("worker_id");
    PS_ASSIGN_OR_RETURN(std::unique_ptr<pserver::KvWorker> worker,
                        pserver::KvWorker::Join(*table->rep, worker_id, call));
    auto handle = std::make_unique<pserver_kv_worker_t>();
    handle->ref = table->ref;
    handle->rep = std::move(worker);
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_kv_worker_delete(pserver_kv_worker_t* worker) {
  try {
    if (worker == nullptr) return;
    if (worker->rep != nullptr && pserver_capi::AliveRef(worker->ref).ok()) {
      // Leave with a bounded wait; the destructor then has nothing to do.
      pserver::CallOptions call;
      call.deadline = absl::Now() + absl::Seconds(5);
      worker->rep->Leave(call).IgnoreError();
    }
    delete worker;
  } catch (...) {
  }
}

const char* pserver_kv_worker_id(const pserver_kv_worker_t* worker) {
  return worker == nullptr ? "" : worker->rep->id().c_str();
}

int64_t pserver_kv_worker_current_clock(const pserver_kv_worker_t* worker) {
  return worker == nullptr ? 0 : worker->rep->clock();
}

void pserver_kv_worker_get(pserver_kv_worker_t* worker, const uint64_t* keys, size_t n, void* out,
                           size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(
        CheckRows(worker->rep->table(), "get from", keys, n, out, out_size, n, "keys"));
    return worker->rep->Get(KeySpan(keys, n), OutBytes(out, out_size), call);
  });
}

void pserver_kv_worker_add(pserver_kv_worker_t* worker, const uint64_t* keys, size_t n,
                           const void* data, size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    PS_RETURN_IF_ERROR(CheckRows(worker->rep->table(), "add to", keys, n, data, size, n, "keys"));
    return worker->rep->Add(KeySpan(keys, n), InBytes(data, size), call);
  });
}

void pserver_kv_worker_get_chunk(pserver_kv_worker_t* worker, const uint64_t* chunk_ids, size_t n,
                                 void* out, size_t out_size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    const pserver::Table& t = worker->rep->table();
    PS_RETURN_IF_ERROR(
        CheckRows(t, "get chunks from", chunk_ids, n, out, out_size, n * ChunkRows(t), "rows"));
    return worker->rep->GetChunk(KeySpan(chunk_ids, n), OutBytes(out, out_size), call);
  });
}

void pserver_kv_worker_add_chunk(pserver_kv_worker_t* worker, const uint64_t* chunk_ids, size_t n,
                                 const void* data, size_t size, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    const pserver::Table& t = worker->rep->table();
    PS_RETURN_IF_ERROR(
        CheckRows(t, "add chunks to", chunk_ids, n, data, size, n * ChunkRows(t), "rows"));
    return worker->rep->AddChunk(KeySpan(chunk_ids, n), InBytes(data, size), call);
  });
}

void pserver_kv_worker_clock(pserver_kv_worker_t* worker, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    return worker->rep->Clock(call);
  });
}

void pserver_kv_worker_leave(pserver_kv_worker_t* worker, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveWorker(worker));
    return worker->rep->Leave(call);
  });
}

// ------------------------------------------------------------- collectives

pserver_group_t* pserver_group_new(pserver_client_t* client, const char* name, uint32_t size,
                                   const char* participant, pserver_status_t* status) {
  pserver_group_t* out = nullptr;
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(Alive(client));
    PS_ASSIGN_OR_RETURN(std::string n, pserver_capi::Name(name));
    if (n.empty()) return absl::InvalidArgumentError("a group needs a name");
    if (size < 1) return absl::InvalidArgumentError("a group needs at least 1 member");
    if (participant == nullptr) return Null("participant");
    if (*participant == '\0') {
      return absl::InvalidArgumentError("a group member needs a non-empty participant id");
    }
    auto handle = std::make_unique<pserver_group_t>();
    handle->ref = pserver_capi::ClientRef{client->cluster, client->rep};
    handle->rep = std::make_unique<pserver::WorkerGroup>(*client->rep, std::move(n), size,
                                                         std::string(participant));
    out = handle.release();
    return absl::OkStatus();
  });
  return out;
}

void pserver_group_delete(pserver_group_t* group) {
  delete group;  // NULL is fine; destructors do not throw
}

void pserver_group_barrier(pserver_group_t* group, int32_t scope, pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    if (scope < PSERVER_BARRIER_WORKERS || scope > PSERVER_BARRIER_ALL) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown barrier scope ", scope, " (want 0: workers, 1: servers, 2: all)"));
    }
    const pserver::BarrierScope s =
        scope == PSERVER_BARRIER_WORKERS   ? pserver::BarrierScope::kWorkers
        : scope == PSERVER_BARRIER_SERVERS ? pserver::BarrierScope::kServers
                                           : pserver::BarrierScope::kAll;
    return group->rep->Barrier(s, call);
  });
}

void pserver_group_all_reduce(pserver_group_t* group, int32_t dtype, const int64_t* shape,
                              size_t ndim, void* data, size_t size, int32_t op,
                              pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    if (op != PSERVER_REDUCE_SUM && op != PSERVER_REDUCE_MEAN) {
      return absl::InvalidArgumentError(
          absl::StrCat("unknown reduce op ", op, " (want 0: sum, 1: mean)"));
    }
    PS_ASSIGN_OR_RETURN(pserver::Tensor t,
                        pserver_capi::TensorOf(nullptr, dtype, shape, ndim, data, size));
    PS_RETURN_IF_ERROR(group->rep->AllReduce(
        &t, op == PSERVER_REDUCE_MEAN ? pserver::ReduceOp::kMean : pserver::ReduceOp::kSum, call));
    CopyBack(t, data, size);
    return absl::OkStatus();
  });
}

void pserver_group_broadcast(pserver_group_t* group, int32_t dtype, const int64_t* shape,
                             size_t ndim, void* data, size_t size, uint8_t root,
                             pserver_status_t* status) {
  const pserver::CallOptions call = CallOf(status);
  Run(status, [&]() -> absl::Status {
    PS_RETURN_IF_ERROR(AliveGroup(group));
    PS_ASSIGN_OR_RETURN(pserver::Tensor t,
                        pserver_capi::TensorOf(nullptr, dtype, shape, ndim, data, size));
    PS_RETURN_IF_ERROR(group->rep->Broadcast(&t, root != 0, call));
    if (root == 0) CopyBack(t, data, size);
    return absl::OkStatus();
  });
}

}  // extern "C"
