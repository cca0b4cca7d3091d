/* Roles from C (docs/security.md): a server with a bearer tokens file, a
 * reader and a trainer client, and a client without a token. */
#include <stdio.h>
#include <stdlib.h>

#include "cc/capi/capi_test_util.h"
#include "cc/capi/pserver.h"
#include "cc/capi/pserver_cluster.h"

static pserver_client_t* connect_with(const char* address, const char* token) {
  pserver_status_t* st = pserver_status_new();
  pserver_client_options_t* opts = pserver_client_options_new();
  pserver_client_options_add_server(opts, address);
  pserver_client_options_set_token(opts, token);
  pserver_client_t* client = pserver_client_new(opts, st);
  EXPECT_OK(st);
  pserver_client_options_delete(opts);
  pserver_status_delete(st);
  return client;
}

int main(void) {
  const char* dir = getenv("TEST_TMPDIR");
  char path[4096];
  snprintf(path, sizeof path, "%s/capi_auth_tokens", dir != NULL ? dir : "/tmp");
  FILE* f = fopen(path, "w");
  EXPECT(f != NULL);
  if (f == NULL) return capi_test_report("capi_auth_test");
  fputs("trainer job-a trainer-token-0123456789\nreader job-a reader-token-0123456789\n", f);
  fclose(f);

  pserver_status_t* st = pserver_status_new();
  pserver_server_options_t* sopts = pserver_server_options_new();
  pserver_server_options_set_auth(sopts, "job-a", path, NULL);
  pserver_server_t* server = pserver_server_new(sopts, st);
  EXPECT_OK(st);
  pserver_server_options_delete(sopts);
  if (server == NULL) return capi_test_report("capi_auth_test");

  pserver_client_t* trainer = connect_with(pserver_server_address(server), "trainer-token-0123456789");
  pserver_client_t* reader = connect_with(pserver_server_address(server), "reader-token-0123456789");
  pserver_client_t* anonymous = connect_with(pserver_server_address(server), NULL);

  int64_t shape[1] = {2};
  float w[2] = {1, 2}, g[2] = {1, 1}, out[2];
  pserver_client_init_param(trainer, "w", 1, PSERVER_FLOAT32, shape, 1, w, sizeof w, NULL, st);
  EXPECT_OK(st);
  pserver_client_finish_init(trainer, st);
  EXPECT_OK(st);
  pserver_client_send_grad(trainer, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_OK(st);
  pserver_client_get_param(reader, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_OK(st);
  pserver_client_send_grad(reader, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  EXPECT_STATUS(st, PSERVER_PERMISSION_DENIED, "role reader of job job-a may not SendGrads");
  pserver_client_get_param(anonymous, "w", 1, PSERVER_FLOAT32, out, sizeof out, st);
  EXPECT_STATUS(st, PSERVER_UNAUTHENTICATED, "bearer token");

  pserver_client_delete(trainer);
  pserver_client_delete(reader);
  pserver_client_delete(anonymous);
  pserver_server_delete(server);
  pserver_status_delete(st);
  return capi_test_report("capi_auth_test");
}
