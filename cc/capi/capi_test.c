/* The C ABI from C: every call of pserver.h, happy paths and errors.
 * Compiled as C11 and linked against libpserver.so, as a C program would. */
#define _POSIX_C_SOURCE 200809L /* fork, kill, mkdtemp: to start etcd */

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cc/capi/pserver.h"

static int failures = 0;

#define EXPECT(cond)                                                     \
  do {                                                                   \
    if (!(cond)) {                                                       \
      fprintf(stderr, "%s:%d: EXPECT failed: %s\n", __FILE__, __LINE__, \
              #cond);                                                    \
      ++failures;                                                        \
    }                                                                    \
  } while (0)

/* The status has `code`, and its message contains `part`. */
#define EXPECT_STATUS(st, code, part)                                             \
  do {                                                                            \
    if (pserver_status_code(st) != (code) ||                                      \
        strstr(pserver_status_message(st), (part)) == NULL) {                     \
      fprintf(stderr, "%s:%d: want %s containing \"%s\", got %s: \"%s\"\n",       \
              __FILE__, __LINE__, pserver_code_name(code), (part),                \
              pserver_code_name(pserver_status_code(st)),                         \
              pserver_status_message(st));                                        \
      ++failures;                                                                 \
    }                                                                             \
  } while (0)

#define EXPECT_OK(st) EXPECT_STATUS(st, PSERVER_OK, "")

static void test_version_and_codes(void) {
  EXPECT(strcmp(pserver_version(), "0.3.0") == 0);
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

static double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

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

/* ------------------------------------------------------------ tables */

static void test_table_config(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_table_config_t* cfg = pserver_table_config_new();
  char text[512];
  pserver_table_config_text(cfg, text, sizeof text);
  EXPECT(strcmp(text, "dim: 1") == 0);
  pserver_table_config_set_dim(cfg, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "dim must be in [1, 2^20]");
  pserver_table_config_set_dim(cfg, 4, st);
  EXPECT_OK(st);
  pserver_table_config_set_dtype(cfg, PSERVER_INT32, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float32 or float64");
  pserver_table_config_set_dtype(cfg, PSERVER_FLOAT64, st);
  EXPECT_OK(st);
  pserver_table_config_set_optimizer(cfg, "adadelta", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "sgd, adagrad, adam, ftrl, add");
  pserver_table_config_set_optimizer(cfg, "adam", st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "lr", 0.1, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "beta1", 0.8, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "momentum", 0.9, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "valid settings: learning_rate, beta1");
  pserver_table_config_set_initializer(cfg, "gaussian", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "zeros, uniform, normal");
  pserver_table_config_set_initializer(cfg, "normal", st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "stddev", 0.5, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "seed", 42, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "ttl_seconds", 60, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "capacity", 1000, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "admission_count", -1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "admission_count");
  pserver_table_config_set(cfg, "admission_count", 2, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "chunk_size", 8, st);
  EXPECT_OK(st);
  pserver_table_config_set_partitioning(cfg, PSERVER_PARTITION_RANGE, 10, 5, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "range_begin < range_end");
  pserver_table_config_set_partitioning(cfg, 7, 0, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown partitioning");
  pserver_table_config_set_partitioning(cfg, PSERVER_PARTITION_RANGE, 0, 100, st);
  EXPECT_OK(st);
  pserver_table_config_set_consistency(cfg, 9, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown consistency");
  pserver_table_config_set_consistency(cfg, PSERVER_SSP, 3, st);
  EXPECT_OK(st);
  pserver_table_config_set(cfg, "staleness", 2, st);
  EXPECT_OK(st);
  size_t len = pserver_table_config_text(cfg, text, sizeof text);
  EXPECT(len == strlen(text));
  EXPECT(strstr(text, "dim: 4") != NULL);
  EXPECT(strstr(text, "element_type: FLOAT64") != NULL);
  EXPECT(strstr(text, "adam { learning_rate: 0.1 beta1: 0.8 }") != NULL);
  EXPECT(strstr(text, "normal { stddev: 0.5 } seed: 42") != NULL);
  EXPECT(strstr(text, "eviction { ttl_seconds: 60 capacity: 1000 admission_count: 2 }") != NULL);
  EXPECT(strstr(text, "partitioning { kind: RANGE range_end: 100 }") != NULL);
  EXPECT(strstr(text, "consistency { model: SSP staleness: 2 }") != NULL);
  EXPECT(strstr(text, "chunk_size: 8") != NULL);
  EXPECT(pserver_table_config_text(cfg, NULL, 0) == len);

  pserver_table_config_parse_text(cfg, "dim: x", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "not a pserver.v1.TableConfig");
  pserver_table_config_parse_text(cfg, "dim: 2 optimizer { add {} }", st);
  EXPECT_OK(st);
  pserver_table_config_text(cfg, text, sizeof text);
  EXPECT(strcmp(text, "dim: 2 optimizer { add { } }") == 0);
  pserver_table_config_set(NULL, "lr", 1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "config is NULL");
  pserver_table_config_delete(cfg);
  pserver_table_config_delete(NULL);
  pserver_status_delete(st);
}

static void test_sparse_table(pserver_client_t* client) {
  pserver_status_t* st = pserver_status_new();
  pserver_status_set_timeout_ms(st, 10000);
  pserver_table_config_t* cfg = pserver_table_config_new();
  pserver_table_config_set_dim(cfg, 3, st);
  pserver_table_config_set(cfg, "lr", 1.0, st);
  EXPECT_OK(st);
  EXPECT(pserver_client_create_table(client, "", 0, cfg, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "table name is empty");
  EXPECT(pserver_client_create_table(NULL, "emb", 3, cfg, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "client is NULL");
  pserver_table_t* emb = pserver_client_create_table(client, "emb", 3, cfg, st);
  EXPECT_OK(st);
  EXPECT(emb != NULL);
  EXPECT(strcmp(pserver_table_name(emb, NULL), "emb") == 0);
  EXPECT(pserver_table_dim(emb) == 3);
  EXPECT(pserver_table_dtype(emb) == PSERVER_FLOAT32);
  EXPECT(pserver_table_row_bytes(emb) == 12);
  EXPECT(pserver_table_chunk_size(emb) == 1);
  char text[256];
  pserver_table_config_text_of(emb, text, sizeof text);
  EXPECT(strstr(text, "dim: 3") != NULL);
  int32_t server = pserver_table_server_of(emb, 12345, st);
  EXPECT_OK(st);
  EXPECT(server >= 0 && server < pserver_client_num_servers(client));

  /* The same config opens it; another one is refused. */
  pserver_table_t* again = pserver_client_create_table(client, "emb", 3, cfg, st);
  EXPECT_OK(st);
  pserver_table_delete(again);
  pserver_table_config_set_dim(cfg, 4, st);
  EXPECT(pserver_client_create_table(client, "emb", 3, cfg, st) == NULL);
  EXPECT_STATUS(st, PSERVER_ALREADY_EXISTS, "another config");
  pserver_table_config_set_dim(cfg, 3, st);

  /* Pull: rows in key order, created on first touch from the zeros. */
  uint64_t keys[3] = {7, 100, 7};
  float rows[9];
  memset(rows, 0xff, sizeof rows);
  pserver_table_pull(emb, keys, 3, rows, sizeof rows, st);
  EXPECT_OK(st);
  for (int i = 0; i < 9; ++i) EXPECT(rows[i] == 0.0f);

  /* Push: duplicate keys summed, SGD lr 1. */
  float grads[9] = {1, 2, 3, 0.5f, 0.5f, 0.5f, 1, 1, 1};
  pserver_table_push(emb, keys, 3, grads, sizeof grads, st);
  EXPECT_OK(st);
  pserver_table_pull(emb, keys, 3, rows, sizeof rows, st);
  EXPECT_OK(st);
  EXPECT(rows[0] == -2.0f && rows[1] == -3.0f && rows[2] == -4.0f);
  EXPECT(rows[3] == -0.5f && rows[5] == -0.5f);
  EXPECT(rows[6] == -2.0f && rows[8] == -4.0f);

  /* Wrong buffer sizes and NULLs: INVALID_ARGUMENT, nothing written. */
  float small[8];
  memset(small, 0, sizeof small);
  pserver_table_pull(emb, keys, 3, small, sizeof small, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "need 36 bytes, the buffer has 32");
  EXPECT(small[0] == 0.0f);
  pserver_table_push(emb, keys, 3, grads, 8, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "need 36 bytes");
  pserver_table_pull(emb, NULL, 3, rows, sizeof rows, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "keys is NULL");
  pserver_table_pull(NULL, keys, 3, rows, sizeof rows, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "table is NULL");
  pserver_table_pull(emb, NULL, 0, NULL, 0, st); /* no keys: nothing to do */
  EXPECT_OK(st);
  float nan_grad[3] = {0, NAN, 0};
  pserver_table_push(emb, keys, 1, nan_grad, sizeof nan_grad, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "key 7");

  /* Stats per server. */
  pserver_table_stats_t stats[8];
  size_t n = pserver_table_stats(emb, stats, 8, sizeof(pserver_table_stats_t), st);
  EXPECT_OK(st);
  EXPECT(n == (size_t)pserver_client_num_servers(client));
  uint64_t rows_held = 0, pushed = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT(stats[i].server == i);
    EXPECT(stats[i].min_clock == -1 && stats[i].workers == 0);
    rows_held += stats[i].rows;
    pushed += stats[i].keys_pushed;
  }
  EXPECT(rows_held == 2);
  EXPECT(pushed >= 3);
  EXPECT(pserver_table_stats(emb, NULL, 0, sizeof(pserver_table_stats_t), st) == n);
  EXPECT_OK(st);

  /* A NULL config is the defaults (dim 1); float64 tables. */
  pserver_table_t* d1 = pserver_client_create_table(client, "d1", 2, NULL, st);
  EXPECT_OK(st);
  EXPECT(pserver_table_dim(d1) == 1);
  pserver_table_config_set_dtype(cfg, PSERVER_FLOAT64, st);
  pserver_table_config_set_initializer(cfg, "uniform", st);
  pserver_table_config_set(cfg, "low", 1, st);
  pserver_table_config_set(cfg, "high", 2, st);
  EXPECT_OK(st);
  pserver_table_t* f64 = pserver_client_create_table(client, "f64", 3, cfg, st);
  EXPECT_OK(st);
  double drows[6];
  pserver_table_pull(f64, keys, 2, drows, sizeof drows, st);
  EXPECT_OK(st);
  for (int i = 0; i < 6; ++i) EXPECT(drows[i] >= 1.0 && drows[i] < 2.0);
  pserver_table_pull(f64, keys, 2, rows, 24, st); /* 6 floats are 3 doubles */
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "float64 need 48 bytes");

  pserver_table_delete(f64);
  pserver_table_delete(d1);
  pserver_table_delete(emb);
  pserver_table_delete(NULL);
  pserver_table_config_delete(cfg);
  pserver_status_delete(st);
}

static void test_kv_workers(pserver_client_t* client) {
  pserver_status_t* st = pserver_status_new();
  pserver_table_config_t* cfg = pserver_table_config_new();
  pserver_table_config_parse_text(
      cfg, "dim: 1 element_type: FLOAT64 optimizer { add {} } chunk_size: 2", st);
  EXPECT_OK(st);
  pserver_table_config_set_consistency(cfg, PSERVER_SSP, 1, st);
  EXPECT_OK(st);
  pserver_table_t* kv = pserver_client_create_table(client, "kv", 2, cfg, st);
  EXPECT_OK(st);

  EXPECT(pserver_kv_worker_join(kv, "", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "non-empty id");
  EXPECT(pserver_kv_worker_join(NULL, "w0", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "table is NULL");
  pserver_kv_worker_t* w0 = pserver_kv_worker_join(kv, "w0", st);
  EXPECT_OK(st);
  pserver_kv_worker_t* w1 = pserver_kv_worker_join(kv, "w1", st);
  EXPECT_OK(st);
  EXPECT(strcmp(pserver_kv_worker_id(w1), "w1") == 0);
  EXPECT(pserver_kv_worker_current_clock(w1) == 0);
  EXPECT(pserver_kv_worker_current_clock(NULL) == 0);

  uint64_t keys[2] = {0, 1};
  double vals[2];
  double one[2] = {1, 1};
  /* w1 runs ahead: within the staleness of 1 its reads do not wait. */
  for (int c = 0; c < 2; ++c) {
    pserver_kv_worker_get(w1, keys, 2, vals, sizeof vals, st);
    EXPECT_OK(st);
    pserver_kv_worker_add(w1, keys, 2, one, sizeof one, st);
    EXPECT_OK(st);
    pserver_kv_worker_clock(w1, st);
    EXPECT_OK(st);
  }
  EXPECT(pserver_kv_worker_current_clock(w1) == 2);
  /* At clock 2 a read needs w0 at clock 1: the status timeout ends it,
   * naming the straggler. */
  pserver_status_set_timeout_ms(st, 300);
  double start = now_seconds();
  pserver_kv_worker_get(w1, keys, 2, vals, sizeof vals, st);
  EXPECT_STATUS(st, PSERVER_DEADLINE_EXCEEDED, "w0 at clock 0");
  EXPECT(now_seconds() - start < 5.0);
  pserver_status_set_timeout_ms(st, 10000);

  pserver_table_stats_t stats[8];
  size_t n = pserver_table_stats(kv, stats, 8, sizeof(pserver_table_stats_t), st);
  EXPECT_OK(st);
  for (size_t i = 0; i < n; ++i) EXPECT(stats[i].workers == 2 && stats[i].min_clock == 0);

  /* Wrong sizes. */
  pserver_kv_worker_get(w0, keys, 2, vals, 8, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "need 16 bytes");
  pserver_kv_worker_add(w0, keys, 2, one, 8, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "need 16 bytes");

  /* Chunks of 2 keys: chunk 0 is keys 0 and 1. */
  double chunk[4];
  pserver_kv_worker_get_chunk(w0, keys, 2, chunk, sizeof chunk, st);
  EXPECT_OK(st);
  EXPECT(chunk[0] == 2.0 && chunk[1] == 2.0 && chunk[2] == 0.0 && chunk[3] == 0.0);
  pserver_kv_worker_get_chunk(w0, keys, 2, chunk, 16, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "4 rows");
  double deltas[4] = {10, 10, 10, 10};
  pserver_kv_worker_add_chunk(w0, keys + 1, 1, deltas, 16, st);
  EXPECT_OK(st);
  pserver_kv_worker_add_chunk(w0, keys + 1, 1, deltas, 32, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "2 rows");
  pserver_kv_worker_get_chunk(w0, keys + 1, 1, chunk, 16, st);
  EXPECT_OK(st);
  EXPECT(chunk[0] == 10.0 && chunk[1] == 10.0);

  /* Once w0 leaves, w1 no longer waits for it. */
  pserver_kv_worker_leave(w0, st);
  EXPECT_OK(st);
  pserver_kv_worker_get(w1, keys, 2, vals, sizeof vals, st);
  EXPECT_OK(st);
  EXPECT(vals[0] == 2.0 && vals[1] == 2.0);
  pserver_kv_worker_get(w0, keys, 2, vals, sizeof vals, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "has left");
  pserver_kv_worker_leave(w0, st);
  EXPECT_STATUS(st, PSERVER_FAILED_PRECONDITION, "has left");
  pserver_kv_worker_clock(NULL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "worker is NULL");
  pserver_kv_worker_delete(w0);
  pserver_kv_worker_delete(w1); /* leaves */
  pserver_kv_worker_delete(NULL);
  n = pserver_table_stats(kv, stats, 8, sizeof(pserver_table_stats_t), st);
  EXPECT_OK(st);
  for (size_t i = 0; i < n; ++i) EXPECT(stats[i].workers == 0);

  pserver_table_delete(kv);
  pserver_table_config_delete(cfg);
  pserver_status_delete(st);
}

struct member {
  pserver_client_t* client;
  int rank;
  int failures;
  float sum[5];
  int64_t mean[2];
  double bcast[3];
};

static void* group_member(void* arg) {
  struct member* m = (struct member*)arg;
  pserver_status_t* st = pserver_status_new();
  pserver_status_set_timeout_ms(st, 20000);
  char id[16];
  snprintf(id, sizeof id, "w%d", m->rank);
  pserver_group_t* g = pserver_group_new(m->client, "g", 2, id, st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  pserver_group_barrier(g, PSERVER_BARRIER_ALL, st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  int64_t shape5[1] = {5};
  for (int i = 0; i < 5; ++i) m->sum[i] = (float)(i * (m->rank + 1));
  pserver_group_all_reduce(g, PSERVER_FLOAT32, shape5, 1, m->sum, sizeof m->sum,
                           PSERVER_REDUCE_SUM, st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  int64_t shape2[2] = {1, 2};
  m->mean[0] = 10 * (m->rank + 1);
  m->mean[1] = -m->rank;
  pserver_group_all_reduce(g, PSERVER_INT64, shape2, 2, m->mean, sizeof m->mean,
                           PSERVER_REDUCE_MEAN, st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  int64_t shape3[1] = {3};
  for (int i = 0; i < 3; ++i) m->bcast[i] = m->rank == 1 ? 1.5 * (i + 1) : 0.0;
  pserver_group_broadcast(g, PSERVER_FLOAT64, shape3, 1, m->bcast, sizeof m->bcast,
                          (uint8_t)(m->rank == 1), st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  pserver_group_barrier(g, PSERVER_BARRIER_WORKERS, st);
  if (pserver_status_code(st) != PSERVER_OK) ++m->failures;
  pserver_group_delete(g);
  pserver_status_delete(st);
  return NULL;
}

static void test_groups(pserver_client_t* client) {
  pserver_status_t* st = pserver_status_new();
  EXPECT(pserver_group_new(client, "g", 0, "w0", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "at least 1 member");
  EXPECT(pserver_group_new(client, "g", 2, "", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "participant");
  EXPECT(pserver_group_new(NULL, "g", 2, "w0", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "client is NULL");

  struct member members[2];
  pthread_t threads[2];
  for (int r = 0; r < 2; ++r) {
    memset(&members[r], 0, sizeof members[r]);
    members[r].client = client;
    members[r].rank = r;
    EXPECT(pthread_create(&threads[r], NULL, group_member, &members[r]) == 0);
  }
  for (int r = 0; r < 2; ++r) pthread_join(threads[r], NULL);
  for (int r = 0; r < 2; ++r) {
    EXPECT(members[r].failures == 0);
    for (int i = 0; i < 5; ++i) EXPECT(members[r].sum[i] == (float)(3 * i));
    EXPECT(members[r].mean[0] == 15 && members[r].mean[1] == 0);
    for (int i = 0; i < 3; ++i) EXPECT(members[r].bcast[i] == 1.5 * (i + 1));
  }

  /* Errors: a lonely member times out naming who arrived; bad arguments. */
  pserver_group_t* lonely = pserver_group_new(client, "lonely", 2, "w0", st);
  EXPECT_OK(st);
  pserver_status_set_timeout_ms(st, 300);
  pserver_group_barrier(lonely, PSERVER_BARRIER_WORKERS, st);
  EXPECT_STATUS(st, PSERVER_DEADLINE_EXCEEDED, "1 of 2 arrived (w0)");
  pserver_group_barrier(lonely, 5, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown barrier scope");
  float data[4] = {1, 2, 3, 4};
  int64_t shape[1] = {4};
  pserver_group_all_reduce(lonely, PSERVER_FLOAT32, shape, 1, data, 12, PSERVER_REDUCE_SUM, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 16 bytes, the buffer has 12");
  pserver_group_all_reduce(lonely, PSERVER_FLOAT32, shape, 1, data, sizeof data, 4, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown reduce op");
  pserver_group_all_reduce(lonely, 42, shape, 1, data, sizeof data, PSERVER_REDUCE_SUM, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown element type");
  pserver_group_broadcast(lonely, PSERVER_FLOAT32, shape, 1, data, 8, 1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 16 bytes");
  EXPECT(data[0] == 1.0f && data[3] == 4.0f);
  pserver_group_barrier(NULL, PSERVER_BARRIER_ALL, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "group is NULL");
  pserver_group_delete(lonely);
  pserver_group_delete(NULL);
  pserver_status_delete(st);
}

static void test_tables(void) {
  test_table_config();
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  EXPECT_OK(st);
  pserver_client_t* client = pserver_local_cluster_client(cluster, NULL, st);
  EXPECT_OK(st);
  test_sparse_table(client);
  test_kv_workers(client);
  test_groups(client);

  /* Over gRPC too. */
  pserver_client_options_t* opts = pserver_client_options_new();
  for (int i = 0; i < 2; ++i) {
    pserver_client_options_add_server(opts, pserver_local_cluster_address(cluster, i));
  }
  pserver_client_t* remote = pserver_client_new(opts, st);
  EXPECT_OK(st);
  pserver_table_t* emb = pserver_client_create_table(remote, "emb2", 4, NULL, st);
  EXPECT_OK(st);
  uint64_t key = 3;
  float row = -1.0f, grad = 0.5f;
  pserver_table_push(emb, &key, 1, &grad, sizeof grad, st);
  EXPECT_OK(st);
  /* A table outlives its client's handle (convention 9). */
  pserver_client_delete(remote);
  pserver_table_pull(emb, &key, 1, &row, sizeof row, st);
  EXPECT_OK(st);
  EXPECT(fabsf(row + 0.005f) < 1e-6f); /* SGD, learning rate 0.01 */
  pserver_table_delete(emb);

  /* The in-process client's tables fail cleanly once the cluster stopped. */
  pserver_table_t* local = pserver_client_create_table(client, "emb2", 4, NULL, st);
  EXPECT_OK(st);
  pserver_local_cluster_stop(cluster);
  pserver_table_pull(local, &key, 1, &row, sizeof row, st);
  EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "stopped");
  pserver_table_delete(local);
  pserver_client_delete(client);
  pserver_local_cluster_delete(cluster);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
}

/* A server restarted without checkpoints has lost the table: NOT_FOUND. */
static void test_unknown_table(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_status_set_timeout_ms(st, 15000);
  pserver_server_t* server = pserver_server_new(NULL, st);
  EXPECT_OK(st);
  int32_t port = pserver_server_port(server);
  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_add_server(opts, pserver_server_address(server));
  pserver_client_t* client = pserver_client_new(opts, st);
  EXPECT_OK(st);
  pserver_table_t* t = pserver_client_create_table(client, "gone", 4, NULL, st);
  EXPECT_OK(st);
  uint64_t key = 1;
  float row;
  pserver_table_pull(t, &key, 1, &row, sizeof row, st);
  EXPECT_OK(st);
  pserver_server_delete(server);
  pserver_server_options_t* sopts = pserver_server_options_new();
  pserver_server_options_set_port(sopts, port);
  server = pserver_server_new(sopts, st);
  if (pserver_status_code(st) == PSERVER_OK) { /* the port may have been taken meanwhile */
    pserver_table_pull(t, &key, 1, &row, sizeof row, st);
    EXPECT_STATUS(st, PSERVER_NOT_FOUND, "no table 'gone'");
  } else {
    fprintf(stderr, "note: port %d was taken: unknown-table check skipped\n", (int)port);
  }
  pserver_table_delete(t);
  pserver_client_delete(client);
  pserver_server_delete(server);
  pserver_server_options_delete(sopts);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
}

/* Tables saved with the servers' checkpoints read back through the reader. */
static void test_checkpoint_tables(void) {
  pserver_status_t* st = pserver_status_new();
  char dir[1024];
  const char* tmp = getenv("TEST_TMPDIR");
  snprintf(dir, sizeof dir, "%s/capi_table_ckpt", tmp != NULL ? tmp : "/tmp");
  pserver_server_options_t* base = pserver_server_options_new();
  pserver_server_options_set_checkpoint_dir(base, dir);
  pserver_local_cluster_t* cluster = pserver_local_cluster_new_with_options(2, base, st);
  EXPECT_OK(st);
  pserver_client_t* client = pserver_local_cluster_client(cluster, NULL, st);
  EXPECT_OK(st);
  pserver_table_config_t* cfg = pserver_table_config_new();
  pserver_table_config_parse_text(cfg, "dim: 2 element_type: FLOAT64 optimizer { add {} }", st);
  EXPECT_OK(st);
  pserver_table_t* t = pserver_client_create_table(client, "saved", 5, cfg, st);
  EXPECT_OK(st);
  uint64_t keys[5] = {40, 3, 17, 1000, 8};
  double vals[10];
  for (int i = 0; i < 10; ++i) vals[i] = (double)i;
  pserver_table_push(t, keys, 5, vals, sizeof vals, st);
  EXPECT_OK(st);
  pserver_local_cluster_save_checkpoint(cluster, st);
  EXPECT_OK(st);

  pserver_checkpoint_reader_t* r = pserver_checkpoint_reader_new(dir, st);
  EXPECT_OK(st);
  EXPECT(pserver_checkpoint_reader_num_tables(r) == 1);
  EXPECT(strcmp(pserver_checkpoint_reader_table_name(r, 0, NULL), "saved") == 0);
  EXPECT(pserver_checkpoint_reader_table_name(r, 1, NULL) == NULL);
  uint32_t dim = 0;
  int32_t dtype = 0;
  uint64_t rows = 0;
  pserver_checkpoint_reader_table_info(r, "saved", 5, &dim, &dtype, &rows, st);
  EXPECT_OK(st);
  EXPECT(dim == 2 && dtype == PSERVER_FLOAT64 && rows == 5);
  uint64_t got_keys[5];
  double got[10];
  pserver_checkpoint_reader_read_table(r, "saved", 5, got_keys, sizeof got_keys, got, 72, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "5 rows need 40 bytes of keys and 80");
  pserver_checkpoint_reader_read_table(r, "saved", 5, got_keys, sizeof got_keys, got, sizeof got,
                                       st);
  EXPECT_OK(st);
  const uint64_t sorted[5] = {3, 8, 17, 40, 1000};
  const int from[5] = {1, 4, 2, 0, 3}; /* where each sorted key was pushed */
  for (int i = 0; i < 5; ++i) {
    EXPECT(got_keys[i] == sorted[i]);
    EXPECT(got[2 * i] == vals[2 * from[i]] && got[2 * i + 1] == vals[2 * from[i] + 1]);
  }
  pserver_checkpoint_reader_table_info(r, "nope", 4, NULL, NULL, NULL, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "table 'nope' is not in the checkpoint");
  pserver_checkpoint_reader_delete(r);

  pserver_table_delete(t);
  pserver_table_config_delete(cfg);
  pserver_client_delete(client);
  pserver_local_cluster_delete(cluster);
  pserver_server_options_delete(base);
  pserver_status_delete(st);
}

/* ------------------------------------------------------------------ etcd */

/* A free 127.0.0.1 port (bound to port 0, then released). */
static int free_port(void) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  struct sockaddr_in addr;
  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, (struct sockaddr*)&addr, sizeof addr) == 0 &&
      getsockname(fd, (struct sockaddr*)&addr, &len) == 0) {
    port = ntohs(addr.sin_port);
  }
  close(fd);
  return port;
}

/* Starts /usr/bin/etcd on free 127.0.0.1 ports with its data under `tmp`;
 * writes "127.0.0.1:<port>" to `endpoint`. Returns its pid, or -1. */
static pid_t start_etcd(const char* tmp, char* endpoint, size_t endpoint_size) {
  int client = free_port(), peer = free_port();
  if (client < 0 || peer < 0 || client == peer) return -1;
  char dir[1024], log[1100], curl[64], purl[64], a[8][1200];
  snprintf(dir, sizeof dir, "%s/capi-etcd-XXXXXX", tmp);
  if (mkdtemp(dir) == NULL) return -1;
  snprintf(log, sizeof log, "%s/etcd.log", dir);
  snprintf(curl, sizeof curl, "http://127.0.0.1:%d", client);
  snprintf(purl, sizeof purl, "http://127.0.0.1:%d", peer);
  snprintf(endpoint, endpoint_size, "127.0.0.1:%d", client);
  snprintf(a[0], sizeof a[0], "--data-dir=%s/data", dir);
  snprintf(a[1], sizeof a[1], "--listen-client-urls=%s", curl);
  snprintf(a[2], sizeof a[2], "--advertise-client-urls=%s", curl);
  snprintf(a[3], sizeof a[3], "--listen-peer-urls=%s", purl);
  snprintf(a[4], sizeof a[4], "--initial-advertise-peer-urls=%s", purl);
  snprintf(a[5], sizeof a[5], "--initial-cluster=capi=%s", purl);
  /* Only async-signal-safe calls after fork. */
  int log_fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL); /* no etcd left behind by a crash */
    dup2(log_fd, 1);
    dup2(log_fd, 2);
    execl("/usr/bin/etcd", "etcd", "--name=capi", a[0], a[1], a[2], a[3], a[4], a[5],
          "--log-level=error", (char*)NULL);
    _exit(127);
  }
  close(log_fd);
  return pid;
}

static void stop_etcd(pid_t pid) {
  if (pid <= 0) return;
  kill(pid, SIGTERM);
  /* Up to 10 s for a clean exit, then SIGKILL. */
  for (int i = 0; i < 200; ++i) {
    if (waitpid(pid, NULL, WNOHANG) == pid) return;
    struct timespec ts = {0, 50 * 1000 * 1000};
    nanosleep(&ts, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
}

/* NULL-safe strcmp(a, b) == 0. */
static int streq(const char* a, const char* b) {
  return a != NULL && b != NULL && strcmp(a, b) == 0;
}

/* etcd started first thing (before any gRPC threads exist), so that it
 * boots while the other tests run. */
static pid_t etcd_pid = -1;
static char etcd_endpoint[64];

static void test_etcd(void) {
  pserver_status_t* st = pserver_status_new();
  /* Argument errors need no etcd. */
  EXPECT(pserver_etcd_new("", 1000, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "endpoints");
  EXPECT(pserver_etcd_new("127.0.0.1:1", 0, st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "timeout");
  pserver_etcd_delete(NULL);
  pserver_etcd_kvs_delete(NULL);
  pserver_buffer_delete(NULL);
  EXPECT(pserver_etcd_kvs_size(NULL) == 0 && pserver_etcd_kvs_key(NULL, 0) == NULL);
  pserver_client_options_t* bad = pserver_client_options_new();
  pserver_client_options_set_etcd(bad, " , ", "x", st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "endpoints");
  pserver_client_options_delete(bad);

  const char* endpoint = etcd_endpoint;
  pid_t pid = etcd_pid;
  EXPECT(pid > 0);
  if (pid <= 0) {
    pserver_status_delete(st);
    return;
  }
  /* Wait (at most 30 s) until etcd serves: a read of a missing key then
   * says NOT_FOUND rather than UNAVAILABLE or DEADLINE_EXCEEDED. A fresh
   * handle per try: one whose first connection met etcd still starting up
   * may stay stuck. */
  char* value = NULL;
  size_t size = 0;
  for (int i = 0; i < 60; ++i) {
    pserver_etcd_t* probe = pserver_etcd_new(endpoint, 500, st);
    pserver_etcd_get(probe, "/pserver/capi/ps_desired", &value, &size, st);
    pserver_etcd_delete(probe);
    int code = pserver_status_code(st);
    if (code != PSERVER_UNAVAILABLE && code != PSERVER_DEADLINE_EXCEEDED) break;
  }
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "");
  EXPECT(value == NULL && size == 0);
  pserver_etcd_t* etcd = pserver_etcd_new(endpoint, 5000, st);
  EXPECT_OK(st);

  /* put, get, get_prefix, delete_key. */
  pserver_etcd_put(etcd, "/capi/b", "two", 3, st);
  EXPECT_OK(st);
  pserver_etcd_put(etcd, "/capi/a", "o\0e", 3, st); /* bytes, NUL included */
  EXPECT_OK(st);
  pserver_etcd_put(etcd, "/capix", "", 0, st);
  EXPECT_OK(st);
  pserver_etcd_get(etcd, "/capi/b", &value, &size, st);
  EXPECT_OK(st);
  EXPECT(size == 3 && streq(value, "two"));
  pserver_buffer_delete(value);
  pserver_etcd_kvs_t* kvs = pserver_etcd_get_prefix(etcd, "/capi/", st);
  EXPECT_OK(st);
  EXPECT(pserver_etcd_kvs_size(kvs) == 2);
  EXPECT(streq(pserver_etcd_kvs_key(kvs, 0), "/capi/a"));
  EXPECT(pserver_etcd_kvs_value_size(kvs, 0) == 3 && pserver_etcd_kvs_value(kvs, 0) != NULL &&
         memcmp(pserver_etcd_kvs_value(kvs, 0), "o\0e", 3) == 0);
  EXPECT(streq(pserver_etcd_kvs_key(kvs, 1), "/capi/b"));
  EXPECT(streq(pserver_etcd_kvs_value(kvs, 1), "two"));
  EXPECT(pserver_etcd_kvs_key(kvs, 2) == NULL && pserver_etcd_kvs_value_size(kvs, 2) == 0);
  pserver_etcd_kvs_delete(kvs);
  pserver_etcd_delete_key(etcd, "/capi/b", st);
  EXPECT_OK(st);
  pserver_etcd_delete_key(etcd, "/capi/b", st); /* missing: not an error */
  EXPECT_OK(st);
  pserver_etcd_get(etcd, "/capi/b", &value, &size, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "/capi/b");
  pserver_etcd_get(etcd, NULL, &value, &size, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "key is NULL");
  EXPECT(pserver_etcd_get_prefix(etcd, "", st) == NULL);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "prefix is empty");

  /* A client that finds its server in etcd: the server is registered by
   * hand here, as a pserver process started with --etcd would be. */
  pserver_server_t* server = pserver_server_new(NULL, st);
  EXPECT_OK(st);
  const char* addr = pserver_server_address(server);
  pserver_etcd_put(etcd, "/pserver/capi/ps_desired", "1", 1, st);
  EXPECT_OK(st);
  pserver_etcd_put(etcd, "/pserver/capi/ps/0", addr, strlen(addr), st);
  EXPECT_OK(st);
  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_set_etcd(opts, endpoint, "capi", st);
  EXPECT_OK(st);
  pserver_client_options_set_timeout_ms(opts, 5000);
  pserver_client_options_set_discovery_timeout_ms(opts, 10000);
  pserver_client_t* client = pserver_client_new(opts, st);
  EXPECT_OK(st);
  EXPECT(pserver_client_num_servers(client) == 1);
  char got[64] = "";
  EXPECT(pserver_client_server_address(client, 0, got, sizeof got) == strlen(addr));
  EXPECT(streq(got, addr));
  EXPECT(pserver_client_server_address(client, 1, got, sizeof got) == 0);
  float w[2] = {1, 2}, g[2] = {1, 1}, back[2] = {0, 0};
  int64_t shape[1] = {2};
  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st);
  EXPECT_OK(st);
  pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_OK(st);
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, back, sizeof back, st);
  EXPECT_OK(st);
  EXPECT(fabsf(back[0] - 0.99f) < 1e-6f && fabsf(back[1] - 1.99f) < 1e-6f);
  /* The trainer registered itself under /workers/. */
  kvs = pserver_etcd_get_prefix(etcd, "/pserver/capi/workers/", st);
  EXPECT_OK(st);
  EXPECT(pserver_etcd_kvs_size(kvs) == 1);
  pserver_etcd_kvs_delete(kvs);
  pserver_client_delete(client);

  /* Too few servers registered: pserver_client_new gives up in time. */
  pserver_etcd_put(etcd, "/pserver/capi/ps_desired", "2", 1, st);
  EXPECT_OK(st);
  pserver_client_options_set_discovery_timeout_ms(opts, 300);
  EXPECT(pserver_client_new(opts, st) == NULL);
  EXPECT_STATUS(st, PSERVER_DEADLINE_EXCEEDED, "missing");
  pserver_client_options_delete(opts);
  pserver_server_delete(server);
  pserver_etcd_delete(etcd);
  stop_etcd(pid);

  /* etcd gone: calls fail with a status, nothing aborts. */
  etcd = pserver_etcd_new(endpoint, 200, st);
  EXPECT_OK(st);
  pserver_etcd_put(etcd, "/k", "v", 1, st);
  EXPECT(pserver_status_code(st) == PSERVER_UNAVAILABLE ||
         pserver_status_code(st) == PSERVER_DEADLINE_EXCEEDED);
  pserver_etcd_delete(etcd);
  pserver_status_delete(st);
}

/* The etcd key layout: built and parsed by the library, needing no etcd. */
static void test_etcd_keys(void) {
  pserver_status_t* st = pserver_status_new();
  char key[128] = "";
  static const struct {
    int32_t kind;
    const char* arg;
    const char* want;
  } cases[] = {
      {PSERVER_ETCD_KEY_CLUSTER, NULL, "/pserver/job/"},
      {PSERVER_ETCD_KEY_DESIRED, "", "/pserver/job/ps_desired"},
      {PSERVER_ETCD_KEY_SERVERS, NULL, "/pserver/job/ps/"},
      {PSERVER_ETCD_KEY_SERVER, "3", "/pserver/job/ps/3"},
      {PSERVER_ETCD_KEY_CHECKPOINTS, NULL, "/pserver/job/checkpoints/"},
      {PSERVER_ETCD_KEY_CHECKPOINT, "0", "/pserver/job/checkpoints/0"},
      {PSERVER_ETCD_KEY_WORKERS, NULL, "/pserver/job/workers/"},
      {PSERVER_ETCD_KEY_WORKER, "trainer-7", "/pserver/job/workers/trainer-7"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; ++i) {
    EXPECT(pserver_etcd_key(cases[i].kind, "job", cases[i].arg, key, sizeof key, st) ==
           strlen(cases[i].want));
    EXPECT_OK(st);
    EXPECT(streq(key, cases[i].want));
  }
  /* Sized as snprintf: the full length, the text truncated to fit. */
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_DESIRED, "job", NULL, NULL, 0, st) == 23);
  EXPECT_OK(st);
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_DESIRED, "job", NULL, key, 5, st) == 23);
  EXPECT(streq(key, "/pse"));

  /* Bad arguments: a status naming what is wrong, nothing written. */
  strcpy(key, "unchanged");
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_SERVER, "job", "03", key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "'03'");
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_SERVER, "job", NULL, key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "index");
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_WORKER, "job", "", key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "worker id");
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_DESIRED, "job", "x", key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "takes no argument");
  EXPECT(pserver_etcd_key(42, "job", NULL, key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "kind 42");
  EXPECT(pserver_etcd_key(PSERVER_ETCD_KEY_DESIRED, NULL, NULL, key, sizeof key, st) == 0);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "cluster is NULL");
  EXPECT(streq(key, "unchanged"));

  /* Parsing gives back the kind and argument. */
  char arg[64] = "";
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/ps/12", arg, sizeof arg, st) ==
         PSERVER_ETCD_KEY_SERVER);
  EXPECT_OK(st);
  EXPECT(streq(arg, "12"));
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/checkpoints/1", arg, sizeof arg, st) ==
         PSERVER_ETCD_KEY_CHECKPOINT);
  EXPECT(streq(arg, "1"));
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/workers/w/1", arg, sizeof arg, st) ==
         PSERVER_ETCD_KEY_WORKER);
  EXPECT(streq(arg, "w/1"));
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/ps_desired", arg, sizeof arg, st) ==
         PSERVER_ETCD_KEY_DESIRED);
  EXPECT_OK(st);
  EXPECT(streq(arg, ""));
  strcpy(arg, "unchanged");
  EXPECT(pserver_etcd_key_parse("job", "/pserver/other/ps/1", arg, sizeof arg, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "not under cluster prefix /pserver/job/");
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/ps/x", arg, sizeof arg, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "'/ps/x'");
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/workers/long-id", arg, 4, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 8");
  EXPECT(pserver_etcd_key_parse("job", NULL, arg, sizeof arg, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "key is NULL");
  EXPECT(streq(arg, "unchanged"));
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

int main(void) {
  const char* tmp = getenv("TEST_TMPDIR");
  etcd_pid = start_etcd(tmp != NULL ? tmp : "/tmp", etcd_endpoint, sizeof etcd_endpoint);
  test_version_and_codes();
  test_config();
  test_local_cluster();
  test_server();
  test_checkpoint_reader_errors();
  test_checkpoints();
  test_status_timeout();
  test_tables();
  test_unknown_table();
  test_checkpoint_tables();
  test_etcd();
  test_etcd_keys();
  test_names_with_length();
  test_cancel();
  if (failures > 0) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("capi_test: all passed\n");
  return 0;
}
