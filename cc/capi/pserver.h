/* pserver.h: the stable C ABI of pserver, a distributed parameter server.
 *
 * Go (cgo), Python (SWIG) and C programs use pserver through this header
 * alone, and link libpserver.so; it includes the rest of the ABI,
 * pserver_tables.h and pserver_cluster.h, at its end. Example (errors
 * ignored for brevity):
 *
 *   pserver_status_t* st = pserver_status_new();
 *   pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
 *   pserver_client_t* client = pserver_local_cluster_client(cluster, NULL, st);
 *   float w[2] = {0, 0}, g[2] = {0.5f, -0.5f};
 *   int64_t shape[1] = {2};
 *   pserver_param_config_t* cfg = pserver_param_config_new();
 *   pserver_param_config_set_optimizer(cfg, "adam", st);
 *   pserver_param_config_set(cfg, "learning_rate", 0.01, st);
 *   pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, w, sizeof w, cfg, st);
 *   pserver_client_finish_init(client, st);
 *   pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
 *   pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, w, sizeof w, st);
 *   if (pserver_status_code(st) != PSERVER_OK) puts(pserver_status_message(st));
 *   pserver_param_config_delete(cfg);
 *   pserver_client_delete(client);
 *   pserver_local_cluster_delete(cluster);
 *   pserver_status_delete(st);
 *
 * Conventions:
 *  1. Every name starts with pserver_ (functions, types) or PSERVER_ (macros,
 *     enum values). Nothing else is exported from libpserver.so.
 *  2. Objects are opaque handles, created by pserver_X_new (or a call that
 *     says it returns a new handle) and freed by pserver_X_delete, which
 *     accepts NULL. A handle is never a pointer to a C++ class.
 *  3. Every call that can fail takes a pserver_status_t* as its last argument.
 *     It is cleared (PSERVER_OK, message "") on success and set to a code and
 *     message on failure. Codes are numbered like absl::StatusCode and gRPC's
 *     codes (pserver_code_t). The message is valid until the status is next
 *     passed to a call or deleted. A NULL status is allowed: the error is then
 *     dropped. Calls never abort on bad input; a failed call changes nothing
 *     the caller can see unless it says otherwise.
 *  4. Buffers: the caller allocates every output buffer and passes its size in
 *     bytes; each call documents the size it needs (for a parameter,
 *     pserver_dtype_size(dtype) * number of elements) and fails with
 *     PSERVER_INVALID_ARGUMENT, changing nothing, when the size is wrong.
 *     Input buffers are read during the call only, except where a call says
 *     it borrows them (pserver_batch_t). A buffer the library allocates
 *     (pserver_etcd_get) is freed with pserver_buffer_delete. Strings are
 *     NUL-terminated UTF-8, except names of parameters and tables: they
 *     travel with their length, (const char* name, size_t name_len), in and
 *     out, so that a name is never cut short at a NUL byte. A client call
 *     refuses a name that is empty, holds a NUL byte or is not UTF-8 with
 *     PSERVER_INVALID_ARGUMENT "parameter name ..." ("table name ..."),
 *     sending nothing; the server checks names too.
 *     Strings returned as const char* belong to the handle they came from and
 *     live as long as it does.
 *  5. Fixed-width integers; uint8_t for booleans; size_t for byte counts and
 *     counts of elements in memory; int64_t for tensor dimensions.
 *  6. Thread safety: pserver_client_t, pserver_server_t,
 *     pserver_local_cluster_t, pserver_checkpoint_reader_t,
 *     pserver_etcd_t and pserver_table_t may be used
 *     from several threads at once (a client by many trainer threads).
 *     pserver_status_t, pserver_batch_t, pserver_param_config_t,
 *     pserver_table_config_t and the option handles are plain values: one thread at a time. Deleting a handle
 *     while another thread uses it is undefined. Blocking calls take no
 *     global lock, so bindings may release their interpreter lock around them.
 *  7. This header only grows: functions, enum values and trailing struct
 *     fields are added, never changed or removed (but for the ABI changes
 *     listed at pserver_version). Structs that the library
 *     fills are passed with their size (sizeof) so old callers keep working.
 *  8. Timeouts: a status may carry a timeout for the calls it is given
 *     (pserver_status_set_timeout_ms). A blocking call given such a status
 *     finishes by then, with PSERVER_DEADLINE_EXCEEDED at the latest (or
 *     the client's own timeout, whichever ends first); without one, the
 *     client's timeout (pserver_client_options_set_timeout_ms) applies.
 *     A timeout <= 0 clears it; it stays on the status until changed.
 *     The blocking calls are pserver_client_init_param, _finish_init,
 *     _param_info, _get_param, _get_params, _send_grad, _send_grads,
 *     _push_pull, _save_checkpoint, _stats and _create_table (and the
 *     _device forms of _send_grad, _get_param and _push_pull);
 *     pserver_table_pull, _push and _stats; pserver_kv_worker_join, _get,
 *     _add, _get_chunk, _add_chunk, _clock and _leave; and
 *     pserver_group_barrier, _all_reduce and _broadcast.
 *  9. Tables, KV workers and groups are made from a client and keep what
 *     they need of it alive: pserver_client_delete may come before
 *     pserver_table_delete (and the others) without harm. A pserver_table_t
 *     may be used from several threads at once; a pserver_kv_worker_t and a
 *     pserver_group_t are one worker each: one thread at a time.
 * 10. Cancellation: a status may carry a pserver_cancel_t
 *     (pserver_status_set_cancel). pserver_cancel_cancel, from any thread,
 *     ends the blocking call (convention 8) using that status promptly with
 *     PSERVER_CANCELLED "the call was cancelled": requests in flight over
 *     gRPC are cancelled and retries stop. Once cancelled, every call given
 *     such a status ends at once, like a Go context. An in-process client
 *     (pserver_local_cluster_client) looks at it every 100 ms while it
 *     waits for other workers (barriers, all-reduce, broadcast, BSP/SSP
 *     reads).
 */
#ifndef PSERVER_CC_CAPI_PSERVER_H_
#define PSERVER_CC_CAPI_PSERVER_H_

#include <stddef.h>
#include <stdint.h>

#if defined(PSERVER_BUILDING_LIBRARY)
#define PSERVER_EXPORT __attribute__((visibility("default")))
#else
#define PSERVER_EXPORT
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- version */

#define PSERVER_VERSION_MAJOR 0
#define PSERVER_VERSION_MINOR 7
#define PSERVER_VERSION_PATCH 0

/* "0.7.0": the library's version (which may be newer than this header's).
 *
 * ABI changes (convention 7 holds from one minor version to the next
 * except where listed here):
 *   0.2.0: names of parameters and tables travel with their length: every
 *          call taking one takes (const char* name, size_t name_len), and
 *          pserver_table_name, pserver_checkpoint_reader_param_name and
 *          _table_name return theirs through a size_t* name_len. Added the
 *          cancellation handle pserver_cancel_t (convention 10).
 *   0.3.0: no copies of the values: pserver_client_send_grad(s) and
 *          _push_pull send straight from the caller's buffers, and
 *          pserver_client_get_param(s) and _push_pull write the parameters
 *          straight into the caller's outputs once this client knows their
 *          layout (after an init or a first read). A call that fails after
 *          sending (a server error, a deadline, a cancellation) may then
 *          leave an output partly written; bad arguments still fail before
 *          anything is sent or written. pserver_client_param_info reads
 *          only a parameter's layout, not its values. Signatures unchanged.
 *   0.4.0: added pserver_cancel_set_check; nothing changed.
 *   0.5.0: all additive but one change of a value. Added (docs/security.md)
 *          mutual TLS (pserver_client_options_set_tls,
 *          _set_tls_server_name, pserver_server_options_set_tls), roles
 *          (pserver_client_options_set_token, pserver_server_options_set_auth;
 *          calls to a server with roles may fail PSERVER_UNAUTHENTICATED or
 *          PSERVER_PERMISSION_DENIED), the advertised address
 *          (pserver_server_options_set_advertise_host), registry fencing
 *          (pserver_client_options_set_require_instance_id), etcd over TLS
 *          (pserver_client_options_set_etcd_tls, pserver_etcd_new_tls,
 *          pserver_server_options_set_etcd_tls), servers that register in
 *          etcd (pserver_server_options_set_etcd) and sparse tables' wire
 *          compression (pserver_table_config_set_wire_type); offline resharding
 *          of checkpoints (pserver_checkpoint_reshard). Changed: a
 *          server's /ps/<idx> value, as pserver_etcd_get returns it, is
 *          "host:port instance=<id>" (a bare "host:port" before); readers
 *          take the address up to the first space.
 *   0.6.0: additive. A server with a metrics page appends
 *          " metrics=host:port" to its /ps/<idx> value; added
 *          pserver_etcd_server_value_parse, which reads every form; and
 *          pserver_client_list_params with pserver_param_list_*.
 *   0.7.0: additive, one default changed. With TLS the bulk channel uses
 *          its AEAD layer by default when both ends can (docs/security.md);
 *          added pserver_client_options_set_tls_bulk_aead and
 *          pserver_server_options_set_tls_bulk_aead to turn it off, and
 *          pserver_server_stats_t.bulk_aead_connections (appended). */
PSERVER_EXPORT const char* pserver_version(void);

/* ----------------------------------------------------------------- status */

/* Numbered like absl::StatusCode and gRPC's status codes. */
typedef enum pserver_code_t {
  PSERVER_OK = 0,
  PSERVER_CANCELLED = 1,
  PSERVER_UNKNOWN = 2,
  PSERVER_INVALID_ARGUMENT = 3,
  PSERVER_DEADLINE_EXCEEDED = 4,
  PSERVER_NOT_FOUND = 5,
  PSERVER_ALREADY_EXISTS = 6, /* "pserver already initialized" */
  PSERVER_PERMISSION_DENIED = 7,
  PSERVER_RESOURCE_EXHAUSTED = 8,
  PSERVER_FAILED_PRECONDITION = 9, /* "pserver not fully initialized" */
  PSERVER_ABORTED = 10,
  PSERVER_OUT_OF_RANGE = 11,
  PSERVER_UNIMPLEMENTED = 12,
  PSERVER_INTERNAL = 13,
  PSERVER_UNAVAILABLE = 14,
  PSERVER_DATA_LOSS = 15, /* e.g. a checkpoint checksum failed */
  PSERVER_UNAUTHENTICATED = 16
} pserver_code_t;

typedef struct pserver_status_t pserver_status_t;

PSERVER_EXPORT pserver_status_t* pserver_status_new(void);
PSERVER_EXPORT void pserver_status_delete(pserver_status_t* status);
/* A pserver_code_t value. */
PSERVER_EXPORT int32_t pserver_status_code(const pserver_status_t* status);
/* "" when OK. Valid until the status is next used or deleted. */
PSERVER_EXPORT const char* pserver_status_message(const pserver_status_t* status);
/* Sets a code and message (for bindings and tests). */
PSERVER_EXPORT void pserver_status_set(pserver_status_t* status, int32_t code,
                                       const char* message);
/* A timeout for the blocking client calls this status is given (convention
 * 8): a blocking call given this status finishes by then, with
 * PSERVER_DEADLINE_EXCEEDED at the latest; counted from the start of each
 * call, and never later than the client's own timeout. timeout_ms <= 0
 * clears it (the client's own timeout applies). The timeout stays on the
 * status until changed; setting or reading it leaves the code and message
 * alone. A NULL status is ignored. */
PSERVER_EXPORT void pserver_status_set_timeout_ms(pserver_status_t* status, int64_t timeout_ms);
/* The status's timeout in milliseconds; 0 when none (or status is NULL). */
PSERVER_EXPORT int64_t pserver_status_timeout_ms(const pserver_status_t* status);
/* ----------------------------------------------------------- cancellation */

/* Ends blocking calls from another thread (convention 10): a Ctrl-C
 * handler, a Go context. Thread-safe: pserver_cancel_cancel and
 * pserver_cancel_cancelled may be called from any thread at any time. */
typedef struct pserver_cancel_t pserver_cancel_t;

PSERVER_EXPORT pserver_cancel_t* pserver_cancel_new(void);
/* A status carrying the handle keeps what it needs: the handle may be
 * deleted before the status. */
PSERVER_EXPORT void pserver_cancel_delete(pserver_cancel_t* cancel);
/* Cancels every blocking call given a status carrying `cancel`, now and
 * later: each ends promptly with PSERVER_CANCELLED. Idempotent; NULL is
 * ignored. */
PSERVER_EXPORT void pserver_cancel_cancel(pserver_cancel_t* cancel);
/* 1 once pserver_cancel_cancel was called (0 for NULL). */
PSERVER_EXPORT uint8_t pserver_cancel_cancelled(const pserver_cancel_t* cancel);
/* A check run by the blocking calls given `cancel`, on the calling thread,
 * while they wait (for replies, or between retries): every `every_ms`
 * milliseconds (at least 1) until the call ends; the first time `check(arg)`
 * returns non-zero, `cancel` is cancelled as by pserver_cancel_cancel. For
 * languages that see an interrupt only on the thread that called (Python
 * runs its Ctrl-C handler on the main thread only): the call can stay on
 * that thread and still end at Ctrl-C. NULL `check` removes it. Not
 * thread-safe: set it while no call given `cancel` runs. NULL `cancel` is
 * ignored. (0.4.0) */
PSERVER_EXPORT void pserver_cancel_set_check(pserver_cancel_t* cancel, int (*check)(void* arg),
                                             void* arg, int32_t every_ms);
/* The calls given `status` end when `cancel` is cancelled; NULL removes
 * it. Like the timeout, it stays on the status until changed and leaves the
 * code and message alone. A NULL status is ignored. */
PSERVER_EXPORT void pserver_status_set_cancel(pserver_status_t* status, pserver_cancel_t* cancel);

/* "INVALID_ARGUMENT", ...; "UNKNOWN_CODE" for a number outside the enum. */
PSERVER_EXPORT const char* pserver_code_name(int32_t code);

/* ---------------------------------------------------------- element types */

/* Numbered like pserver.v1.ElementType (the wire and checkpoint format). */
typedef enum pserver_dtype_t {
  PSERVER_DTYPE_UNSPECIFIED = 0,
  PSERVER_INT32 = 1,
  PSERVER_UINT32 = 2,
  PSERVER_INT64 = 3,
  PSERVER_UINT64 = 4,
  PSERVER_FLOAT32 = 5,
  PSERVER_FLOAT64 = 6
} pserver_dtype_t;

/* Bytes per element; 0 for a type that parameters cannot have. */
PSERVER_EXPORT size_t pserver_dtype_size(int32_t dtype);
/* "float32", "int64", ...; "unknown" for a type parameters cannot have. */
PSERVER_EXPORT const char* pserver_dtype_name(int32_t dtype);

/* ------------------------------------------------------ parameter config */

/* How the server updates a parameter: optimizer, learning-rate schedule and
 * clipping (pserver.v1.ParameterConfig in proto/pserver/v1/config.proto).
 * A new config is plain SGD with learning rate 0.01. */
typedef struct pserver_param_config_t pserver_param_config_t;

PSERVER_EXPORT pserver_param_config_t* pserver_param_config_new(void);
PSERVER_EXPORT void pserver_param_config_delete(pserver_param_config_t* config);

/* Chooses the optimizer, resetting its settings: "sgd", "adagrad",
 * "adadelta", "rmsprop", "adam", "adamw" or "add" (p += g, the only update
 * for integer parameters). INVALID_ARGUMENT for any other name. */
PSERVER_EXPORT void pserver_param_config_set_optimizer(pserver_param_config_t* config,
                                                       const char* optimizer,
                                                       pserver_status_t* status);

/* Chooses the learning-rate decay, resetting its settings: "constant",
 * "linear", "step" or "cosine". */
PSERVER_EXPORT void pserver_param_config_set_schedule(pserver_param_config_t* config,
                                                      const char* schedule,
                                                      pserver_status_t* status);

/* Sets one numeric setting by its name in config.proto, looked up in the
 * chosen optimizer (e.g. "momentum", "nesterov", "beta1", "beta2",
 * "epsilon", "weight_decay", "rho", "alpha", "centered",
 * "initial_accumulator"), then the schedule ("learning_rate" or "lr",
 * "warmup_steps", "warmup_start_factor"), then the chosen decay
 * ("end_learning_rate", "decay_steps", "step_size", "gamma",
 * "min_learning_rate"), then clipping ("clip_norm", "clip_value").
 * Booleans take 0 or 1 and counts a non-negative whole number.
 * INVALID_ARGUMENT for an unknown name (the message lists the valid ones)
 * or a value that does not fit the setting. */
PSERVER_EXPORT void pserver_param_config_set(pserver_param_config_t* config,
                                             const char* key, double value,
                                             pserver_status_t* status);

/* Replaces the config with a serialized pserver.v1.ParameterConfig. */
PSERVER_EXPORT void pserver_param_config_parse(pserver_param_config_t* config,
                                               const void* data, size_t size,
                                               pserver_status_t* status);
/* Replaces the config with one in protobuf text format, e.g.
 * "optimizer { adam { beta1: 0.8 } } learning_rate { learning_rate: 0.1 }". */
PSERVER_EXPORT void pserver_param_config_parse_text(pserver_param_config_t* config,
                                                    const char* text,
                                                    pserver_status_t* status);
/* Writes the config in protobuf text format, NUL-terminated and truncated to
 * fit `out` (`out_size` bytes; out may be NULL when out_size is 0). Returns
 * the full length without the NUL, as snprintf does. */
PSERVER_EXPORT size_t pserver_param_config_text(const pserver_param_config_t* config,
                                                char* out, size_t out_size);

/* ---------------------------------------------------------------- batches */

/* A list of named buffers for the batched calls. The batch BORROWS every
 * buffer: it must stay valid (and, for inputs, unchanged) until the call
 * that uses the batch returns; the batch itself may then be reused or
 * cleared. Not thread-safe. */
typedef struct pserver_batch_t pserver_batch_t;

PSERVER_EXPORT pserver_batch_t* pserver_batch_new(void);
PSERVER_EXPORT void pserver_batch_delete(pserver_batch_t* batch);
PSERVER_EXPORT void pserver_batch_clear(pserver_batch_t* batch);
PSERVER_EXPORT size_t pserver_batch_size(const pserver_batch_t* batch);
/* An input (a gradient): `size` bytes of `dtype` elements at `data`. */
PSERVER_EXPORT void pserver_batch_add_input(pserver_batch_t* batch, const char* name,
                                            size_t name_len, int32_t dtype, const void* data,
                                            size_t size);
/* An output (a parameter read into `out`, `size` bytes of `dtype`). */
PSERVER_EXPORT void pserver_batch_add_output(pserver_batch_t* batch, const char* name,
                                             size_t name_len, int32_t dtype, void* out,
                                             size_t size);

/* ----------------------------------------------------------------- client */

typedef struct pserver_client_options_t pserver_client_options_t;
typedef struct pserver_client_t pserver_client_t;

/* Defaults: no servers, 30 s deadline per call, 1 MiB blocks and requests,
 * 2 channels per server. */
PSERVER_EXPORT pserver_client_options_t* pserver_client_options_new(void);
PSERVER_EXPORT void pserver_client_options_delete(pserver_client_options_t* options);
/* Appends a server "host:port"; servers are given in shard-index order. */
PSERVER_EXPORT void pserver_client_options_add_server(pserver_client_options_t* options,
                                                      const char* address);
/* Deadline of every call, in milliseconds (> 0). */
PSERVER_EXPORT void pserver_client_options_set_timeout_ms(pserver_client_options_t* options,
                                                          int64_t timeout_ms);
/* Parameters larger than this are cut into blocks over all servers; every
 * client of a cluster must use the same value. */
PSERVER_EXPORT void pserver_client_options_set_block_bytes(pserver_client_options_t* options,
                                                           uint64_t block_bytes);
PSERVER_EXPORT void pserver_client_options_set_max_request_bytes(
    pserver_client_options_t* options, uint64_t max_request_bytes);
PSERVER_EXPORT void pserver_client_options_set_channels_per_server(
    pserver_client_options_t* options, int32_t channels);

/* Finds the servers in etcd instead of add_server: `endpoints` is
 * "host:port[,host:port...]", `cluster` (NULL or "": "default") puts every
 * key under /pserver/<cluster> (docs/operations.md). pserver_client_new then
 * waits up to the discovery timeout for /ps_desired servers to be registered
 * at /ps/<idx>, follows a restarted server's new address, and registers the
 * trainer at /workers/<id> under a lease. INVALID_ARGUMENT for no endpoint. */
PSERVER_EXPORT void pserver_client_options_set_etcd(pserver_client_options_t* options,
                                                    const char* endpoints, const char* cluster,
                                                    pserver_status_t* status);
/* With etcd: how long pserver_client_new waits for the servers (> 0;
 * default 60 s). */
PSERVER_EXPORT void pserver_client_options_set_discovery_timeout_ms(
    pserver_client_options_t* options, int64_t timeout_ms);
/* A bearer token for servers with roles (--auth_tokens_file;
 * docs/security.md), sent with every call; NULL or "": none. A server with
 * roles answers UNAUTHENTICATED without one and PERMISSION_DENIED, naming
 * role, job and method, to a token whose role may not call a method. */
PSERVER_EXPORT void pserver_client_options_set_token(pserver_client_options_t* options,
                                                     const char* token);
/* With etcd: refuse a /ps/<idx> entry that names no server instance (a
 * bare "host:port", as etcdctl would write it; docs/security.md). Default 0:
 * such entries are used. */
PSERVER_EXPORT void pserver_client_options_set_require_instance_id(
    pserver_client_options_t* options, int32_t require);
/* With etcd: speak to etcd over TLS (etcd --client-cert-auth): `ca` verifies
 * etcd's certificate, `cert` and `key` are this client's (PEM paths; NULL or
 * "": none). Files are read by pserver_client_new (NOT_FOUND naming one that
 * cannot be read). */
PSERVER_EXPORT void pserver_client_options_set_etcd_tls(pserver_client_options_t* options,
                                                        const char* ca, const char* cert,
                                                        const char* key);

/* Mutual TLS (docs/security.md): `cert` and `key` are this client's PEM
 * certificate and private key, `ca` the PEM CA(s) the servers' certificates
 * must chain to; all three files, or all three NULL/"" to turn TLS off.
 * Each server's certificate must also name the host dialled (or the name set
 * with pserver_client_options_set_tls_server_name). The files are checked
 * here: INVALID_ARGUMENT (NOT_FOUND for a missing file) naming the file and
 * what is wrong (unreadable, not PEM, expired, key not the certificate's).
 * With TLS, the bulk channel is mutual TLS too (TCP only). */
PSERVER_EXPORT void pserver_client_options_set_tls(pserver_client_options_t* options,
                                                   const char* cert, const char* key,
                                                   const char* ca, pserver_status_t* status);
/* The name the servers' certificates must carry instead of the host dialled
 * (NULL or "": the host). Needs TLS (pserver_client_options_set_tls). */
PSERVER_EXPORT void pserver_client_options_set_tls_server_name(pserver_client_options_t* options,
                                                               const char* name);
/* With TLS, whether the bulk channel asks for its AEAD layer (AES-128-GCM
 * keyed by the TLS exporter, docs/security.md) after the handshake: nonzero
 * (the default) uses it with servers that offer it (they do unless
 * --tls_bulk_aead=false) when this CPU has AES-NI; 0 keeps TLS records.
 * Either way the data is the same; see
 * pserver_server_stats_t.bulk_aead_connections. */
PSERVER_EXPORT void pserver_client_options_set_tls_bulk_aead(pserver_client_options_t* options,
                                                             int32_t on);

/* A client over gRPC to the options' servers (the options may be deleted
 * afterwards). INVALID_ARGUMENT for no servers, an empty address or a zero
 * setting. Connecting is lazy: an unreachable server shows as UNAVAILABLE or
 * DEADLINE_EXCEEDED on the first call. */
PSERVER_EXPORT pserver_client_t* pserver_client_new(const pserver_client_options_t* options,
                                                    pserver_status_t* status);
PSERVER_EXPORT void pserver_client_delete(pserver_client_t* client);
PSERVER_EXPORT int32_t pserver_client_num_servers(const pserver_client_t* client);

/* Server i's current "host:port" (with etcd, as last registered), written
 * NUL-terminated and truncated to fit `out` (`out_size` bytes; out may be
 * NULL when out_size is 0). Returns the full length without the NUL, as
 * snprintf does; 0 when i is out of range. */
PSERVER_EXPORT size_t pserver_client_server_address(const pserver_client_t* client, int32_t i,
                                                    char* out, size_t out_size);

/* Initializes a parameter from `size` bytes of `dtype` elements in `data`,
 * row-major, of the given shape (ndim dims; ndim 0 is a scalar). `config`
 * may be NULL (plain SGD). The first init of a name wins; later ones get
 * ALREADY_EXISTS "pserver already initialized: ..." (ending "with the same
 * type, shape and config" when the earlier init was this one exactly, also
 * after finish_init; otherwise saying what differs). */
PSERVER_EXPORT void pserver_client_init_param(pserver_client_t* client, const char* name,
                                              size_t name_len, int32_t dtype, const int64_t* shape,
                                              size_t ndim, const void* data, size_t size,
                                              const pserver_param_config_t* config,
                                              pserver_status_t* status);

/* Opens every server for reads and gradients; idempotent. Before it, reads
 * and gradients get FAILED_PRECONDITION "pserver not fully initialized". */
PSERVER_EXPORT void pserver_client_finish_init(pserver_client_t* client,
                                               pserver_status_t* status);

/* A parameter's element type and shape: *dtype gets a pserver_dtype_t,
 * *ndim the number of dimensions, and shape[0 .. min(ndim, shape_capacity))
 * the dimensions (call again with a larger array if *ndim > shape_capacity;
 * shape may be NULL when shape_capacity is 0). Known from an init or an
 * earlier read by this client; otherwise its layout is read once (not its
 * values).
 * NOT_FOUND for an unknown name. */
PSERVER_EXPORT void pserver_client_param_info(pserver_client_t* client, const char* name,
                                              size_t name_len, int32_t* dtype, int64_t* shape,
                                              size_t shape_capacity, size_t* ndim,
                                              pserver_status_t* status);

/* Reads a parameter into `out`: `out_size` must be exactly
 * pserver_dtype_size(dtype) * elements, and `dtype` the parameter's type
 * (INVALID_ARGUMENT otherwise, naming what was expected). Written in place
 * (see 0.3.0 at pserver_version): on an error after sending, `out` may be
 * partly written. */
PSERVER_EXPORT void pserver_client_get_param(pserver_client_t* client, const char* name,
                                             size_t name_len, int32_t dtype, void* out,
                                             size_t out_size, pserver_status_t* status);
/* Reads every output of `outs` (pserver_batch_add_output) in one round trip
 * per server. On error the outputs' contents are unspecified. */
PSERVER_EXPORT void pserver_client_get_params(pserver_client_t* client, pserver_batch_t* outs,
                                              pserver_status_t* status);

/* Sends a gradient: `size` bytes of `dtype` elements, as many as the
 * parameter has, of its type. */
PSERVER_EXPORT void pserver_client_send_grad(pserver_client_t* client, const char* name,
                                             size_t name_len, int32_t dtype, const void* data,
                                             size_t size, pserver_status_t* status);
/* Sends every input of `grads`; a batch with any bad part is applied not
 * at all. */
PSERVER_EXPORT void pserver_client_send_grads(pserver_client_t* client,
                                              const pserver_batch_t* grads,
                                              pserver_status_t* status);
/* Sends the inputs of `grads` and reads the parameters back after their
 * update into the outputs of `outs`, one round trip per server. `outs` has
 * one output per input, for the same names in the same order. */
PSERVER_EXPORT void pserver_client_push_pull(pserver_client_t* client,
                                             const pserver_batch_t* grads, pserver_batch_t* outs,
                                             pserver_status_t* status);

/* Asks every server to write a checkpoint of its shard now (the Save RPC;
 * in process for a local cluster's client). FAILED_PRECONDITION from a
 * server without a checkpoint directory. */
PSERVER_EXPORT void pserver_client_save_checkpoint(pserver_client_t* client,
                                                   pserver_status_t* status);

/* What one server reports. Fields are only ever appended. */
typedef struct pserver_server_stats_t {
  uint32_t index;
  uint8_t initialized; /* FinishInit has been called */
  uint64_t parameters; /* blocks held */
  uint64_t parameter_bytes;
  uint64_t optimizer_state_bytes;
  uint64_t gradients_applied;
  uint64_t gets_served;
  uint64_t requests_rejected;
  double uptime_seconds;
  /* 0.7.0: bulk-channel connections since the server started that use the
   * AEAD layer after TLS (pserver_client_options_set_tls_bulk_aead). */
  uint64_t bulk_aead_connections;
} pserver_server_stats_t;

/* Stats of every server, in index order: fills out[0 .. min(n, capacity))
 * where n = pserver_client_num_servers(client); each element is
 * `struct_size` bytes (pass sizeof(pserver_server_stats_t)). Returns n. */
PSERVER_EXPORT size_t pserver_client_stats(pserver_client_t* client,
                                           pserver_server_stats_t* out, size_t capacity,
                                           size_t struct_size, pserver_status_t* status);

/* The parameters of the cluster, each once, in name order (the ListParams
 * RPC: every server is read a page of at most 1000 names at a time): a list
 * read with pserver_param_list_* and freed with pserver_param_list_delete;
 * NULL (status set) on failure. A parameter split into blocks over several
 * servers is one entry, its blocks held summed over them. */
typedef struct pserver_param_list_t pserver_param_list_t;
PSERVER_EXPORT pserver_param_list_t* pserver_client_list_params(pserver_client_t* client,
                                                                pserver_status_t* status);
PSERVER_EXPORT size_t pserver_param_list_size(const pserver_param_list_t* list);
/* Entry i's name, `*name_len` bytes (name_len may be NULL); NULL (and 0)
 * when i is out of range or list is NULL. */
PSERVER_EXPORT const char* pserver_param_list_name(const pserver_param_list_t* list, size_t i,
                                                   size_t* name_len);
/* Entry i's element type (PSERVER_FLOAT32, ...), shape (as
 * pserver_client_param_info: the first shape_capacity dims, *ndim the
 * rank), blocks held over all servers, blocks it is split into, and its
 * optimizer kind ("sgd", "adam", ...: NUL-terminated, valid while the list
 * lives). Any output may be NULL. OUT_OF_RANGE for i past the end. */
PSERVER_EXPORT void pserver_param_list_info(const pserver_param_list_t* list, size_t i,
                                            int32_t* dtype, int64_t* shape,
                                            size_t shape_capacity, size_t* ndim,
                                            uint32_t* blocks_held, uint32_t* block_count,
                                            const char** optimizer, pserver_status_t* status);
PSERVER_EXPORT void pserver_param_list_delete(pserver_param_list_t* list);

/* gRPC's health check (grpc.health.v1.Health/Check, service ""), as
 * pserver_client_health reports it. */
#define PSERVER_HEALTH_UNKNOWN 0
#define PSERVER_HEALTH_SERVING 1     /* registered, shard loaded, serving */
#define PSERVER_HEALTH_NOT_SERVING 2 /* starting (no index or shard yet) or draining */
#define PSERVER_HEALTH_SERVICE_UNKNOWN 3

/* Every server's health, in index order: fills health_out[0 .. min(n,
 * capacity)) with PSERVER_HEALTH_* where n = pserver_client_num_servers(client);
 * returns n. A server that cannot be reached within the call's timeout fails
 * the call (UNAVAILABLE or DEADLINE_EXCEEDED naming it). A local cluster's
 * client answers from each server's serving state. */
PSERVER_EXPORT size_t pserver_client_health(pserver_client_t* client, int32_t* health_out,
                                            size_t capacity, pserver_status_t* status);

/* One call per operation (cc/capi/batch_calls.cc): the batched calls above
 * without building a pserver_batch_t first, for bindings that cross the ABI
 * once per operation. Each is exactly the batched call it names, with the
 * same checks and errors, over buffers it borrows for the call only.
 *
 * pserver_client_push_pull_one: pserver_client_push_pull of one parameter,
 * the gradient `size` bytes at `data`, the parameter after its update read
 * into `out` (`out_size` bytes; it may be `data` itself). */
PSERVER_EXPORT void pserver_client_push_pull_one(pserver_client_t* client, const char* name,
                                                 size_t name_len, int32_t dtype, const void* data,
                                                 size_t size, void* out, size_t out_size,
                                                 pserver_status_t* status);
/* The _n forms take `n` entries as parallel arrays: entry i is the
 * parameter names[i] (name_lens[i] bytes) of type dtypes[i], its gradient
 * `sizes[i]` bytes at data[i] and/or its value read into outs[i]
 * (`sizes[i]` bytes). As pserver_client_send_grads, _get_params and
 * _push_pull. */
PSERVER_EXPORT void pserver_client_send_grads_n(pserver_client_t* client, size_t n,
                                                const char* const* names, const size_t* name_lens,
                                                const int32_t* dtypes, const void* const* data,
                                                const size_t* sizes, pserver_status_t* status);
PSERVER_EXPORT void pserver_client_get_params_n(pserver_client_t* client, size_t n,
                                                const char* const* names, const size_t* name_lens,
                                                const int32_t* dtypes, void* const* outs,
                                                const size_t* sizes, pserver_status_t* status);
PSERVER_EXPORT void pserver_client_push_pull_n(pserver_client_t* client, size_t n,
                                               const char* const* names, const size_t* name_lens,
                                               const int32_t* dtypes, const void* const* data,
                                               void* const* outs, const size_t* sizes,
                                               pserver_status_t* status);

#ifdef __cplusplus
} /* extern "C" */
#endif

/* The rest of the C ABI, in two headers that users get through this one. */
#include "pserver_tables.h"   /* tables, KV workers, collectives */
#include "pserver_cluster.h"  /* server, local cluster, checkpoints, etcd, device */

#endif /* PSERVER_CC_CAPI_PSERVER_H_ */
