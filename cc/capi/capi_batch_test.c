/* The C ABI's one-call batches (pserver_client_send_grads_n, _get_params_n,
 * _push_pull_n, _push_pull_one), as Python and Go use them: each answers as
 * the batched call it forwards to, and bad input is refused with an error
 * naming what is wrong and changes nothing, on the servers or in the
 * caller's outputs. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cc/capi/capi_test_util.h"
#include "cc/capi/pserver.h"

static const float kW[4] = {1, 2, 3, 4};

/* The server's value of "w" equals `want`. */
static void expect_w(pserver_client_t* client, const float want[4]) {
  pserver_status_t* st = pserver_status_new();
  float now[4] = {0};
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, now, sizeof now, st);
  EXPECT_OK(st);
  EXPECT(memcmp(now, want, sizeof now) == 0);
  pserver_status_delete(st);
}

static void test_batches(pserver_client_t* client) {
  pserver_status_t* st = pserver_status_new();
  const char* names[2] = {"w", "v"};
  const size_t lens[2] = {1, 1};
  const int32_t dtypes[2] = {PSERVER_FLOAT32, PSERVER_FLOAT32};
  float g[4] = {1, 1, 1, 1}, gv[2] = {1, 1};
  const void* data[2] = {g, gv};
  float out[4], outv[2];
  void* outs[2] = {out, outv};
  const size_t sizes[2] = {sizeof g, sizeof gv};

  /* n = 0: nothing to do, and NULL arrays are fine then. */
  pserver_client_send_grads_n(client, 0, NULL, NULL, NULL, NULL, NULL, st);
  EXPECT_OK(st);
  pserver_client_get_params_n(client, 0, NULL, NULL, NULL, NULL, NULL, st);
  EXPECT_OK(st);
  pserver_client_push_pull_n(client, 0, NULL, NULL, NULL, NULL, NULL, NULL, st);
  EXPECT_OK(st);

  /* A NULL array for n > 0. */
  pserver_client_send_grads_n(client, 1, names, lens, dtypes, NULL, sizes, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "NULL array");
  pserver_client_get_params_n(client, 1, names, NULL, dtypes, outs, sizes, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "NULL array");
  pserver_client_push_pull_n(client, 1, names, lens, dtypes, data, NULL, sizes, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "NULL array");
  expect_w(client, kW);

  /* An unknown element type; a size that does not fit the parameter. */
  const int32_t bad_dtype[2] = {77, PSERVER_FLOAT32};
  pserver_client_send_grads_n(client, 2, names, lens, bad_dtype, data, sizes, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown element type 77");
  const size_t short_size[2] = {sizeof g - 4, sizeof gv};
  pserver_client_send_grads_n(client, 2, names, lens, dtypes, data, short_size, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "w");
  expect_w(client, kW);

  /* A batch with one bad part is applied not at all: "v" is fine, "nope"
   * does not exist, and "v" is unchanged afterwards. */
  const char* with_unknown[2] = {"v", "nope"};
  const size_t unknown_lens[2] = {1, 4};
  const void* v_twice[2] = {gv, gv};
  const size_t v_sizes[2] = {sizeof gv, sizeof gv};
  pserver_client_send_grads_n(client, 2, with_unknown, unknown_lens, dtypes, v_twice, v_sizes, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "nope");
  float v_now[2] = {0};
  pserver_client_get_param(client, "v", 1, PSERVER_FLOAT32, v_now, sizeof v_now, st);
  EXPECT_OK(st);
  EXPECT(v_now[0] == 5 && v_now[1] == 6);

  /* A name with a NUL byte in it arrives whole and is refused. */
  const char* nul_name[1] = {"w\0x"};
  const size_t nul_len[1] = {3};
  pserver_client_push_pull_n(client, 1, nul_name, nul_len, dtypes, data, outs, sizes, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "NUL");
  pserver_client_push_pull_one(client, "w\0x", 3, PSERVER_FLOAT32, g, sizeof g, out, sizeof out,
                               st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "NUL");
  expect_w(client, kW);

  /* An output too small is refused before anything is sent or written. */
  for (int i = 0; i < 4; ++i) out[i] = -7;
  pserver_client_push_pull_one(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, out, sizeof out - 4,
                               st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "w");
  EXPECT(out[0] == -7 && out[3] == -7);
  pserver_client_get_params_n(client, 1, names, lens, dtypes, outs, short_size, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "w");
  EXPECT(out[0] == -7 && out[3] == -7);
  expect_w(client, kW);

  /* Good batches: applied once, read back (SGD with lr 1: w - g). */
  pserver_client_send_grads_n(client, 2, names, lens, dtypes, data, sizes, st);
  EXPECT_OK(st);
  const float once[4] = {0, 1, 2, 3};
  expect_w(client, once);
  pserver_client_push_pull_n(client, 2, names, lens, dtypes, data, outs, sizes, st);
  EXPECT_OK(st);
  EXPECT(out[0] == -1 && out[3] == 2 && outv[0] == 3 && outv[1] == 4);
  pserver_client_push_pull_one(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, out, sizeof out, st);
  EXPECT_OK(st);
  EXPECT(out[0] == -2 && out[3] == 1);
  memset(out, 0, sizeof out);
  pserver_client_get_params_n(client, 2, names, lens, dtypes, outs, sizes, st);
  EXPECT_OK(st);
  EXPECT(out[0] == -2 && out[3] == 1 && outv[0] == 3 && outv[1] == 4);
  pserver_status_delete(st);
}

int main(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  EXPECT_OK(st);
  pserver_client_options_t* opts = pserver_client_options_new();
  for (int i = 0; i < 2; ++i) {
    pserver_client_options_add_server(opts, pserver_local_cluster_address(cluster, i));
  }
  pserver_client_t* client = pserver_client_new(opts, st); /* over gRPC */
  EXPECT_OK(st);
  pserver_param_config_t* sgd = pserver_param_config_new();
  pserver_param_config_set(sgd, "lr", 1.0, st);
  EXPECT_OK(st);
  const int64_t shape[1] = {4}, vshape[1] = {2};
  const float v[2] = {5, 6};
  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, kW, sizeof kW, sgd, st);
  EXPECT_OK(st);
  pserver_client_init_param(client, "v", 1, PSERVER_FLOAT32, vshape, 1, v, sizeof v, sgd, st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st);
  EXPECT_OK(st);

  test_batches(client);

  pserver_param_config_delete(sgd);
  pserver_client_delete(client);
  pserver_client_options_delete(opts);
  pserver_local_cluster_delete(cluster);
  pserver_status_delete(st);
  return capi_test_report("capi_batch_test");
}
