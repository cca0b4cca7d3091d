/* pserver_tables.h: the tables, KV workers and collectives of the C ABI, part of pserver.h.
 *
 * pserver.h includes this header at its end: include pserver.h. It also
 * stands alone (it includes pserver.h first). The conventions of pserver.h
 * hold here. */
#ifndef PSERVER_CC_CAPI_PSERVER_TABLES_H_
#define PSERVER_CC_CAPI_PSERVER_TABLES_H_

#include <stddef.h>
#include <stdint.h>

#include "pserver.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- tables */

/* A table maps uint64 keys to rows of `dim` values of one element type
 * (float32 or float64), spread over every server (docs/tables.md): a sparse
 * embedding table, or with the "add" optimizer and a consistency model a KV
 * table whose workers have clocks (pserver_kv_worker_t). The config is
 * pserver.v1.TableConfig (proto/pserver/v1/table.proto). */
typedef struct pserver_table_config_t pserver_table_config_t;
typedef struct pserver_table_t pserver_table_t;

/* Which server holds a key; numbered like pserver.v1.Partitioning.Kind. */
typedef enum pserver_partitioning_t {
  PSERVER_PARTITION_HASH = 0, /* a mixed hash of the key modulo the servers */
  PSERVER_PARTITION_RANGE = 1 /* N equal ranges of [range_begin, range_end) */
} pserver_partitioning_t;

/* When reads wait; numbered like pserver.v1.Consistency.Model. */
typedef enum pserver_consistency_t {
  PSERVER_ASP = 0, /* reads never wait */
  PSERVER_BSP = 1, /* SSP with staleness 0, adds held until every worker passes their clock */
  PSERVER_SSP = 2  /* a read at clock c waits for every worker to reach c - staleness */
} pserver_consistency_t;

/* A new config: dim 1, float32, zeros initializer (seed 0), optimizer "sgd"
 * (learning rate 0.01), no eviction, hash partitioning, ASP, chunk size 1. */
PSERVER_EXPORT pserver_table_config_t* pserver_table_config_new(void);
PSERVER_EXPORT void pserver_table_config_delete(pserver_table_config_t* config);
/* Values per row: 1 .. 2^20 (INVALID_ARGUMENT otherwise). */
PSERVER_EXPORT void pserver_table_config_set_dim(pserver_table_config_t* config, uint32_t dim,
                                                 pserver_status_t* status);
/* PSERVER_FLOAT32 or PSERVER_FLOAT64. */
PSERVER_EXPORT void pserver_table_config_set_dtype(pserver_table_config_t* config, int32_t dtype,
                                                   pserver_status_t* status);
/* How pushed gradient rows and pulled rows of a float32 table travel
 * (TableConfig.wire_compression): "float16", "bfloat16" or "float32" (as
 * stored). Top-k with error feedback is the settings "topk_fraction" or
 * "topk_count" (pserver_table_config_set), with "max_residual_rows" (rows
 * of residual a trainer keeps per table; 0: 1,048,576). INVALID_ARGUMENT
 * for another type; a float64 table with either is refused at creation. */
PSERVER_EXPORT void pserver_table_config_set_wire_type(pserver_table_config_t* config,
                                                       const char* type,
                                                       pserver_status_t* status);
/* How a new row is filled, resetting the initializer's settings (the seed
 * stays): "zeros", "uniform" (settings "low", "high") or "normal" ("mean",
 * "stddev"). */
PSERVER_EXPORT void pserver_table_config_set_initializer(pserver_table_config_t* config,
                                                         const char* kind,
                                                         pserver_status_t* status);
/* The per-row optimizer, resetting its settings: "sgd", "adagrad", "adam",
 * "ftrl" or "add" (w += g: KV tables). */
PSERVER_EXPORT void pserver_table_config_set_optimizer(pserver_table_config_t* config,
                                                       const char* optimizer,
                                                       pserver_status_t* status);
/* PSERVER_PARTITION_HASH (range ignored) or PSERVER_PARTITION_RANGE over
 * [range_begin, range_end) (range_end 0: 2^64). */
PSERVER_EXPORT void pserver_table_config_set_partitioning(pserver_table_config_t* config,
                                                          int32_t kind, uint64_t range_begin,
                                                          uint64_t range_end,
                                                          pserver_status_t* status);
/* PSERVER_ASP, PSERVER_BSP or PSERVER_SSP with `staleness` clocks (SSP only). */
PSERVER_EXPORT void pserver_table_config_set_consistency(pserver_table_config_t* config,
                                                         int32_t model, uint32_t staleness,
                                                         pserver_status_t* status);
/* Sets one numeric setting by its name in table.proto, looked up in the
 * chosen optimizer ("learning_rate" or "lr", "beta1", "beta2", "epsilon",
 * "initial_accumulator", "alpha", "beta", "l1", "l2"), the chosen
 * initializer ("low", "high", "mean", "stddev"), then "seed", the eviction
 * ("ttl_seconds", "capacity", "admission_count"), "staleness", "dim",
 * "chunk_size", then the wire compression's "topk_fraction", "topk_count" and
 * "max_residual_rows". Counts take a whole number that fits the field.
 * INVALID_ARGUMENT for an unknown name (the message lists the valid ones)
 * or a value that does not fit; a failed set changes nothing. */
PSERVER_EXPORT void pserver_table_config_set(pserver_table_config_t* config, const char* key,
                                             double value, pserver_status_t* status);
/* Replaces the config with one in protobuf text format, e.g. "dim: 8
 * optimizer { adam { beta1: 0.8 } } consistency { model: SSP staleness: 2 }". */
PSERVER_EXPORT void pserver_table_config_parse_text(pserver_table_config_t* config,
                                                    const char* text,
                                                    pserver_status_t* status);
/* Writes the config in protobuf text format, as pserver_param_config_text. */
PSERVER_EXPORT size_t pserver_table_config_text(const pserver_table_config_t* config, char* out,
                                                size_t out_size);

/* Creates table `name` on every server and returns a new handle on it
 * (freed with pserver_table_delete); with the same config again it opens the
 * existing table. `config` may be NULL (the defaults of
 * pserver_table_config_new). INVALID_ARGUMENT for a bad config or an empty
 * name, ALREADY_EXISTS when the table exists with another config. */
PSERVER_EXPORT pserver_table_t* pserver_client_create_table(pserver_client_t* client,
                                                            const char* name, size_t name_len,
                                                            const pserver_table_config_t* config,
                                                            pserver_status_t* status);
PSERVER_EXPORT void pserver_table_delete(pserver_table_t* table);
/* The table's name, `*name_len` bytes (name_len may be NULL; the name is
 * also NUL-terminated). */
PSERVER_EXPORT const char* pserver_table_name(const pserver_table_t* table, size_t* name_len);
PSERVER_EXPORT uint32_t pserver_table_dim(const pserver_table_t* table);
/* PSERVER_FLOAT32 or PSERVER_FLOAT64. */
PSERVER_EXPORT int32_t pserver_table_dtype(const pserver_table_t* table);
/* dim * pserver_dtype_size(dtype): the bytes of one row. */
PSERVER_EXPORT size_t pserver_table_row_bytes(const pserver_table_t* table);
/* Chunk size of the config (at least 1). */
PSERVER_EXPORT uint32_t pserver_table_chunk_size(const pserver_table_t* table);
/* The table's config in protobuf text format, as pserver_param_config_text. */
PSERVER_EXPORT size_t pserver_table_config_text_of(const pserver_table_t* table, char* out,
                                                   size_t out_size);
/* The index of the server that holds `key`; -1 and INVALID_ARGUMENT for a
 * key outside a range partitioning. */
PSERVER_EXPORT int32_t pserver_table_server_of(const pserver_table_t* table, uint64_t key,
                                               pserver_status_t* status);

/* Reads the rows of keys[0 .. n) into `out`, in key order: `out_size` must
 * be exactly n * pserver_table_row_bytes(table). Rows are created on first
 * touch. */
PSERVER_EXPORT void pserver_table_pull(pserver_table_t* table, const uint64_t* keys, size_t n,
                                       void* out, size_t out_size, pserver_status_t* status);
/* Applies gradients (for an "add" table: deltas) to the rows of keys[0 ..
 * n): `size` must be exactly n * pserver_table_row_bytes(table). Duplicate
 * keys are summed and the row updated once. */
PSERVER_EXPORT void pserver_table_push(pserver_table_t* table, const uint64_t* keys, size_t n,
                                       const void* data, size_t size, pserver_status_t* status);

/* The table on one server. Fields are only ever appended. */
typedef struct pserver_table_stats_t {
  uint32_t server;       /* the server's index */
  uint64_t rows;         /* rows held (admitted, not evicted) */
  uint64_t bytes;        /* values and optimizer state of those rows */
  uint64_t evictions;    /* rows evicted so far (TTL and capacity) */
  uint64_t pending_keys; /* keys seen but not yet admitted */
  uint64_t keys_pulled;
  uint64_t keys_pushed;
  int64_t min_clock; /* the slowest registered worker's clock; -1: none */
  uint32_t workers;  /* registered workers */
} pserver_table_stats_t;

/* The table's stats on every server, in index order, as
 * pserver_client_stats: fills out[0 .. min(n, capacity)) with elements of
 * `struct_size` bytes (sizeof(pserver_table_stats_t)); returns n. */
PSERVER_EXPORT size_t pserver_table_stats(pserver_table_t* table, pserver_table_stats_t* out,
                                          size_t capacity, size_t struct_size,
                                          pserver_status_t* status);

/* ------------------------------------------------------------- KV workers */

/* One worker of a table with clocks (FlexPS's KVClientTable): reads at its
 * clock, waiting as the table's consistency says; adds; advances its clock.
 * One thread at a time. */
typedef struct pserver_kv_worker_t pserver_kv_worker_t;

/* Registers `worker_id` (non-empty, unique per table) on every server at the
 * slowest registered worker's clock; a new handle. */
PSERVER_EXPORT pserver_kv_worker_t* pserver_kv_worker_join(pserver_table_t* table,
                                                           const char* worker_id,
                                                           pserver_status_t* status);
/* Leaves the table (best effort, waiting at most 5 s) unless it left, and
 * frees the handle. */
PSERVER_EXPORT void pserver_kv_worker_delete(pserver_kv_worker_t* worker);
PSERVER_EXPORT const char* pserver_kv_worker_id(const pserver_kv_worker_t* worker);
/* The worker's clock (0 when NULL). */
PSERVER_EXPORT int64_t pserver_kv_worker_current_clock(const pserver_kv_worker_t* worker);
/* As pserver_table_pull, at the worker's clock: under SSP(s) and BSP (s = 0)
 * it waits until every registered worker has reached clock - s;
 * DEADLINE_EXCEEDED names the workers holding it back ("behind: w0 at clock
 * 0"). */
PSERVER_EXPORT void pserver_kv_worker_get(pserver_kv_worker_t* worker, const uint64_t* keys,
                                          size_t n, void* out, size_t out_size,
                                          pserver_status_t* status);
/* As pserver_table_push, made at the worker's clock (under BSP applied once
 * every worker has passed it). */
PSERVER_EXPORT void pserver_kv_worker_add(pserver_kv_worker_t* worker, const uint64_t* keys,
                                          size_t n, const void* data, size_t size,
                                          pserver_status_t* status);
/* Chunk forms: chunk c is keys [c * chunk_size, (c + 1) * chunk_size);
 * `out_size` / `size` are n * chunk_size rows. */
PSERVER_EXPORT void pserver_kv_worker_get_chunk(pserver_kv_worker_t* worker,
                                                const uint64_t* chunk_ids, size_t n, void* out,
                                                size_t out_size, pserver_status_t* status);
PSERVER_EXPORT void pserver_kv_worker_add_chunk(pserver_kv_worker_t* worker,
                                                const uint64_t* chunk_ids, size_t n,
                                                const void* data, size_t size,
                                                pserver_status_t* status);
/* Advances the worker's clock by one on every server. */
PSERVER_EXPORT void pserver_kv_worker_clock(pserver_kv_worker_t* worker,
                                            pserver_status_t* status);
/* Unregisters the worker, so it no longer holds the others back; later
 * calls get FAILED_PRECONDITION. */
PSERVER_EXPORT void pserver_kv_worker_leave(pserver_kv_worker_t* worker,
                                            pserver_status_t* status);

/* ------------------------------------------------------------ collectives */

/* Barrier, all-reduce and broadcast among a fixed group of workers, through
 * the servers. Members make the same sequence of calls: the k-th call of a
 * kind meets the others' k-th call. One thread at a time. */
typedef struct pserver_group_t pserver_group_t;

typedef enum pserver_barrier_scope_t {
  PSERVER_BARRIER_WORKERS = 0, /* every member has arrived */
  PSERVER_BARRIER_SERVERS = 1, /* every server is serving and has answered */
  PSERVER_BARRIER_ALL = 2      /* both */
} pserver_barrier_scope_t;

typedef enum pserver_reduce_op_t {
  PSERVER_REDUCE_SUM = 0,
  PSERVER_REDUCE_MEAN = 1
} pserver_reduce_op_t;

/* Member `participant` (non-empty, unique in the group) of group `name` of
 * `size` >= 1 members; a new handle. Sends nothing. */
PSERVER_EXPORT pserver_group_t* pserver_group_new(pserver_client_t* client, const char* name,
                                                  uint32_t size, const char* participant,
                                                  pserver_status_t* status);
PSERVER_EXPORT void pserver_group_delete(pserver_group_t* group);
/* Waits for the members, the servers or both (a pserver_barrier_scope_t);
 * DEADLINE_EXCEEDED says how many members arrived and who. */
PSERVER_EXPORT void pserver_group_barrier(pserver_group_t* group, int32_t scope,
                                          pserver_status_t* status);
/* Replaces `data` (`size` bytes of `dtype`, of the given shape) in place by
 * the element-wise sum or mean (a pserver_reduce_op_t) over every member's
 * tensor, which must have the same type and shape. */
PSERVER_EXPORT void pserver_group_all_reduce(pserver_group_t* group, int32_t dtype,
                                             const int64_t* shape, size_t ndim, void* data,
                                             size_t size, int32_t op, pserver_status_t* status);
/* The root's `data` is copied into every other member's `data` (of the
 * root's type and shape). Exactly one member passes root = 1. */
PSERVER_EXPORT void pserver_group_broadcast(pserver_group_t* group, int32_t dtype,
                                            const int64_t* shape, size_t ndim, void* data,
                                            size_t size, uint8_t root, pserver_status_t* status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PSERVER_CC_CAPI_PSERVER_TABLES_H_ */
