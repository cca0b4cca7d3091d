/* pserver_cluster.h: the server, local cluster, checkpoint reader, library
 * buffers, etcd and device memory of the C ABI, part of pserver.h.
 *
 * pserver.h includes this header at its end: include pserver.h. It also
 * stands alone (it includes pserver.h first). The conventions of pserver.h
 * hold here. */
#ifndef PSERVER_CC_CAPI_PSERVER_CLUSTER_H_
#define PSERVER_CC_CAPI_PSERVER_CLUSTER_H_

#include <stddef.h>
#include <stdint.h>

#include "pserver.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ----------------------------------------------------------------- server */

typedef struct pserver_server_options_t pserver_server_options_t;
typedef struct pserver_server_t pserver_server_t;

/* Defaults: host 127.0.0.1, port 0 (a free one), index 0, threads 0 (two
 * per core, at least 4). */
PSERVER_EXPORT pserver_server_options_t* pserver_server_options_new(void);
PSERVER_EXPORT void pserver_server_options_delete(pserver_server_options_t* options);
PSERVER_EXPORT void pserver_server_options_set_host(pserver_server_options_t* options,
                                                    const char* host);
PSERVER_EXPORT void pserver_server_options_set_port(pserver_server_options_t* options,
                                                    int32_t port);
PSERVER_EXPORT void pserver_server_options_set_index(pserver_server_options_t* options,
                                                     uint32_t index);
PSERVER_EXPORT void pserver_server_options_set_num_threads(pserver_server_options_t* options,
                                                           int32_t num_threads);
/* The address other hosts reach the server at (pserver --advertise_host):
 * what pserver_server_address reports and etcd publishes. Default "" (the
 * host), which must then not be 0.0.0.0 or ::: pserver_server_new refuses
 * those with INVALID_ARGUMENT naming this setting. */
PSERVER_EXPORT void pserver_server_options_set_advertise_host(pserver_server_options_t* options,
                                                              const char* host);

/* Where the server keeps checkpoints: shard i in <dir>/shard-<i>. With a
 * directory the server loads its shard's newest good checkpoint on start and
 * saves one on pserver_*_save_checkpoint and when it stops. Default: none. */
PSERVER_EXPORT void pserver_server_options_set_checkpoint_dir(pserver_server_options_t* options,
                                                              const char* dir);

/* Mutual TLS: this server's PEM certificate and key, and the PEM CA(s) a
 * client's certificate must chain to (required of every client); all three,
 * or all three NULL/"" for plaintext. The files are re-read every
 * `reload_seconds` (>= 1; 0: 60), so replacing them rotates the certificates
 * without a restart. Checked here as pserver_client_options_set_tls does. */
PSERVER_EXPORT void pserver_server_options_set_tls(pserver_server_options_t* options,
                                                   const char* cert, const char* key,
                                                   const char* ca, int32_t reload_seconds,
                                                   pserver_status_t* status);
/* With TLS, whether the bulk channel offers its AEAD layer to clients
 * (pserver --tls_bulk_aead): nonzero (the default) offers it when this CPU
 * has AES-NI, 0 keeps TLS records for every client. */
PSERVER_EXPORT void pserver_server_options_set_tls_bulk_aead(pserver_server_options_t* options,
                                                             int32_t on);

/* Roles (docs/security.md): the server's job, a bearer tokens file (lines
 * "role job token"; NULL or "": none) and a client-certificate rule (e.g.
 * "cn:<role>.<job>"; NULL or "": none). Checked by pserver_server_new
 * (INVALID_ARGUMENT for a bad rule or no job, NOT_FOUND for a missing
 * file). Default: no roles, every call allowed. */
PSERVER_EXPORT void pserver_server_options_set_auth(pserver_server_options_t* options,
                                                    const char* job, const char* tokens_file,
                                                    const char* cert_rule);

/* Registers the server in etcd (pserver --etcd, --cluster, --num_servers):
 * `endpoints` is "host:port[,host:port...]", `cluster` (NULL or "":
 * "default") puts its keys under /pserver/<cluster>. pserver_server_new then
 * claims the lowest free index below /ps_desired (written as `num_servers`
 * if absent; 0: take what etcd holds, FAILED_PRECONDITION if nothing) and
 * publishes its address and instance id at /ps/<idx> under a lease, waiting
 * up to 60 s for etcd and a free index. INVALID_ARGUMENT for no endpoint.
 * Default: no etcd (the index of pserver_server_options_set_index). */
PSERVER_EXPORT void pserver_server_options_set_etcd(pserver_server_options_t* options,
                                                    const char* endpoints, const char* cluster,
                                                    uint32_t num_servers,
                                                    pserver_status_t* status);
/* With etcd: speak to etcd over TLS (etcd --client-cert-auth; pserver
 * --etcd_tls_ca, --etcd_tls_cert, --etcd_tls_key), as
 * pserver_client_options_set_etcd_tls: `ca` verifies etcd's certificate,
 * `cert` and `key` are this server's (PEM paths; NULL or "": none). Files
 * are read by pserver_server_new (NOT_FOUND naming one that cannot be
 * read). */
PSERVER_EXPORT void pserver_server_options_set_etcd_tls(pserver_server_options_t* options,
                                                        const char* ca, const char* cert,
                                                        const char* key);

/* Starts a gRPC server in this process (options may be NULL: the defaults).
 * INVALID_ARGUMENT for a bad port or thread count, UNAVAILABLE when the
 * address cannot be bound. */
PSERVER_EXPORT pserver_server_t* pserver_server_new(const pserver_server_options_t* options,
                                                    pserver_status_t* status);
/* Stops the server (if running) and frees it. */
PSERVER_EXPORT void pserver_server_delete(pserver_server_t* server);
/* "127.0.0.1:40123": where the server listens. */
PSERVER_EXPORT const char* pserver_server_address(const pserver_server_t* server);
PSERVER_EXPORT int32_t pserver_server_port(const pserver_server_t* server);
/* Writes a checkpoint of the server's shard now. FAILED_PRECONDITION
 * without a checkpoint directory. */
PSERVER_EXPORT void pserver_server_save_checkpoint(pserver_server_t* server,
                                                   pserver_status_t* status);
/* Stops accepting calls, lets calls in flight finish for up to grace_ms,
 * then cancels the rest. Idempotent. */
PSERVER_EXPORT void pserver_server_stop(pserver_server_t* server, int64_t grace_ms);

/* ---------------------------------------------------------- local cluster */

/* N servers in this process, each on 127.0.0.1 with a free port: the
 * embedded cluster for notebooks, examples and tests. */
typedef struct pserver_local_cluster_t pserver_local_cluster_t;

/* INVALID_ARGUMENT for num_servers < 1. */
PSERVER_EXPORT pserver_local_cluster_t* pserver_local_cluster_new(int32_t num_servers,
                                                                  pserver_status_t* status);
/* Stops the cluster (if running) and frees it; clients made by
 * pserver_local_cluster_client stay valid and get UNAVAILABLE. */
/* Like pserver_local_cluster_new, every server made from `base` (NULL: the
 * defaults) with its index set to 0..n-1 and a free port: e.g. with a
 * checkpoint directory, server i keeping its shard in <dir>/shard-<i>. */
PSERVER_EXPORT pserver_local_cluster_t* pserver_local_cluster_new_with_options(
    int32_t num_servers, const pserver_server_options_t* base, pserver_status_t* status);
/* Writes a checkpoint of every server's shard now (FAILED_PRECONDITION
 * without a checkpoint directory). */
PSERVER_EXPORT void pserver_local_cluster_save_checkpoint(pserver_local_cluster_t* cluster,
                                                          pserver_status_t* status);
PSERVER_EXPORT void pserver_local_cluster_delete(pserver_local_cluster_t* cluster);
PSERVER_EXPORT int32_t pserver_local_cluster_size(const pserver_local_cluster_t* cluster);
/* Server i's "127.0.0.1:port" (gRPC clients in other processes may use it);
 * NULL when i is out of range. */
PSERVER_EXPORT const char* pserver_local_cluster_address(const pserver_local_cluster_t* cluster,
                                                         int32_t i);
/* A client that calls the cluster's servers in process, without sockets or
 * serialization. `options` may be NULL; its servers are ignored. After the
 * cluster is stopped its calls get UNAVAILABLE. */
PSERVER_EXPORT pserver_client_t* pserver_local_cluster_client(
    pserver_local_cluster_t* cluster, const pserver_client_options_t* options,
    pserver_status_t* status);
/* Stops every server; idempotent. */
PSERVER_EXPORT void pserver_local_cluster_stop(pserver_local_cluster_t* cluster);

/* ------------------------------------------------------ checkpoint reader */

/* Reads checkpoints as servers write them. `path` is one of:
 *   - a checkpoint directory (ckpt-<sequence>, holding a MANIFEST);
 *   - a server's checkpoint directory holding ckpt-* directories: the newest
 *     one is opened;
 *   - a directory whose subdirectories are such server directories (one per
 *     shard): the newest checkpoint of each is opened, and parameters cut
 *     into blocks over several shards are put back together.
 * Opening reads and checks the manifests only; reads verify the checksums of
 * what they read. NOT_FOUND when there is no checkpoint at `path`,
 * DATA_LOSS for a damaged manifest. */
typedef struct pserver_checkpoint_reader_t pserver_checkpoint_reader_t;

PSERVER_EXPORT pserver_checkpoint_reader_t* pserver_checkpoint_reader_new(
    const char* path, pserver_status_t* status);
PSERVER_EXPORT void pserver_checkpoint_reader_delete(pserver_checkpoint_reader_t* reader);
/* How many checkpoint directories (shards) were opened. */
PSERVER_EXPORT size_t pserver_checkpoint_reader_num_checkpoints(
    const pserver_checkpoint_reader_t* reader);
/* Checkpoint i's directory; NULL when i is out of range. */
PSERVER_EXPORT const char* pserver_checkpoint_reader_checkpoint_path(
    const pserver_checkpoint_reader_t* reader, size_t i);
/* Parameters, sorted by name. */
PSERVER_EXPORT size_t pserver_checkpoint_reader_num_params(
    const pserver_checkpoint_reader_t* reader);
/* Parameter i's name, `*name_len` bytes (name_len may be NULL); NULL (and
 * 0) when i is out of range. */
PSERVER_EXPORT const char* pserver_checkpoint_reader_param_name(
    const pserver_checkpoint_reader_t* reader, size_t i, size_t* name_len);
/* As pserver_client_param_info. NOT_FOUND for an unknown name. */
PSERVER_EXPORT void pserver_checkpoint_reader_param_info(const pserver_checkpoint_reader_t* reader,
                                                         const char* name, size_t name_len,
                                                         int32_t* dtype, int64_t* shape,
                                                         size_t shape_capacity, size_t* ndim,
                                                         pserver_status_t* status);
/* Reads a parameter (all its blocks, every checksum verified) into `out`,
 * exactly pserver_dtype_size(dtype) * elements bytes. DATA_LOSS "checkpoint
 * file checksum validation failed: <file> ..." for damaged data, and for a
 * parameter whose blocks are not all in the opened checkpoints. */
PSERVER_EXPORT void pserver_checkpoint_reader_read(const pserver_checkpoint_reader_t* reader,
                                                   const char* name, size_t name_len, int32_t dtype,
                                                   void* out, size_t out_size,
                                                   pserver_status_t* status);
/* Verifies every data file and chunk of every opened checkpoint. */
PSERVER_EXPORT void pserver_checkpoint_reader_verify(const pserver_checkpoint_reader_t* reader,
                                                     pserver_status_t* status);

/* Tables in the checkpoints (saved as extensions "table/<name>"), sorted by
 * name; a table's rows are spread over the shards' checkpoints. */
PSERVER_EXPORT size_t pserver_checkpoint_reader_num_tables(
    const pserver_checkpoint_reader_t* reader);
/* Table i's name, `*name_len` bytes (name_len may be NULL); NULL (and 0)
 * when i is out of range. */
PSERVER_EXPORT const char* pserver_checkpoint_reader_table_name(
    const pserver_checkpoint_reader_t* reader, size_t i, size_t* name_len);
/* Table `name`'s values per row, element type (PSERVER_FLOAT32 or _FLOAT64)
 * and rows over every opened checkpoint (reads and verifies its data; any
 * output may be NULL). NOT_FOUND for an unknown table, DATA_LOSS for damaged
 * data. */
PSERVER_EXPORT void pserver_checkpoint_reader_table_info(const pserver_checkpoint_reader_t* reader,
                                                         const char* name, size_t name_len,
                                                         uint32_t* dim, int32_t* dtype,
                                                         uint64_t* rows, pserver_status_t* status);
/* Reads table `name`'s rows, sorted by key: `keys` gets rows uint64 keys
 * (`keys_size` = rows * 8 bytes) and `values` their rows (`values_size` =
 * rows * dim * pserver_dtype_size(dtype) bytes), as table_info gives them.
 * Only the values are saved: optimizer state and pending keys are not read. */
PSERVER_EXPORT void pserver_checkpoint_reader_read_table(const pserver_checkpoint_reader_t* reader,
                                                         const char* name, size_t name_len,
                                                         uint64_t* keys, size_t keys_size,
                                                         void* values, size_t values_size,
                                                         pserver_status_t* status);

/* ------------------------------------------------- offline resharding */

/* Rewrites the checkpoints a cluster of N servers wrote into `from` (its
 * --checkpoint_dir, holding shard-0 .. shard-<N-1>) as the checkpoints a
 * cluster of `num_servers` (M, 1 .. 4096) servers loads, into `to` (which
 * must not exist or be an empty directory): every parameter block, table row
 * with its optimizer state, and held-back BSP add goes where M servers look
 * for it; workers' clocks are kept (the lowest where shards disagree);
 * exactly-once sets are dropped (restart the job's clients). Of each shard
 * the newest checkpoint that verifies whole is read. Written to a temporary
 * directory beside `to`, fsynced and renamed: on an error nothing is left
 * at `to`. Progress lines ("read shard ...", "wrote shard j/M: ... bytes",
 * "note: ...", a last summary) go to file descriptor `progress_fd`
 * (negative: none). FAILED_PRECONDITION for a missing shard, checkpoints of
 * different clusters or server counts, or a `to` that is not empty;
 * NOT_FOUND when `from` holds no checkpoint; DATA_LOSS when no checkpoint
 * of a shard verifies; INVALID_ARGUMENT for a bad count or `to` == `from`.
 * docs/checkpoint-format.md, "Resharding". */
PSERVER_EXPORT void pserver_checkpoint_reshard(const char* from, const char* to,
                                               uint32_t num_servers, int32_t progress_fd,
                                               pserver_status_t* status);

/* ----------------------------------------------------------- live moves */

/* Moves a running cluster (`cluster`, found in etcd at the comma-separated
 * `etcd_endpoints`) to `num_servers` (M, 1 .. 4096) servers while trainers
 * run: writes /placement moving, waits until servers 0 .. max(N,M)-1 are
 * registered (start the new ones with --etcd and --placement_redirects),
 * asks every old owner to hand its leaving dense blocks to their new owner,
 * writes /placement stable; servers left out exit. Safe to run again after
 * it failed midway. Gives up after `timeout_ms` (> 0). Progress lines go to
 * file descriptor `progress_fd` (negative: none). Out (each may be NULL):
 * `from` (N), `version` (the stable placement's), `blocks_moved` and
 * `bytes_moved` (values and optimizer state; 0 when it was at M already).
 * INVALID_ARGUMENT for a bad count; FAILED_PRECONDITION when no server has
 * started or a move to another count is under way; DEADLINE_EXCEEDED when
 * the new servers did not register in time. docs/elastic.md. */
PSERVER_EXPORT void pserver_cluster_scale(const char* etcd_endpoints, const char* cluster,
                                          uint32_t num_servers, int64_t timeout_ms,
                                          int32_t progress_fd, uint32_t* from, uint64_t* version,
                                          uint64_t* blocks_moved, uint64_t* bytes_moved,
                                          pserver_status_t* status);
/* pserver_cluster_scale on a secured cluster (docs/security.md): the
 * cluster, etcd endpoints, mutual TLS, bearer token and etcd TLS of a
 * client's `options` (pserver_client_options_set_etcd, _set_tls,
 * _set_token, _set_etcd_tls; the other settings are not used). MoveBlocks
 * needs the admin role: a server that refuses these credentials fails the
 * call PERMISSION_DENIED (or UNAUTHENTICATED) naming the server and the
 * method, before anything is written. INVALID_ARGUMENT when the options
 * name no etcd. */
PSERVER_EXPORT void pserver_cluster_scale_with(const pserver_client_options_t* options,
                                               uint32_t num_servers, int64_t timeout_ms,
                                               int32_t progress_fd, uint32_t* from,
                                               uint64_t* version, uint64_t* blocks_moved,
                                               uint64_t* bytes_moved, pserver_status_t* status);

/* --------------------------------------------------- library buffers */

/* Frees a buffer the library allocated (pserver_etcd_get); accepts NULL. */
PSERVER_EXPORT void pserver_buffer_delete(void* buffer);

/* ------------------------------------------------------------------- etcd */

/* A small etcd v3 client for tools (psctl): keys are full etcd keys, e.g.
 * "/pserver/default/ps_desired" (spelled by pserver_etcd_key below). Every call
 * has the handle's deadline; one that finds etcd unreachable tries the next
 * endpoint and retries within it (UNAVAILABLE or DEADLINE_EXCEEDED after).
 * Thread-safe. */
typedef struct pserver_etcd_t pserver_etcd_t;
/* The result of pserver_etcd_get_prefix: keys and values, sorted by key. */
typedef struct pserver_etcd_kvs_t pserver_etcd_kvs_t;

/* `endpoints`: "host:port[,host:port...]"; `timeout_ms` (> 0) bounds every
 * call. Does not wait for etcd. INVALID_ARGUMENT for no endpoint or a bad
 * timeout. */
PSERVER_EXPORT pserver_etcd_t* pserver_etcd_new(const char* endpoints, int64_t timeout_ms,
                                                pserver_status_t* status);
/* pserver_etcd_new over TLS with a client certificate (etcd
 * --client-cert-auth): `ca`, `cert`, `key` are PEM paths (NULL or "":
 * none). NOT_FOUND naming a file that cannot be read, INVALID_ARGUMENT for
 * a certificate without its key. */
PSERVER_EXPORT pserver_etcd_t* pserver_etcd_new_tls(const char* endpoints, int64_t timeout_ms,
                                                    const char* ca, const char* cert,
                                                    const char* key, pserver_status_t* status);
PSERVER_EXPORT void pserver_etcd_delete(pserver_etcd_t* etcd);
/* Reads `key`: *value gets a new buffer of *value_size bytes followed by a
 * NUL (not counted), freed with pserver_buffer_delete. NOT_FOUND when the
 * key does not exist (*value is then NULL). */
PSERVER_EXPORT void pserver_etcd_get(pserver_etcd_t* etcd, const char* key, char** value,
                                     size_t* value_size, pserver_status_t* status);
/* Every key that starts with `prefix`, as a new list (NULL on error) freed
 * with pserver_etcd_kvs_delete. */
PSERVER_EXPORT pserver_etcd_kvs_t* pserver_etcd_get_prefix(pserver_etcd_t* etcd,
                                                           const char* prefix,
                                                           pserver_status_t* status);
/* Sets `key` to the `size` bytes at `data` (no lease). */
PSERVER_EXPORT void pserver_etcd_put(pserver_etcd_t* etcd, const char* key, const void* data,
                                     size_t size, pserver_status_t* status);
/* Deletes `key`; a key that does not exist is not an error. */
PSERVER_EXPORT void pserver_etcd_delete_key(pserver_etcd_t* etcd, const char* key,
                                            pserver_status_t* status);

PSERVER_EXPORT void pserver_etcd_kvs_delete(pserver_etcd_kvs_t* kvs);
PSERVER_EXPORT size_t pserver_etcd_kvs_size(const pserver_etcd_kvs_t* kvs);
/* Entry i's key (NUL-terminated), value (NUL-terminated after
 * value_size bytes) and value size; NULL (0) when i is out of range. They
 * live as long as the list. */
PSERVER_EXPORT const char* pserver_etcd_kvs_key(const pserver_etcd_kvs_t* kvs, size_t i);
PSERVER_EXPORT const char* pserver_etcd_kvs_value(const pserver_etcd_kvs_t* kvs, size_t i);
PSERVER_EXPORT size_t pserver_etcd_kvs_value_size(const pserver_etcd_kvs_t* kvs, size_t i);

/* The etcd key layout of a cluster, defined once (cc/etcd/keys.h) for the
 * servers, the trainers, psctl and these calls. Every key of cluster C
 * starts with "/pserver/C/":
 *   ps_desired          the desired server count (decimal)
 *   ps/<index>          server <index>'s "host:port", under its lease
 *   checkpoints/<shard> the newest good checkpoint of a shard (JSON)
 *   workers/<id>        a trainer's registration (JSON), under its lease
 *   shards/<shard>      a shard's epoch and holder (JSON), no lease
 * Indices are canonical decimal ("3", not "03" or "+3"). */
typedef enum pserver_etcd_key_kind_t {
  PSERVER_ETCD_KEY_CLUSTER = 0,     /* "/pserver/C/", the prefix of them all */
  PSERVER_ETCD_KEY_DESIRED = 1,     /* "/pserver/C/ps_desired" */
  PSERVER_ETCD_KEY_SERVERS = 2,     /* "/pserver/C/ps/", the prefix of the next */
  PSERVER_ETCD_KEY_SERVER = 3,      /* "/pserver/C/ps/<arg>" */
  PSERVER_ETCD_KEY_CHECKPOINTS = 4, /* "/pserver/C/checkpoints/" */
  PSERVER_ETCD_KEY_CHECKPOINT = 5,  /* "/pserver/C/checkpoints/<arg>" */
  PSERVER_ETCD_KEY_WORKERS = 6,     /* "/pserver/C/workers/" */
  PSERVER_ETCD_KEY_WORKER = 7,      /* "/pserver/C/workers/<arg>" */
  PSERVER_ETCD_KEY_SHARDS = 8,      /* "/pserver/C/shards/" */
  PSERVER_ETCD_KEY_SHARD = 9        /* "/pserver/C/shards/<arg>" */
} pserver_etcd_key_kind_t;

/* Writes the full key of `kind` (a pserver_etcd_key_kind_t) in `cluster`,
 * NUL-terminated and truncated to fit `out` (`out_size` bytes; out may be
 * NULL when out_size is 0). Returns the full length without the NUL, as
 * snprintf does. `arg`: for SERVER and CHECKPOINT an index in decimal, for
 * WORKER a worker id; NULL or "" for the other kinds. INVALID_ARGUMENT
 * (returning 0, writing nothing) for a NULL cluster, an unknown kind, or an
 * arg the kind does not take. */
PSERVER_EXPORT size_t pserver_etcd_key(int32_t kind, const char* cluster, const char* arg,
                                       char* out, size_t out_size, pserver_status_t* status);
/* The kind of `key`, a full key of `cluster` (DESIRED, SERVER, CHECKPOINT or
 * WORKER), and its argument (the index in decimal, the worker id, or "")
 * written NUL-terminated into `out` (`out_size` bytes; strlen(key) + 1
 * always suffices). INVALID_ARGUMENT (returning -1, writing nothing) for a
 * key outside the layout or the cluster, or an `out` too small. */
PSERVER_EXPORT int32_t pserver_etcd_key_parse(const char* cluster, const char* key, char* out,
                                              size_t out_size, pserver_status_t* status);
/* The fields of a server's /ps/<index> value, "host:port instance=<id>",
 * that followed by " metrics=host:port" (a server with a metrics page), or a
 * bare "host:port", each written NUL-terminated ("" for a field the value
 * lacks) into a buffer of `*_size` bytes (strlen(value) + 1 always
 * suffices). Returns 0. INVALID_ARGUMENT (returning -1, writing nothing),
 * naming the value and what is wrong, for any other value (etcd's contents
 * are not trusted) or a NULL or too small buffer. */
PSERVER_EXPORT int32_t pserver_etcd_server_value_parse(const char* value, char* address,
                                                       size_t address_size, char* instance,
                                                       size_t instance_size, char* metrics,
                                                       size_t metrics_size,
                                                       pserver_status_t* status);

/* ------------------------------------------------------ device memory */

/* Gradients pushed straight from, and parameters pulled straight into, CUDA
 * device memory (a GPU trainer's tensors), staged through pinned host
 * memory in chunks, the copies overlapping the network (docs/cuda.md).
 * `device` is the CUDA device ordinal the memory belongs to; sizes are in
 * bytes, as for the host calls: `size` must be exactly the parameter's
 * (pserver_dtype_size(dtype) * elements) and `dtype` its type. A client
 * keeps the streams and pinned buffers of these calls between calls.
 * Errors: PSERVER_UNAVAILABLE "no CUDA device: <the runtime's reason>" on
 * a machine without a GPU or driver, or from a library built without CUDA;
 * PSERVER_INVALID_ARGUMENT for a pointer that is not device memory of
 * `device` (naming what it is, e.g. "host memory"), a device that does not
 * exist, or a dtype or size that does not match the parameter. Blocking
 * calls (convention 8): a status timeout is honoured. */

/* Sends the gradient in `size` bytes of device memory at `device_data`. */
PSERVER_EXPORT void pserver_client_send_grad_device(pserver_client_t* client, const char* name,
                                                    size_t name_len, int32_t dtype,
                                                    const void* device_data, size_t size,
                                                    int32_t device, pserver_status_t* status);
/* Reads parameter `name` into `out_size` bytes of device memory at
 * `device_out`. On error its contents are unspecified. */
PSERVER_EXPORT void pserver_client_get_param_device(pserver_client_t* client, const char* name,
                                                    size_t name_len, int32_t dtype,
                                                    void* device_out, size_t out_size,
                                                    int32_t device, pserver_status_t* status);
/* Sends the gradient at `device_data` and reads the updated parameter into
 * `device_out` (both `size` bytes; they may be the same memory), one round
 * trip per chunk. */
PSERVER_EXPORT void pserver_client_push_pull_device(pserver_client_t* client, const char* name,
                                                    size_t name_len, int32_t dtype,
                                                    const void* device_data, void* device_out,
                                                    size_t size, int32_t device,
                                                    pserver_status_t* status);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* PSERVER_CC_CAPI_PSERVER_CLUSTER_H_ */
