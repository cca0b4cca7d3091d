/* capi_test_util.h: what the C tests of the C ABI share (capi_test.c,
 * capi_tables_test.c, capi_etcd_test.c): EXPECT macros that count failures,
 * a monotonic clock and the report that ends main. */
#ifndef PSERVER_CC_CAPI_CAPI_TEST_UTIL_H_
#define PSERVER_CC_CAPI_CAPI_TEST_UTIL_H_

#include <stdio.h>
#include <string.h>

#include "cc/capi/pserver.h"

/* How many EXPECTs failed so far. */
extern int failures;


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

/* Seconds on the monotonic clock. */
double now_seconds(void);

/* The end of main: prints the failures, or "<name>: all passed"; returns
 * the exit code. */
int capi_test_report(const char* name);

#endif /* PSERVER_CC_CAPI_CAPI_TEST_UTIL_H_ */
