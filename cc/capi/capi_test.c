/* The C ABI from C: status, parameter config, the client over a local
 * cluster and a server, checkpoints, call timeouts, names and cancellation.
 * Tables are in capi_tables_test.c, etcd in capi_etcd_test.c. Compiled as
 * C11 and linked against libpserver.so, as a C program would. */
#define _POSIX_C_SOURCE 200809L /* mkdir, close */

#include <arpa/inet.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cc/capi/capi_test_util.h"
#include "cc/capi/pserver.h"

static void test_version_and_codes(void) {
  EXPECT(strcmp(pserver_version(), "0.7.0") == 0);
  /* The header's macros name the same version as the library. */
  char header_version[32];
  snprintf(header_version, sizeof header_version, "%d.%d.%d", PSERVER_VERSION_MAJOR,
           PSERVER_VERSION_MINOR, PSERVER_VERSION_PATCH);
  EXPECT(strcmp(pserver_version(), header_version) == 0);
  EXPECT(PSERVER_NOT_FOUND == 5 && PSERVER_ALREADY_EXISTS == 6 &&
         PSERVER_FAILED_PRECONDITION == 9 && PSERVER_UNAVAILABLE == 14 &&
         PSERVER_DATA_LOSS == 15);
  EXPECT(strcmp(pserver_code_name(PSERVER_INVALID_ARGUMENT), "INVALID_ARGUMENT") == 0);
  EXPECT(strcmp(pserver_code_name(99), "UNKNOWN_CODE") == 0);
  EXPECT(pserver_dtype_size(PSERVER_FLOAT32) == 4);
  EXPECT(pserver_dtype_size(PSERVER_UINT64) == 8);
  EXPECT(pserver_dtype_size(PSERVER_INT32) == 4);
  EXPECT(pserver_dtype_size(7) == 0);
  EXPECT(strcmp(pserver_dtype_name(PSERVER_FLOAT64), "float64") == 0);
  EXPECT(strcmp(pserver_dtype_name(42), "unknown") == 0);

  pserver_status_t* st = pserver_status_new();
  EXPECT_OK(st);
  pserver_status_set(st, PSERVER_ABORTED, "stop");
  EXPECT_STATUS(st, PSERVER_ABORTED, "stop");
  pserver_status_delete(st);
  /* NULL-safe deletes and a NULL status. */
  pserver_status_delete(NULL);
  pserver_client_delete(NULL);
  pserver_client_options_delete(NULL);
  pserver_server_delete(NULL);
  pserver_server_options_delete(NULL);
  pserver_local_cluster_delete(NULL);
  pserver_checkpoint_reader_delete(NULL);
  pserver_param_config_delete(NULL);
  pserver_batch_delete(NULL);
  EXPECT(pserver_status_code(NULL) == PSERVER_OK);
  pserver_client_finish_init(NULL, NULL); /* error dropped, no crash */
}

static void test_config(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_param_config_t* cfg = pserver_param_config_new();
  char text[512];

  pserver_param_config_set_optimizer(cfg, "adam", st);
  EXPECT_OK(st);
  pserver_param_config_set(cfg, "beta1", 0.8, st);
  EXPECT_OK(st);
  pserver_param_config_set(cfg, "lr", 0.05, st);
  EXPECT_OK(st);
  pserver_param_config_set(cfg, "clip_norm", 1.5, st);
  EXPECT_OK(st);
  pserver_param_config_set_schedule(cfg, "cosine", st);
  EXPECT_OK(st);
  pserver_param_config_set(cfg, "decay_steps", 100, st);
  EXPECT_OK(st);
  size_t n = pserver_param_config_text(cfg, text, sizeof text);
  EXPECT(n > 0 && n < sizeof text);
  EXPECT(strstr(text, "adam { beta1: 0.8 }") != NULL);
  EXPECT(strstr(text, "learning_rate: 0.05") != NULL);
  EXPECT(strstr(text, "clip_norm: 1.5") != NULL);
  EXPECT(strstr(text, "decay_steps: 100") != NULL);
  /* Truncation reports the full length, like snprintf. */
  char small[8];
  EXPECT(pserver_param_config_text(cfg, small, sizeof small) == n);
  EXPECT(strlen(small) == 7);

  /* Errors change nothing. */
  pserver_param_config_set(cfg, "momentum", 0.9, st); /* not an Adam setting */
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown config setting 'momentum'");
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "beta2");
  pserver_param_config_set(cfg, "decay_steps", -1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "whole number");
  pserver_param_config_set(cfg, "beta1", NAN, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "finite");
  pserver_param_config_set_optimizer(cfg, "lbfgs", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown optimizer 'lbfgs'");
  pserver_param_config_set_schedule(cfg, "exp", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown schedule");
  EXPECT(pserver_param_config_text(cfg, text, sizeof text) == n);

  pserver_param_config_set_optimizer(cfg, "sgd", st);
  pserver_param_config_set(cfg, "nesterov", 1, st);
  EXPECT_OK(st);
  pserver_param_config_set(cfg, "nesterov", 0.5, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "boolean");

  pserver_param_config_parse_text(cfg, "optimizer { rmsprop { alpha: 0.5 } }", st);
  EXPECT_OK(st);
  pserver_param_config_text(cfg, text, sizeof text);
  EXPECT(strstr(text, "rmsprop { alpha: 0.5 }") != NULL);
  pserver_param_config_parse_text(cfg, "optimizer { nope: 1 }", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "text format");
  /* Serialized proto: field 1 (optimizer), length 2, field 5 (adam), length 0. */
  const unsigned char adam[] = {0x0a, 0x02, 0x2a, 0x00};
  pserver_param_config_parse(cfg, adam, sizeof adam, st);
  EXPECT_OK(st);
  pserver_param_config_text(cfg, text, sizeof text);
  EXPECT(strstr(text, "adam {") != NULL);
  const unsigned char junk[] = {0xff, 0xff, 0xff};
  pserver_param_config_parse(cfg, junk, sizeof junk, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "ParameterConfig");

  pserver_param_config_delete(cfg);
  pserver_status_delete(st);
}

/* The whole client surface against `client` (fresh servers). */
static void exercise_client(pserver_client_t* client) {
  pserver_status_t* st = pserver_status_new();
  int64_t shape[2] = {2, 3};
  float w[6] = {1, 2, 3, 4, 5, 6};
  float g[6] = {1, 1, 1, 1, 1, 1};
  float out[6];
  double d_out[6];
  int64_t counts[4] = {10, 20, 30, 40};
  int64_t count_shape[1] = {4};

  pserver_param_config_t* sgd = pserver_param_config_new();
  pserver_param_config_set(sgd, "lr", 0.5, st);
  EXPECT_OK(st);
  pserver_param_config_t* add = pserver_param_config_new();
  pserver_param_config_set_optimizer(add, "add", st);

  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 2, w, sizeof w, sgd, st);
  EXPECT_OK(st);
  pserver_client_init_param(client, "counts", 6, PSERVER_INT64, count_shape, 1, counts,
                            sizeof counts, add, st);
  EXPECT_OK(st);
  /* A second init of a name: ALREADY_EXISTS. */
  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 2, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_ALREADY_EXISTS, "pserver already initialized");
  /* Size not matching the shape; unknown dtype. */
  pserver_client_init_param(client, "bad", 3, PSERVER_FLOAT32, shape, 2, w, 5, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 24 bytes");
  pserver_client_init_param(client, "bad", 3, 9, shape, 2, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown element type 9");
  pserver_client_init_param(client, NULL, 0, PSERVER_FLOAT32, shape, 2, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "name is NULL");

  /* Reads and gradients before finish_init: FAILED_PRECONDITION. */
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "not fully initialized");
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "not fully initialized");

  pserver_client_finish_init(client, st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st); /* idempotent */
  EXPECT_OK(st);

  /* Info first, then a read into a buffer of the size it gives. */
  int32_t dtype = 0;
  int64_t dims[4] = {0};
  size_t ndim = 0;
  pserver_client_param_info(client, "w", 1, &dtype, dims, 4, &ndim, st);
  EXPECT_OK(st);
  EXPECT(dtype == PSERVER_FLOAT32 && ndim == 2 && dims[0] == 2 && dims[1] == 3);
  pserver_client_param_info(client, "w", 1, &dtype, dims, 1, &ndim, st); /* capacity 1 */
  EXPECT_OK(st);
  EXPECT(ndim == 2);
  pserver_client_param_info(client, "nope", 4, &dtype, dims, 4, &ndim, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "nope");

  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_OK(st);
  EXPECT(out[0] == 1 && out[5] == 6);

  /* SGD lr 0.5: w -= 0.5 * g. */
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_OK(st);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_OK(st);
  EXPECT(out[0] == 0.5f && out[5] == 5.5f);

  /* Wrong dtype, wrong size, unknown name: nothing is applied or written. */
  double dg[6] = {1, 1, 1, 1, 1, 1};
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT64, dg, sizeof dg, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float32");
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, 5 * sizeof(float), st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 24 bytes");
  pserver_client_send_grad(client, "nope", 4, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "nope");
  memset(d_out, 0, sizeof d_out);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT64, d_out, sizeof d_out, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float32");
  EXPECT(d_out[0] == 0);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, 4, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 24 bytes, the buffer has 4");
  pserver_client_get_param(client, "nope", 4, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "nope");
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT(out[0] == 0.5f);

  /* Batched gradients, batched reads, push-pull. */
  pserver_batch_t* grads = pserver_batch_new();
  pserver_batch_t* outs = pserver_batch_new();
  int64_t dcounts[4] = {1, 2, 3, 4};
  int64_t counts_out[4];
  pserver_batch_add_input(grads, "w", 1, PSERVER_FLOAT32, g, sizeof g);
  pserver_batch_add_input(grads, "counts", 6, PSERVER_INT64, dcounts, sizeof dcounts);
  EXPECT(pserver_batch_size(grads) == 2);
  pserver_client_send_grads(client, grads, st);
  EXPECT_OK(st);
  pserver_batch_add_output(outs, "w", 1, PSERVER_FLOAT32, out, sizeof out);
  pserver_batch_add_output(outs, "counts", 6, PSERVER_INT64, counts_out, sizeof counts_out);
  pserver_client_get_params(client, outs, st);
  EXPECT_OK(st);
  EXPECT(out[0] == 0.0f && out[5] == 5.0f);
  EXPECT(counts_out[0] == 11 && counts_out[3] == 44);

  pserver_client_push_pull(client, grads, outs, st);
  EXPECT_OK(st);
  EXPECT(out[0] == -0.5f && counts_out[3] == 48);

  /* A batch with one bad part is applied not at all. */
  pserver_batch_t* bad = pserver_batch_new();
  pserver_batch_add_input(bad, "counts", 6, PSERVER_INT64, dcounts, sizeof dcounts);
  pserver_batch_add_input(bad, "w", 1, PSERVER_FLOAT64, dg, sizeof dg);
  pserver_client_send_grads(client, bad, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float32");
  pserver_client_get_params(client, outs, st);
  EXPECT_OK(st);
  EXPECT(counts_out[3] == 48);
  /* Outputs that do not match the gradients, inputs used as outputs. */
  pserver_batch_clear(bad);
  EXPECT(pserver_batch_size(bad) == 0);
  pserver_batch_add_output(bad, "w", 1, PSERVER_FLOAT32, out, sizeof out);
  pserver_client_push_pull(client, grads, bad, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "2 gradients but 1 outputs");
  pserver_client_send_grads(client, bad, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "is an output");
  pserver_client_get_params(client, grads, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "not an output");
  pserver_client_get_params(client, outs, st);
  EXPECT(counts_out[3] == 48); /* the failed push_pull applied nothing */

  /* Stats: one entry per server; gradients were counted. */
  pserver_server_stats_t stats[8];
  size_t n = pserver_client_stats(client, stats, 8, sizeof stats[0], st);
  EXPECT_OK(st);
  EXPECT(n == (size_t)pserver_client_num_servers(client));
  uint64_t applied = 0, params = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT(stats[i].index == i);
    EXPECT(stats[i].initialized == 1);
    applied += stats[i].gradients_applied;
    params += stats[i].parameters;
  }
  EXPECT(applied >= 5);
  EXPECT(params >= 2); /* blocks held */
  EXPECT(pserver_client_stats(client, NULL, 0, sizeof stats[0], st) == n);
  EXPECT_OK(st);

  /* The cluster's parameters, each once, in name order. */
  pserver_param_list_t* list = pserver_client_list_params(client, st);
  EXPECT_OK(st);
  EXPECT(pserver_param_list_size(list) == 2);
  size_t name_len = 0;
  EXPECT(strncmp(pserver_param_list_name(list, 0, &name_len), "counts", 6) == 0 && name_len == 6);
  EXPECT(strncmp(pserver_param_list_name(list, 1, &name_len), "w", 1) == 0 && name_len == 1);
  EXPECT(pserver_param_list_name(list, 2, &name_len) == NULL && name_len == 0);
  int32_t l_dtype = -1;
  int64_t l_dims[4] = {0};
  size_t l_ndim = 0;
  uint32_t held = 0, count = 0;
  const char* optimizer = NULL;
  pserver_param_list_info(list, 1, &l_dtype, l_dims, 4, &l_ndim, &held, &count, &optimizer, st);
  EXPECT_OK(st);
  EXPECT(l_dtype == PSERVER_FLOAT32 && l_ndim == 2 && l_dims[0] == 2 && l_dims[1] == 3);
  EXPECT(held == count && count >= 1 && strcmp(optimizer, "sgd") == 0);
  pserver_param_list_info(list, 0, &l_dtype, NULL, 0, &l_ndim, NULL, NULL, &optimizer, st);
  EXPECT(l_dtype == PSERVER_INT64 && l_ndim == 1 && strcmp(optimizer, "add") == 0);
  pserver_param_list_info(list, 2, &l_dtype, NULL, 0, NULL, NULL, NULL, NULL, st);
  EXPECT_STATUS(st, PSERVER_OUT_OF_RANGE, "entry 2 of a list of 2");
  pserver_param_list_delete(list);
  pserver_param_list_delete(NULL);

  pserver_batch_delete(bad);
  pserver_batch_delete(outs);
  pserver_batch_delete(grads);
  pserver_param_config_delete(add);
  pserver_param_config_delete(sgd);
  pserver_status_delete(st);
}

static void test_local_cluster(void) {
  pserver_status_t* st = pserver_status_new();
  EXPECT(pserver_local_cluster_new(0, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "at least 1 server");

  pserver_local_cluster_t* cluster = pserver_local_cluster_new(3, st);
  EXPECT_OK(st);
  EXPECT(pserver_local_cluster_size(cluster) == 3);
  EXPECT(strncmp(pserver_local_cluster_address(cluster, 0), "127.0.0.1:", 10) == 0);
  EXPECT(pserver_local_cluster_address(cluster, 3) == NULL);
  EXPECT(pserver_local_cluster_address(cluster, -1) == NULL);

  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_set_block_bytes(opts, 16); /* 6 floats: 2 blocks */
  pserver_client_t* client = pserver_local_cluster_client(cluster, opts, st);
  EXPECT_OK(st);
  EXPECT(pserver_client_num_servers(client) == 3);
  exercise_client(client);

  /* A gRPC client of the same cluster sees the same parameters. */
  pserver_client_options_t* remote_opts = pserver_client_options_new();
  pserver_client_options_set_block_bytes(remote_opts, 16);
  for (int i = 0; i < 3; ++i) {
    pserver_client_options_add_server(remote_opts, pserver_local_cluster_address(cluster, i));
  }
  pserver_client_t* remote = pserver_client_new(remote_opts, st);
  EXPECT_OK(st);
  float a[6], b[6];
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, a, sizeof a, st);
  EXPECT_OK(st);
  pserver_client_get_param(remote, "w", 1, PSERVER_FLOAT32, b, sizeof b, st);
  EXPECT_OK(st);
  EXPECT(memcmp(a, b, sizeof a) == 0);
  pserver_client_delete(remote);

  /* After stop, the in-process client fails cleanly; stop is idempotent. */
  pserver_local_cluster_stop(cluster);
  pserver_local_cluster_stop(cluster);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, a, sizeof a, st);
  EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "stopped");
  EXPECT(pserver_local_cluster_client(cluster, NULL, st) == NULL);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "stopped");
  /* The client may outlive the cluster handle. */
  pserver_local_cluster_delete(cluster);
  pserver_client_finish_init(client, st);
  EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "stopped");
  pserver_client_delete(client);
  pserver_client_options_delete(remote_opts);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
}

static void test_server(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_server_t* server = pserver_server_new(NULL, st);
  EXPECT_OK(st);
  EXPECT(pserver_server_port(server) > 0);
  char want[64];
  snprintf(want, sizeof want, "127.0.0.1:%d", (int)pserver_server_port(server));
  EXPECT(strcmp(pserver_server_address(server), want) == 0);

  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_add_server(opts, pserver_server_address(server));
  pserver_client_options_set_timeout_ms(opts, 2000);
  pserver_client_options_set_max_request_bytes(opts, 1 << 20);
  pserver_client_options_set_channels_per_server(opts, 1);
  pserver_client_t* client = pserver_client_new(opts, st);
  EXPECT_OK(st);
  exercise_client(client);

  pserver_server_stop(server, 0);
  pserver_server_stop(server, 0); /* idempotent */
  float out[6];
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT(pserver_status_code(st) == PSERVER_UNAVAILABLE ||
         pserver_status_code(st) == PSERVER_DEADLINE_EXCEEDED);
  pserver_client_delete(client);
  pserver_server_delete(server);

  /* Bad options. */
  pserver_server_options_t* sopts = pserver_server_options_new();
  pserver_server_options_set_host(sopts, "127.0.0.1");
  pserver_server_options_set_index(sopts, 1);
  pserver_server_options_set_num_threads(sopts, 2);
  pserver_server_options_set_port(sopts, 70000);
  EXPECT(pserver_server_new(sopts, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "");
  /* Every address without an address to publish: refused, naming the flag. */
  pserver_server_options_set_port(sopts, 0);
  pserver_server_options_set_host(sopts, "0.0.0.0");
  EXPECT(pserver_server_new(sopts, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "advertise_host");
  pserver_server_options_set_advertise_host(sopts, "127.0.0.1");
  pserver_server_t* advertised = pserver_server_new(sopts, st);
  EXPECT_OK(st);
  if (advertised != NULL) {
    EXPECT(strncmp(pserver_server_address(advertised), "127.0.0.1:", 10) == 0);
    pserver_server_delete(advertised);
  }
  pserver_server_options_delete(sopts);

  pserver_client_options_t* none = pserver_client_options_new();
  EXPECT(pserver_client_new(none, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "");
  pserver_client_options_add_server(none, "127.0.0.1:1");
  pserver_client_options_set_timeout_ms(none, 0);
  EXPECT(pserver_client_new(none, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "timeout");
  EXPECT(pserver_client_new(NULL, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "options is NULL");
  /* Nobody listens on port 1: the first call fails, nothing aborts. */
  pserver_client_options_set_timeout_ms(none, 500);
  pserver_client_t* lonely = pserver_client_new(none, st);
  EXPECT_OK(st);
  pserver_client_finish_init(lonely, st);
  EXPECT(pserver_status_code(st) == PSERVER_UNAVAILABLE ||
         pserver_status_code(st) == PSERVER_DEADLINE_EXCEEDED);
  pserver_client_delete(lonely);
  pserver_client_options_delete(none);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
}

static void test_checkpoint_reader_errors(void) {
  pserver_status_t* st = pserver_status_new();
  char dir[1024];
  const char* tmp = getenv("TEST_TMPDIR");
  snprintf(dir, sizeof dir, "%s/capi_ckpt", tmp != NULL ? tmp : "/tmp");
  EXPECT(pserver_checkpoint_reader_new("/nonexistent/pserver/ckpt", st) == NULL);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "does not exist");
  mkdir(dir, 0755);
  EXPECT(pserver_checkpoint_reader_new(dir, st) == NULL);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "no checkpoint");
  /* A checkpoint directory with a garbled MANIFEST: DATA_LOSS. */
  char ckpt[1100], manifest[1200];
  snprintf(ckpt, sizeof ckpt, "%s/ckpt-00000000000000000001", dir);
  mkdir(ckpt, 0755);
  snprintf(manifest, sizeof manifest, "%s/MANIFEST", ckpt);
  FILE* f = fopen(manifest, "wb");
  EXPECT(f != NULL);
  if (f != NULL) {
    fputs("not a manifest at all", f);
    fclose(f);
  }
  EXPECT(pserver_checkpoint_reader_new(ckpt, st) == NULL);
  EXPECT_STATUS(st, PSERVER_DATA_LOSS, "checksum validation failed");
  EXPECT(pserver_checkpoint_reader_num_params(NULL) == 0);
  EXPECT(pserver_checkpoint_reader_param_name(NULL, 0, NULL) == NULL);
  pserver_checkpoint_reader_verify(NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "reader is NULL");
  pserver_status_delete(st);
}

/* Flips the first byte of `path`; returns 1 if the file had one. */
static int flip_first_byte(const char* path) {
  FILE* f = fopen(path, "r+b");
  if (f == NULL) return 0;
  int c = fgetc(f);
  int done = 0;
  if (c != EOF) {
    fseek(f, 0, SEEK_SET);
    fputc(c ^ 0xff, f);
    done = 1;
  }
  fclose(f);
  return done;
}

static void test_checkpoints(void) {
  pserver_status_t* st = pserver_status_new();
  char dir[1024];
  const char* tmp = getenv("TEST_TMPDIR");
  snprintf(dir, sizeof dir, "%s/capi_cluster_ckpt", tmp != NULL ? tmp : "/tmp");

  pserver_server_options_t* base = pserver_server_options_new();
  pserver_server_options_set_checkpoint_dir(base, dir);
  pserver_local_cluster_t* cluster = pserver_local_cluster_new_with_options(3, base, st);
  EXPECT_OK(st);
  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_set_block_bytes(opts, 16); /* w: 4 blocks over 3 shards */
  pserver_client_t* client = pserver_local_cluster_client(cluster, opts, st);
  EXPECT_OK(st);

  double w[7] = {1, 2, 3, 4, 5, 6, 7}, g[7] = {1, 1, 1, 1, 1, 1, 1}, got[7];
  int64_t shape[1] = {7};
  uint32_t ids[3] = {7, 8, 9};
  int64_t ids_shape[1] = {3};
  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT64, shape, 1, w, sizeof w, NULL, st);
  EXPECT_OK(st);
  pserver_client_init_param(client, "ids", 3, PSERVER_UINT32, ids_shape, 1, ids, sizeof ids, NULL,
                            st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st);
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT64, g, sizeof g, st);
  EXPECT_OK(st);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT64, got, sizeof got, st);
  EXPECT_OK(st);
  pserver_client_save_checkpoint(client, st); /* in process */
  EXPECT_OK(st);
  pserver_local_cluster_save_checkpoint(cluster, st);
  EXPECT_OK(st);

  /* The Save RPC from a gRPC client of the same servers. */
  pserver_client_options_t* remote_opts = pserver_client_options_new();
  for (int i = 0; i < 3; ++i) {
    pserver_client_options_add_server(remote_opts, pserver_local_cluster_address(cluster, i));
  }
  pserver_client_t* remote = pserver_client_new(remote_opts, st);
  pserver_client_save_checkpoint(remote, st);
  EXPECT_OK(st);
  pserver_client_delete(remote);
  pserver_client_options_delete(remote_opts);
  pserver_client_delete(client);
  pserver_local_cluster_delete(cluster);

  /* A server without a checkpoint directory cannot save. */
  pserver_server_t* plain = pserver_server_new(NULL, st);
  pserver_server_save_checkpoint(plain, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "checkpoint");
  pserver_server_delete(plain);

  /* Read everything back from the directory of shards. */
  pserver_checkpoint_reader_t* reader = pserver_checkpoint_reader_new(dir, st);
  EXPECT_OK(st);
  EXPECT(pserver_checkpoint_reader_num_checkpoints(reader) == 3);
  EXPECT(pserver_checkpoint_reader_num_params(reader) == 2);
  EXPECT(strcmp(pserver_checkpoint_reader_param_name(reader, 0, NULL), "ids") == 0);
  EXPECT(strcmp(pserver_checkpoint_reader_param_name(reader, 1, NULL), "w") == 0);
  EXPECT(pserver_checkpoint_reader_param_name(reader, 2, NULL) == NULL);
  EXPECT(pserver_checkpoint_reader_checkpoint_path(reader, 3) == NULL);
  int32_t dtype = 0;
  int64_t dims[2];
  size_t ndim = 0;
  pserver_checkpoint_reader_param_info(reader, "w", 1, &dtype, dims, 2, &ndim, st);
  EXPECT_OK(st);
  EXPECT(dtype == PSERVER_FLOAT64 && ndim == 1 && dims[0] == 7);
  pserver_checkpoint_reader_param_info(reader, "nope", 4, &dtype, dims, 2, &ndim, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "nope");
  double back[7];
  pserver_checkpoint_reader_read(reader, "w", 1, PSERVER_FLOAT64, back, sizeof back, st);
  EXPECT_OK(st);
  EXPECT(memcmp(back, got, sizeof got) == 0);
  EXPECT(back[0] == 1 - 0.01); /* SGD, default learning rate 0.01 */
  uint32_t ids_back[3];
  pserver_checkpoint_reader_read(reader, "ids", 3, PSERVER_UINT32, ids_back, sizeof ids_back, st);
  EXPECT_OK(st);
  EXPECT(ids_back[0] == 7 && ids_back[2] == 9);
  pserver_checkpoint_reader_read(reader, "w", 1, PSERVER_FLOAT32, back, 28, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float64");
  pserver_checkpoint_reader_read(reader, "w", 1, PSERVER_FLOAT64, back, 8, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 56 bytes");
  pserver_checkpoint_reader_verify(reader, st);
  EXPECT_OK(st);

  /* One shard alone lacks blocks of w. */
  char shard[1100];
  snprintf(shard, sizeof shard, "%s/shard-0", dir);
  pserver_checkpoint_reader_t* one = pserver_checkpoint_reader_new(shard, st);
  EXPECT_OK(st);
  EXPECT(pserver_checkpoint_reader_num_checkpoints(one) == 1);
  pserver_checkpoint_reader_read(one, "w", 1, PSERVER_FLOAT64, back, sizeof back, st);
  EXPECT_STATUS(st, PSERVER_DATA_LOSS, "in none of the opened checkpoints");
  pserver_checkpoint_reader_delete(one);

  /* Resharded for 2 servers: the same values from 2 checkpoints. */
  char two[1100];
  snprintf(two, sizeof two, "%s-2", dir);
  pserver_checkpoint_reshard(dir, two, 2, -1, st);
  EXPECT_OK(st);
  pserver_checkpoint_reader_t* resharded = pserver_checkpoint_reader_new(two, st);
  EXPECT_OK(st);
  EXPECT(pserver_checkpoint_reader_num_checkpoints(resharded) == 2);
  memset(back, 0, sizeof back);
  pserver_checkpoint_reader_read(resharded, "w", 1, PSERVER_FLOAT64, back, sizeof back, st);
  EXPECT_OK(st);
  EXPECT(memcmp(back, got, sizeof got) == 0);
  pserver_checkpoint_reader_delete(resharded);
  pserver_checkpoint_reshard(dir, two, 2, -1, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "is not empty");
  pserver_checkpoint_reshard(NULL, two, 2, -1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "from");
  pserver_checkpoint_reshard(dir, "/nonexistent/pserver/out", 0, -1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "got 0");

  /* Damage every data file: reads and verify fail naming the file. */
  int damaged = 0;
  for (size_t i = 0; i < pserver_checkpoint_reader_num_checkpoints(reader); ++i) {
    char data[1200];
    snprintf(data, sizeof data, "%s/data-00000.bin",
             pserver_checkpoint_reader_checkpoint_path(reader, i));
    damaged += flip_first_byte(data);
  }
  EXPECT(damaged > 0);
  pserver_checkpoint_reader_verify(reader, st);
  EXPECT_STATUS(st, PSERVER_DATA_LOSS, "checkpoint file checksum validation failed");
  EXPECT_STATUS(st, PSERVER_DATA_LOSS, "data-00000.bin");
  memset(back, 0, sizeof back);
  pserver_checkpoint_reader_read(reader, "w", 1, PSERVER_FLOAT64, back, sizeof back, st);
  EXPECT_STATUS(st, PSERVER_DATA_LOSS, "checksum validation failed");
  EXPECT(back[0] == 0); /* nothing written */
  pserver_checkpoint_reader_delete(reader);

  pserver_client_options_delete(opts);
  pserver_server_options_delete(base);
  pserver_status_delete(st);
}

/* ------------------------------------------------------- call timeouts */

/* A status timeout bounds a blocking call far below the client's own 30 s:
 * the server is a 127.0.0.1 socket that listens but never accepts, so no
 * gRPC handshake ever completes. */
static void test_status_timeout(void) {
  pserver_status_t* st = pserver_status_new();
  EXPECT(pserver_status_timeout_ms(st) == 0);
  EXPECT(pserver_status_timeout_ms(NULL) == 0);
  pserver_status_set_timeout_ms(NULL, 5); /* ignored */
  pserver_status_set(st, PSERVER_NOT_FOUND, "kept");
  pserver_status_set_timeout_ms(st, 200);
  EXPECT(pserver_status_timeout_ms(st) == 200);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "kept"); /* the code and message stay */

  int fd = socket(AF_INET, SOCK_STREAM, 0);
  EXPECT(fd >= 0);
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  EXPECT(bind(fd, (struct sockaddr*)&addr, sizeof addr) == 0);
  EXPECT(listen(fd, 16) == 0);
  EXPECT(getsockname(fd, (struct sockaddr*)&addr, &len) == 0);
  char address[64];
  snprintf(address, sizeof address, "127.0.0.1:%d", ntohs(addr.sin_port));

  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_add_server(opts, address);
  pserver_client_options_set_timeout_ms(opts, 30000);
  pserver_client_t* client = pserver_client_new(opts, st);
  EXPECT_OK(st);
  EXPECT(pserver_status_timeout_ms(st) == 200); /* survives a call */

  float w[2] = {0, 0};
  double start = now_seconds();
  pserver_client_finish_init(client, st);
  double elapsed = now_seconds() - start;
  EXPECT(pserver_status_code(st) == PSERVER_DEADLINE_EXCEEDED ||
         pserver_status_code(st) == PSERVER_UNAVAILABLE);
  EXPECT(elapsed >= 0.15 && elapsed < 5.0);

  start = now_seconds();
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, w, sizeof w, st);
  elapsed = now_seconds() - start;
  EXPECT(pserver_status_code(st) == PSERVER_DEADLINE_EXCEEDED ||
         pserver_status_code(st) == PSERVER_UNAVAILABLE);
  EXPECT(elapsed < 5.0);

  /* <= 0 clears it: the client's own timeout applies again. */
  pserver_status_set_timeout_ms(st, -1);
  EXPECT(pserver_status_timeout_ms(st) == 0);

  start = now_seconds();
  pserver_client_delete(client); /* nothing left in flight */
  EXPECT(now_seconds() - start < 5.0);
  pserver_client_options_delete(opts);
  close(fd);
  pserver_status_delete(st);
}

/* ------------------------------------------------- names and cancellation */

/* Names travel with their length: a NUL inside is refused, never cut. */
static void test_names_with_length(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  EXPECT_OK(st);
  pserver_client_t* client = pserver_local_cluster_client(cluster, NULL, st);
  EXPECT_OK(st);
  float w[2] = {1, 2}, out[2] = {0, 0};
  int64_t shape[1] = {2};

  pserver_client_init_param(client, "a\0b", 3, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "parameter name \"a\\x00b\" holds a NUL byte");
  pserver_client_init_param(client, "", 0, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "parameter name is empty");
  pserver_client_init_param(client, "w\xff", 2, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "is not valid UTF-8 (byte 1)");
  pserver_client_init_param(client, "\xed\xa0\x80", 3, PSERVER_FLOAT32, shape, 1, w, sizeof w,
                            NULL, st); /* a UTF-16 surrogate */
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "is not valid UTF-8");
  pserver_client_send_grad(client, "a\0b", 3, PSERVER_FLOAT32, w, sizeof w, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "holds a NUL byte");

  /* The length decides: "wx" with length 1 is "w"; UTF-8 is welcome. */
  pserver_client_init_param(client, "wx", 1, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_OK(st);
  pserver_client_init_param(client, "\xc3\xa9t\xc3\xa9", 5, PSERVER_FLOAT32, shape, 1, w,
                            sizeof w, NULL, st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st);
  EXPECT_OK(st);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_OK(st);
  EXPECT(out[0] == 1 && out[1] == 2);
  /* Nothing was stored under "a", the name cut at its NUL. */
  pserver_client_get_param(client, "a", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "");

  /* Batches check every entry's name before sending anything. */
  pserver_batch_t* batch = pserver_batch_new();
  pserver_batch_add_input(batch, "w", 1, PSERVER_FLOAT32, w, sizeof w);
  pserver_batch_add_input(batch, "w\0", 2, PSERVER_FLOAT32, w, sizeof w);
  pserver_client_send_grads(client, batch, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "holds a NUL byte (byte 1)");
  pserver_batch_clear(batch);
  pserver_batch_add_output(batch, "w\0", 2, PSERVER_FLOAT32, out, sizeof out);
  pserver_client_get_params(client, batch, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "holds a NUL byte");
  pserver_batch_delete(batch);

  /* Tables: the same, and the name comes back with its length. */
  EXPECT(pserver_client_create_table(client, "t\0x", 3, NULL, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "table name \"t\\x00x\" holds a NUL byte");
  EXPECT(pserver_client_create_table(client, "", 0, NULL, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "table name is empty");
  pserver_table_t* t = pserver_client_create_table(client, "tab", 2, NULL, st);
  EXPECT_OK(st);
  size_t len = 99;
  EXPECT(strcmp(pserver_table_name(t, &len), "ta") == 0 && len == 2);
  EXPECT(strcmp(pserver_table_name(NULL, &len), "") == 0 && len == 0);
  pserver_table_delete(t);

  pserver_client_delete(client);
  pserver_local_cluster_delete(cluster);
  pserver_status_delete(st);
}

struct cancelled_call {
  pserver_group_t* group;
  pserver_status_t* st;
  double elapsed;
};

static void* lonely_barrier(void* arg) {
  struct cancelled_call* c = arg;
  double start = now_seconds();
  pserver_group_barrier(c->group, PSERVER_BARRIER_WORKERS, c->st);
  c->elapsed = now_seconds() - start;
  return NULL;
}

/* pserver_cancel_cancel from another thread ends a blocking call. */
static void test_cancel(void) {
  EXPECT(pserver_cancel_cancelled(NULL) == 0);
  pserver_cancel_cancel(NULL); /* ignored */
  pserver_status_set_cancel(NULL, NULL);

  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  EXPECT_OK(st);
  pserver_client_options_t* opts = pserver_client_options_new();
  for (int i = 0; i < 2; ++i) {
    pserver_client_options_add_server(opts, pserver_local_cluster_address(cluster, i));
  }
  pserver_client_options_set_timeout_ms(opts, 60000);
  pserver_client_t* client = pserver_client_new(opts, st); /* over gRPC */
  EXPECT_OK(st);
  pserver_group_t* group = pserver_group_new(client, "c", 2, "alone", st);
  EXPECT_OK(st);

  /* A barrier of 2 with one member would wait its whole minute. */
  pserver_cancel_t* cancel = pserver_cancel_new();
  struct cancelled_call call = {group, pserver_status_new(), 0};
  pserver_status_set_cancel(call.st, cancel);
  pserver_status_set_timeout_ms(call.st, 60000);
  pthread_t thread;
  EXPECT(pthread_create(&thread, NULL, lonely_barrier, &call) == 0);
  EXPECT(pserver_cancel_cancelled(cancel) == 0);
  pserver_cancel_cancel(cancel);
  pserver_cancel_cancel(cancel); /* idempotent */
  EXPECT(pserver_cancel_cancelled(cancel) == 1);
  pthread_join(thread, NULL);
  EXPECT_STATUS(call.st, PSERVER_CANCELLED, "cancelled");
  EXPECT(call.elapsed < 10.0);

  /* Sticky, and the status keeps it after the handle is deleted. */
  pserver_cancel_delete(cancel);
  pserver_client_finish_init(client, call.st);
  EXPECT_STATUS(call.st, PSERVER_CANCELLED, "cancelled");
  /* Without it, calls work again. */
  pserver_status_set_cancel(call.st, NULL);
  pserver_client_finish_init(client, call.st);
  EXPECT_OK(call.st);

  pserver_status_delete(call.st);
  pserver_group_delete(group);
  pserver_client_delete(client);
  pserver_client_options_delete(opts);
  pserver_local_cluster_delete(cluster);
  pserver_status_delete(st);
}

struct check_calls {
  pthread_t caller;
  int calls;
  int on_caller; /* calls made on the thread that made the blocking call */
  int cancel_at; /* the call that answers 1 */
};

static int count_and_cancel(void* arg) {
  struct check_calls* c = arg;
  ++c->calls;
  if (pthread_equal(pthread_self(), c->caller)) ++c->on_caller;
  return c->calls == c->cancel_at;
}

/* pserver_cancel_set_check: a blocking call runs the check on its own thread
 * while it waits, and ends CANCELLED the first time the check says so: while
 * waiting for a reply (a barrier nobody else joins) and between retries (a
 * server that is down). Nothing else runs it: no other thread is started. */
static void test_cancel_check(void) {
  pserver_cancel_set_check(NULL, count_and_cancel, NULL, 1); /* ignored */
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(1, st);
  EXPECT_OK(st);
  char down[128];
  snprintf(down, sizeof down, "%s", pserver_local_cluster_address(cluster, 0));
  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_add_server(opts, down);
  pserver_client_options_set_timeout_ms(opts, 60000);
  pserver_client_t* client = pserver_client_new(opts, st); /* over gRPC */
  EXPECT_OK(st);
  pserver_group_t* group = pserver_group_new(client, "c", 2, "alone", st);
  EXPECT_OK(st);

  for (int round = 0; round < 2; ++round) {
    if (round == 1) pserver_local_cluster_delete(cluster); /* the server is down now */
    struct check_calls calls = {pthread_self(), 0, 0, 3};
    pserver_cancel_t* cancel = pserver_cancel_new();
    pserver_cancel_set_check(cancel, count_and_cancel, &calls, 1);
    pserver_status_t* call = pserver_status_new();
    pserver_status_set_cancel(call, cancel);
    double start = now_seconds();
    if (round == 0) {
      pserver_group_barrier(group, PSERVER_BARRIER_WORKERS, call); /* would wait 60 s */
    } else {
      pserver_client_finish_init(client, call); /* would retry for 60 s */
    }
    EXPECT_STATUS(call, PSERVER_CANCELLED, "cancelled");
    EXPECT(now_seconds() - start < 30.0);
    EXPECT(calls.calls == 3 && calls.on_caller == 3); /* not run again once cancelled */
    EXPECT(pserver_cancel_cancelled(cancel) == 1);
    /* Removed, the check is not run: a cancelled handle stays cancelled. */
    pserver_cancel_set_check(cancel, NULL, NULL, 0);
    pserver_client_finish_init(client, call);
    EXPECT_STATUS(call, PSERVER_CANCELLED, "cancelled");
    EXPECT(calls.calls == 3);
    pserver_status_delete(call);
    pserver_cancel_delete(cancel);
  }

  pserver_group_delete(group);
  pserver_client_delete(client);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
}

int main(void) {
  test_version_and_codes();
  test_config();
  test_local_cluster();
  test_server();
  test_checkpoint_reader_errors();
  test_checkpoints();
  test_status_timeout();
  test_names_with_length();
  test_cancel();
  test_cancel_check();
  return capi_test_report("capi_test");
}
