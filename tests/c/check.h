/* The checks the C and C++ tests share. Each test declares `failures` (plain, or _Atomic where
 * threads count it) before including this, and returns non-zero from main when it is non-zero.
 * CHECK counts a condition that does not hold; EXPECT a call that does not return `expected`
 * (with this thread's last error message), OK one that does not return OK; FAILS a call that
 * does not fail with `expected` and a message; MUST stops the test at a failed call, where going
 * on would only crash. */
#ifndef LATENT_CACHE_TEST_CHECK_H
#define LATENT_CACHE_TEST_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#include "latent_cache.h"

#define CHECK(cond)                                                                \
  do {                                                                             \
    if (!(cond)) {                                                                 \
      fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond);     \
      failures++;                                                                  \
    }                                                                              \
  } while (0)

#define LC_REPORT(call, s_, expected)                                              \
  do {                                                                             \
    char m_[512];                                                                  \
    latent_cache_last_error(m_, sizeof m_);                                        \
    fprintf(stderr, "%s:%d: %s returned %d, expected %d: %s\n", __FILE__, __LINE__, #call, (int)(s_), \
            (int)(expected), m_);                                                  \
  } while (0)

#define EXPECT(expected, call)                                                     \
  do {                                                                             \
    latent_cache_status s_ = (call);                                               \
    if (s_ != (expected)) {                                                        \
      LC_REPORT(call, s_, expected);                                               \
      failures++;                                                                  \
    }                                                                              \
  } while (0)

#define OK(call) EXPECT(LATENT_CACHE_STATUS_OK, call)

#define MUST(call)                                                                 \
  do {                                                                             \
    latent_cache_status s_ = (call);                                               \
    if (s_ != LATENT_CACHE_STATUS_OK) {                                            \
      LC_REPORT(call, s_, LATENT_CACHE_STATUS_OK);                                 \
      exit(1);                                                                     \
    }                                                                              \
  } while (0)

#define FAILS(expected, call)                                                      \
  do {                                                                             \
    latent_cache_last_error(NULL, 0);                                              \
    latent_cache_status s_ = (call);                                               \
    if (s_ != (expected)) {                                                        \
      fprintf(stderr, "%s:%d: %s returned %d, expected %d\n", __FILE__, __LINE__, #call, (int)s_, \
              (int)(expected));                                                    \
      failures++;                                                                  \
    }                                                                              \
    CHECK(latent_cache_last_error(NULL, 0) > 0);                                   \
  } while (0)

#endif
