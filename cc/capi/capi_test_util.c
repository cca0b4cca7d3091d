/* capi_test_util.c: see capi_test_util.h. */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include "cc/capi/capi_test_util.h"

#include <stdio.h>
#include <time.h>

int failures = 0;

double now_seconds(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int capi_test_report(const char* name) {
  if (failures > 0) {
    fprintf(stderr, "%d failure(s)\n", failures);
    return 1;
  }
  printf("%s: all passed\n", name);
  return 0;
}
