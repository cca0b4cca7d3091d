/* The C ABI from C: etcd (a real /usr/bin/etcd on free 127.0.0.1 ports)
 * and the etcd key layout. Compiled as C11 and linked against
 * libpserver.so. */
#define _POSIX_C_SOURCE 200809L /* fork, kill, mkdtemp: to start etcd */

#include <arpa/inet.h>
#include <fcntl.h>
#include <math.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cc/capi/capi_test_util.h"
#include "cc/capi/pserver.h"

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
 * boots while test_etcd_keys runs. */
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
  pserver_server_options_t* bad_server = pserver_server_options_new();
  pserver_server_options_set_etcd(bad_server, " , ", "x", 1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "etcd endpoints are empty");
  pserver_server_options_set_etcd(NULL, "127.0.0.1:1", "x", 1, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "options");
  /* A missing etcd key file is an error naming it, before etcd is dialled. */
  pserver_server_options_set_etcd(bad_server, "127.0.0.1:1", "x", 1, st);
  EXPECT_OK(st);
  pserver_server_options_set_etcd_tls(bad_server, "/no/such/ca.pem", NULL, NULL);
  EXPECT(pserver_server_new(bad_server, st) == NULL);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "/no/such/ca.pem");
  pserver_server_options_set_etcd_tls(NULL, NULL, NULL, NULL);
  pserver_server_options_delete(bad_server);

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

  /* A server that registers itself: /ps_desired written, its address and
   * instance id at /ps/0, given up when it stops. */
  pserver_server_options_t* sopts = pserver_server_options_new();
  pserver_server_options_set_etcd(sopts, endpoint, "capi-reg", 1, st);
  EXPECT_OK(st);
  server = pserver_server_new(sopts, st);
  EXPECT_OK(st);
  pserver_server_options_delete(sopts);
  pserver_etcd_get(etcd, "/pserver/capi-reg/ps_desired", &value, &size, st);
  EXPECT_OK(st);
  EXPECT(size == 1 && value != NULL && value[0] == '1');
  pserver_buffer_delete(value);
  pserver_etcd_get(etcd, "/pserver/capi-reg/ps/0", &value, &size, st);
  EXPECT_OK(st);
  addr = server != NULL ? pserver_server_address(server) : "";
  char want[96];
  snprintf(want, sizeof want, "%s instance=", addr);
  EXPECT(value != NULL && size > strlen(want) && strncmp(value, want, strlen(want)) == 0);
  pserver_buffer_delete(value);
  pserver_server_delete(server);
  pserver_etcd_get(etcd, "/pserver/capi-reg/ps/0", &value, &size, st);
  EXPECT_STATUS(st, PSERVER_NOT_FOUND, "");
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

/* A server's /ps/<index> value: its address, instance id and metrics page. */
static void test_etcd_server_value(void) {
  pserver_status_t* st = pserver_status_new();
  char address[64], instance[64], metrics[64];
  EXPECT(pserver_etcd_server_value_parse("10.0.0.1:7000 instance=00ff metrics=10.0.0.1:9100",
                                         address, sizeof address, instance, sizeof instance,
                                         metrics, sizeof metrics, st) == 0);
  EXPECT_OK(st);
  EXPECT(streq(address, "10.0.0.1:7000"));
  EXPECT(streq(instance, "00ff"));
  EXPECT(streq(metrics, "10.0.0.1:9100"));
  /* Older forms: the missing fields are "". */
  EXPECT(pserver_etcd_server_value_parse("h:1 instance=ab", address, sizeof address, instance,
                                         sizeof instance, metrics, sizeof metrics, st) == 0);
  EXPECT(streq(address, "h:1") && streq(instance, "ab") && streq(metrics, ""));
  EXPECT(pserver_etcd_server_value_parse("h:1", address, sizeof address, instance,
                                         sizeof instance, metrics, sizeof metrics, st) == 0);
  EXPECT(streq(address, "h:1") && streq(instance, "") && streq(metrics, ""));
  /* Malformed, or a buffer too small: INVALID_ARGUMENT, nothing written. */
  strcpy(address, "unchanged");
  EXPECT(pserver_etcd_server_value_parse("h:1 instance=ab metrics=h:0", address, sizeof address,
                                         instance, sizeof instance, metrics, sizeof metrics,
                                         st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "metrics= is not host:port");
  EXPECT(pserver_etcd_server_value_parse("h:1 instance=ab", address, 3, instance,
                                         sizeof instance, metrics, sizeof metrics, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "too small");
  EXPECT(pserver_etcd_server_value_parse(NULL, address, sizeof address, instance,
                                         sizeof instance, metrics, sizeof metrics, st) == -1);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "value is NULL");
  EXPECT(streq(address, "unchanged"));
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
      {PSERVER_ETCD_KEY_SHARDS, NULL, "/pserver/job/shards/"},
      {PSERVER_ETCD_KEY_SHARD, "2", "/pserver/job/shards/2"},
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
  EXPECT(pserver_etcd_key_parse("job", "/pserver/job/shards/4", arg, sizeof arg, st) ==
         PSERVER_ETCD_KEY_SHARD);
  EXPECT(streq(arg, "4"));
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

int main(void) {
  const char* tmp = getenv("TEST_TMPDIR");
  etcd_pid = start_etcd(tmp != NULL ? tmp : "/tmp", etcd_endpoint, sizeof etcd_endpoint);
  test_etcd_keys();
  test_etcd_server_value();
  test_etcd();
  return capi_test_report("capi_etcd_test");
}
