/* consumer.c: a C program outside the repository, built against an
 * installed prefix with `cc consumer.c $(pkg-config --cflags --libs pserver)`
 * (//packaging:c_consumer_test). It trains one step on an embedded
 * 2-server cluster and prints what the servers hold, then what asking for an
 * unknown parameter says. Exit 0 only if every call did what it should. */
#include <pserver.h>
#include <stdio.h>

static int check(pserver_status_t* st, const char* what) {
  if (pserver_status_code(st) == PSERVER_OK) return 1;
  fprintf(stderr, "%s: %s\n", what, pserver_status_message(st));
  return 0;
}

int main(void) {
  int ok = 1;
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  ok = ok && check(st, "local_cluster_new");
  pserver_client_t* client = ok ? pserver_local_cluster_client(cluster, NULL, st) : NULL;
  ok = ok && check(st, "local_cluster_client");
  float w[2] = {0, 0}, g[2] = {0.5f, -0.5f};
  int64_t shape[1] = {2};
  pserver_param_config_t* cfg = pserver_param_config_new();
  if (ok) pserver_param_config_set_optimizer(cfg, "sgd", st);
  ok = ok && check(st, "set_optimizer");
  if (ok) pserver_param_config_set(cfg, "learning_rate", 0.5, st);
  ok = ok && check(st, "set learning_rate");
  if (ok) pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, w, sizeof w, cfg, st);
  ok = ok && check(st, "init_param");
  if (ok) pserver_client_finish_init(client, st);
  ok = ok && check(st, "finish_init");
  if (ok) pserver_client_send_grad(client, "w", 1, PSERVER_FLOAT32, g, sizeof g, st);
  ok = ok && check(st, "send_grad");
  if (ok) pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, w, sizeof w, st);
  ok = ok && check(st, "get_param");
  if (ok) {
    printf("pserver %s: w = %.2f %.2f\n", pserver_version(), w[0], w[1]);
    pserver_client_get_param(client, "nope", 4, PSERVER_FLOAT32, w, sizeof w, st);
    printf("unknown parameter: code %d\n", (int)pserver_status_code(st));
  }
  pserver_param_config_delete(cfg);
  pserver_client_delete(client);
  pserver_local_cluster_delete(cluster);
  pserver_status_delete(st);
  return ok ? 0 : 1;
}
