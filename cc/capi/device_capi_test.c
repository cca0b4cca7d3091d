/* The device-memory calls of pserver.h from C (compiled as C11, linked
 * against libpserver.so). Without a GPU (or in a build without CUDA) each
 * must fail PSERVER_UNAVAILABLE naming the reason, changing nothing; with
 * one, device -> server -> device must round trip exactly. Device memory
 * comes from libcudart found with dlopen, so this file needs no CUDA
 * headers; where there is a GPU but no libcudart to load, the round trip
 * is skipped, saying so. */
#define _POSIX_C_SOURCE 200809L

#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cc/capi/capi_test_util.h"
#include "cc/capi/pserver.h"

enum { kN = 5000 }; /* 5 blocks of 4 KiB (the last smaller) */

/* libcudart, loaded at run time. */
typedef int (*cuda_malloc_fn)(void**, size_t);
typedef int (*cuda_free_fn)(void*);
typedef int (*cuda_memcpy_fn)(void*, const void*, size_t, int);
static struct {
  void* lib;
  cuda_malloc_fn malloc_;
  cuda_free_fn free_;
  cuda_memcpy_fn memcpy_;
} cudart;

static int load_cudart(void) {
  const char* names[] = {"libcudart.so", "libcudart.so.13", "libcudart.so.12",
                         "/usr/local/cuda/lib64/libcudart.so"};
  for (size_t i = 0; i < sizeof names / sizeof names[0] && cudart.lib == NULL; ++i) {
    cudart.lib = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
  }
  if (cudart.lib == NULL) return 0;
  *(void**)&cudart.malloc_ = dlsym(cudart.lib, "cudaMalloc");
  *(void**)&cudart.free_ = dlsym(cudart.lib, "cudaFree");
  *(void**)&cudart.memcpy_ = dlsym(cudart.lib, "cudaMemcpy");
  return cudart.malloc_ != NULL && cudart.free_ != NULL && cudart.memcpy_ != NULL;
}

static void fill(float* v, int n, float scale) {
  for (int i = 0; i < n; ++i) v[i] = scale * (float)((i * 7919) % 1000) / 1000.0f;
}

/* With a GPU: device -> server -> device, exactly. */
static void round_trip(pserver_client_t* client, pserver_status_t* st, const float* w0) {
  if (!load_cudart()) {
    printf("SKIPPED device round trip: a CUDA device answers but libcudart could not be "
           "loaded (%s)\n", dlerror());
    return;
  }
  static float g[kN], back[kN], want[kN];
  fill(g, kN, -0.25f);
  void* d = NULL;
  EXPECT(cudart.malloc_(&d, sizeof g) == 0);
  if (d == NULL) return;
  pserver_client_get_param_device(client, "w", 1, PSERVER_FLOAT32, d, sizeof g, 0, st);
  EXPECT_OK(st);
  EXPECT(cudart.memcpy_(back, d, sizeof back, 2 /* device to host */) == 0);
  EXPECT(memcmp(back, w0, sizeof back) == 0);

  EXPECT(cudart.memcpy_(d, g, sizeof g, 1 /* host to device */) == 0);
  pserver_client_send_grad_device(client, "w", 1, PSERVER_FLOAT32, d, sizeof g, 0, st);
  EXPECT_OK(st);
  for (int i = 0; i < kN; ++i) want[i] = w0[i] - g[i]; /* SGD, learning rate 1 */
  pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, back, sizeof back, st);
  EXPECT_OK(st);
  EXPECT(memcmp(back, want, sizeof back) == 0);

  pserver_client_push_pull_device(client, "w", 1, PSERVER_FLOAT32, d, d, sizeof g, 0, st);
  EXPECT_OK(st);
  for (int i = 0; i < kN; ++i) want[i] = want[i] - g[i];
  EXPECT(cudart.memcpy_(back, d, sizeof back, 2) == 0);
  EXPECT(memcmp(back, want, sizeof back) == 0);

  /* Host memory is not device memory. */
  pserver_client_get_param_device(client, "w", 1, PSERVER_FLOAT32, back, sizeof back, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "host memory");
  cudart.free_(d);
  printf("device round trip: exact\n");
}

int main(void) {
  pserver_status_t* st = pserver_status_new();
  pserver_local_cluster_t* cluster = pserver_local_cluster_new(2, st);
  EXPECT_OK(st);
  pserver_client_options_t* options = pserver_client_options_new();
  pserver_client_options_set_block_bytes(options, 4096);
  pserver_client_t* client = pserver_local_cluster_client(cluster, options, st);
  EXPECT_OK(st);
  if (client == NULL) return 1;

  static float w0[kN], host[kN], got[kN];
  fill(w0, kN, 1.0f);
  int64_t shape[1] = {kN};
  pserver_param_config_t* cfg = pserver_param_config_new();
  pserver_param_config_set(cfg, "learning_rate", 1.0, st);
  EXPECT_OK(st);
  pserver_client_init_param(client, "w", 1, PSERVER_FLOAT32, shape, 1, w0, sizeof w0, cfg, st);
  EXPECT_OK(st);
  pserver_client_finish_init(client, st);
  EXPECT_OK(st);

  /* Argument errors come first, GPU or not. */
  pserver_client_get_param_device(client, NULL, 0, PSERVER_FLOAT32, host, sizeof host, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "name is NULL");
  pserver_client_send_grad_device(client, "w", 1, 42, host, sizeof host, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "unknown element type");
  pserver_client_get_param_device(client, "w", 1, PSERVER_FLOAT32, host, sizeof host - 4, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "needs 20000 bytes");
  pserver_client_send_grad_device(client, "w", 1, PSERVER_FLOAT64, host, sizeof host, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "element type float32");
  pserver_client_send_grad_device(NULL, "w", 1, PSERVER_FLOAT32, host, sizeof host, 0, st);
  EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "client is NULL");

  /* Is there a device? A host pointer tells: UNAVAILABLE without one,
   * INVALID_ARGUMENT ("host memory") with one. */
  pserver_client_get_param_device(client, "w", 1, PSERVER_FLOAT32, host, sizeof host, 0, st);
  if (pserver_status_code(st) == PSERVER_UNAVAILABLE) {
    EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "no CUDA device: ");
    printf("%s\n", pserver_status_message(st));
    pserver_client_send_grad_device(client, "w", 1, PSERVER_FLOAT32, host, sizeof host, 0, st);
    EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "no CUDA device: ");
    pserver_client_push_pull_device(client, "w", 1, PSERVER_FLOAT32, host, host, sizeof host, 0,
                                    st);
    EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "no CUDA device: ");
    /* The same with a status timeout: still the device error, promptly. */
    pserver_status_set_timeout_ms(st, 50);
    pserver_client_send_grad_device(client, "w", 1, PSERVER_FLOAT32, host, sizeof host, 0, st);
    EXPECT_STATUS(st, PSERVER_UNAVAILABLE, "no CUDA device: ");
    pserver_status_set_timeout_ms(st, 0);
    /* Nothing was applied. */
    pserver_client_get_param(client, "w", 1, PSERVER_FLOAT32, got, sizeof got, st);
    EXPECT_OK(st);
    EXPECT(memcmp(got, w0, sizeof got) == 0);
    printf("SKIPPED device round trip: no CUDA device\n");
  } else {
    EXPECT_STATUS(st, PSERVER_INVALID_ARGUMENT, "host memory");
    pserver_client_send_grad_device(client, "w", 1, PSERVER_FLOAT32, host, sizeof host, 7, st);
    EXPECT(pserver_status_code(st) == PSERVER_INVALID_ARGUMENT);
    round_trip(client, st, w0);
  }

  pserver_param_config_delete(cfg);
  pserver_client_delete(client);
  pserver_client_options_delete(options);
  pserver_local_cluster_delete(cluster);
  pserver_status_delete(st);
  return capi_test_report("device_capi_test");
}
