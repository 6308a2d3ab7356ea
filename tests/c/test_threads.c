/* C client test of handles moving between threads, run under ASan/UBSan by `make test`:
 * append_latent on a worker thread then read back on the main thread; state views made on a
 * worker evaluated on the main thread; short-lived threads calling the library and ending
 * while another thread's calls evaluate; a freed handle stays refused after many new caches, and
 * a second free leaves them intact; a failing call leaves the offset unchanged; reservations
 * and geometries beyond what MLX can allocate are refused with a status, never a crash. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "latent_cache.h"

/* Counted from several threads at once. */
static _Atomic int failures = 0;

#include "check.h"

enum { RANK = 8, ROPE = 4, INDEX = 3, BATCH = 2, LIVE = 1000 };
static const size_t WIDTH[3] = {RANK, ROPE, INDEX};

/* The value at (tag, row, position, family, channel): distinct per slot and per cache. */
static float value_at(size_t tag, size_t row, size_t pos, int f, size_t ch) {
  return (float)(tag * 1000000 + row * 100000 + pos * 100 + (size_t)f * 20 + ch) * 0.5f;
}

static latent_cache *new_cache(void) {
  latent_cache_config cfg = latent_cache_config_default();
  cfg.kv_lora_rank = RANK;
  cfg.rope_head_dim = ROPE;
  cfg.index_head_dim = INDEX;
  latent_cache *c = NULL;
  OK(latent_cache_new(&cfg, &c));
  return c;
}

/* Host buffers for positions [start, start + tokens) of every row. */
static float *fill(size_t tag, size_t batch, size_t start, size_t tokens, int f) {
  float *buf = malloc(batch * tokens * WIDTH[f] * sizeof(float));
  for (size_t b = 0; b < batch; b++)
    for (size_t t = 0; t < tokens; t++)
      for (size_t ch = 0; ch < WIDTH[f]; ch++) buf[(b * tokens + t) * WIDTH[f] + ch] = value_at(tag, b, start + t, f, ch);
  return buf;
}

static latent_cache_status append_host(latent_cache *c, size_t tag, size_t batch, size_t start, size_t tokens) {
  float *d[3];
  for (int f = 0; f < 3; f++) d[f] = fill(tag, batch, start, tokens, f);
  size_t n = batch * tokens;
  latent_cache_status s = latent_cache_append_host(c, batch, tokens, d[0], n * RANK, d[1], n * ROPE, d[2], n * INDEX);
  for (int f = 0; f < 3; f++) free(d[f]);
  return s;
}

/* Every row of `c` must hold positions [0, len) of cache `tag`'s pattern, and nothing else. */
static void expect_rows(const latent_cache *c, size_t tag, size_t batch, size_t len, const char *what) {
  size_t got_batch = 0, offset = 0;
  OK(latent_cache_batch_size(c, &got_batch));
  OK(latent_cache_offset(c, &offset));
  if (got_batch != batch || offset != len) {
    fprintf(stderr, "%s: batch %zu offset %zu, expected %zu and %zu\n", what, got_batch, offset, batch, len);
    failures++;
    return;
  }
  for (size_t b = 0; b < batch; b++)
    for (int f = 0; f < 3; f++) {
      size_t written = 0, n = len * WIDTH[f];
      float *out = malloc((n + 1) * sizeof(float));
      latent_cache_status s = latent_cache_read_row_host(c, (uint32_t)f, b, out, n + 1, &written);
      if (s != LATENT_CACHE_STATUS_OK) {
        char m[512];
        latent_cache_last_error(m, sizeof m);
        fprintf(stderr, "%s: read_row_host row %zu family %d returned %d: %s\n", what, b, f, (int)s, m);
        failures++;
      } else if (written != n) {
        fprintf(stderr, "%s: row %zu family %d: %zu floats, expected %zu\n", what, b, f, written, n);
        failures++;
      } else {
        for (size_t i = 0; i < n; i++)
          if (out[i] != value_at(tag, b, i / WIDTH[f], f, i % WIDTH[f])) {
            fprintf(stderr, "%s: row %zu family %d float %zu: got %g\n", what, b, f, i, out[i]);
            failures++;
            break;
          }
      }
      free(out);
    }
}

/* ---- append_latent on a worker thread, read on the main thread ---- */

typedef struct {
  latent_cache *cache;
  size_t start, tokens;
} append_job;

static void *append_latent_worker(void *arg) {
  append_job *job = arg;
  mlx_array in[3], out[3];
  for (int f = 0; f < 3; f++) {
    float *d = fill(0, BATCH, job->start, job->tokens, f);
    OK(latent_cache_array_from_host(d, BATCH * job->tokens * WIDTH[f], BATCH, job->tokens, WIDTH[f], &in[f]));
    free(d);
  }
  OK(latent_cache_append_latent(job->cache, in[0], in[1], in[2], &out[0], &out[1], &out[2]));
  for (int f = 0; f < 3; f++) {
    latent_cache_array_free(in[f]);
    latent_cache_array_free(out[f]); /* unevaluated: the main thread reads the cache */
  }
  return NULL;
}

static void run_on_thread(void *(*fn)(void *), void *arg) {
  pthread_t t;
  CHECK(pthread_create(&t, NULL, fn, arg) == 0);
  CHECK(pthread_join(t, NULL) == 0);
}

static void test_append_latent_on_a_worker(void) {
  latent_cache *c = new_cache();
  OK(append_host(c, 0, BATCH, 0, 3));
  append_job job = {c, 3, 4};
  run_on_thread(append_latent_worker, &job);
  expect_rows(c, 0, BATCH, 7, "append_latent on a worker, read on main");
  OK(append_host(c, 0, BATCH, 7, 2));
  expect_rows(c, 0, BATCH, 9, "append_host on main after append_latent on a worker");
  latent_cache_free(c);
}

/* ---- state views made on a worker, evaluated on the main thread ---- */

typedef struct {
  latent_cache *cache;
  mlx_array views[3];
} state_job;

static void *state_worker(void *arg) {
  state_job *job = arg;
  append_job append = {job->cache, 2, 3};
  append_latent_worker(&append);
  OK(latent_cache_state(job->cache, &job->views[0], &job->views[1], &job->views[2]));
  return NULL;
}

static void test_state_views_from_a_worker(void) {
  latent_cache *c = new_cache();
  OK(append_host(c, 0, BATCH, 0, 2));
  state_job job = {c, {{NULL}, {NULL}, {NULL}}};
  run_on_thread(state_worker, &job);
  CHECK(job.views[0].ctx && job.views[1].ctx && job.views[2].ctx);
  if (job.views[0].ctx && job.views[1].ctx && job.views[2].ctx) OK(latent_cache_eval(job.views, 3));
  for (int f = 0; f < 3; f++) latent_cache_array_free(job.views[f]);
  expect_rows(c, 0, BATCH, 5, "state views from a worker evaluated on main");
  latent_cache_free(c);
}

/* ---- stale handles ---- */

static void test_stale_handle(void) {
  latent_cache *stale = new_cache();
  OK(append_host(stale, 0, 1, 0, 1));
  latent_cache_free(stale);
  latent_cache **live = malloc(LIVE * sizeof *live);
  for (size_t i = 0; i < LIVE; i++) {
    live[i] = new_cache();
    OK(append_host(live[i], i + 1, 1, 0, 1));
  }
  size_t out = 12345, written = 12345;
  float buf[64];
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_offset(stale, &out));
  CHECK(out == 12345);
  CHECK(latent_cache_last_error(NULL, 0) > 0);
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_append_host(stale, 1, 1, buf, RANK, buf, ROPE, buf, INDEX));
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_read_row_host(stale, 0, 0, buf, 64, &written));
  CHECK(written == 12345);
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_trim(stale, 1, true));
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_reserve(stale, 16));
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_reset(stale));
  latent_cache_free(stale); /* a second free: detected and ignored */
  CHECK(latent_cache_last_error(NULL, 0) > 0);
  for (size_t i = 0; i < LIVE; i++) {
    char what[64];
    snprintf(what, sizeof what, "live cache %zu after calls on a freed handle", i);
    expect_rows(live[i], i + 1, 1, 1, what);
    latent_cache_free(live[i]);
  }
  free(live);
}

/* ---- a failing call leaves the offset unchanged (made on a worker, checked on main) ---- */

static void *failing_worker(void *arg) {
  latent_cache *c = arg;
  EXPECT(LATENT_CACHE_STATUS_SHAPE, append_host(c, 0, BATCH + 1, 4, 1)); /* batch mismatch */
  CHECK(latent_cache_last_error(NULL, 0) > 0);
  EXPECT(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_trim(c, 5, false));
  CHECK(latent_cache_last_error(NULL, 0) > 0);
  return NULL;
}

static void test_failing_call_changes_nothing(void) {
  latent_cache *c = new_cache();
  OK(append_host(c, 0, BATCH, 0, 4));
  run_on_thread(failing_worker, c);
  expect_rows(c, 0, BATCH, 4, "after failing calls on a worker");
  latent_cache_free(c);
}

/* Requests far beyond memory: CAPACITY (or OK when the memory really exists), the cache
 * unchanged and usable, the process alive. On a GLM-width DSA layer 16M positions are 45 GB. */
static void test_reservations_beyond_memory(void) {
  latent_cache_config cfg = latent_cache_config_default();
  latent_cache *glm = NULL;
  OK(latent_cache_new(&cfg, &glm));
  const size_t huge[] = {16000000, 2147483647u, (size_t)-1};
  for (int i = 0; i < 3; i++) {
    latent_cache_status s = latent_cache_reserve(glm, huge[i]);
    CHECK(s == LATENT_CACHE_STATUS_OK || s == LATENT_CACHE_STATUS_CAPACITY);
  }
  float latent[512] = {0}, rope[64] = {0}, keys[128] = {0};
  latent[3] = 1.5f;
  latent_cache_status s = latent_cache_append_host(glm, 1, 1, latent, 512, rope, 64, keys, 128);
  CHECK(s == LATENT_CACHE_STATUS_OK || s == LATENT_CACHE_STATUS_CAPACITY);
  size_t offset = 99;
  OK(latent_cache_offset(glm, &offset));
  CHECK(offset == (s == LATENT_CACHE_STATUS_OK ? 1u : 0u));
  OK(latent_cache_reset(glm));
  OK(latent_cache_append_host(glm, 1, 1, latent, 512, rope, 64, keys, 128));
  for (int i = 0; i < 2; i++) {
    s = latent_cache_reserve(glm, huge[i]);
    CHECK(s == LATENT_CACHE_STATUS_OK || s == LATENT_CACHE_STATUS_CAPACITY);
  }
  float back[512] = {0};
  size_t written = 0;
  OK(latent_cache_read_row_host(glm, LATENT_CACHE_FAMILY_LATENT, 0, back, 512, &written));
  CHECK(written == 512 && back[3] == 1.5f);
  latent_cache_free(glm);

  cfg.kv_lora_rank = 2147483647u;
  latent_cache *wide = NULL;
  CHECK(latent_cache_new(&cfg, &wide) == LATENT_CACHE_STATUS_INVALID_ARGUMENT && wide == NULL);
}

/* ---- short-lived threads ending beside a thread whose calls evaluate ---- */

enum { STEPS = 60, ENDED = 60 };
static _Atomic int long_lived_done = 0;

static void *long_lived_worker(void *arg) {
  latent_cache *c = arg;
  for (size_t step = 0; step < STEPS; step++) {
    OK(append_host(c, 7, 1, step, 1));
    if (step % 10 == 9) expect_rows(c, 7, 1, step + 1, "the long-lived thread's cache");
  }
  long_lived_done = 1;
  return NULL;
}

static void *short_lived_worker(void *arg) {
  size_t tag = 100 + (size_t)(uintptr_t)arg;
  latent_cache *c = new_cache();
  OK(append_host(c, tag, 1, 0, 3));
  expect_rows(c, tag, 1, 3, "a short-lived thread's cache");
  latent_cache_free(c);
  return NULL;
}

static void test_threads_ending_beside_evaluations(void) {
  latent_cache *c = new_cache();
  pthread_t long_lived;
  CHECK(pthread_create(&long_lived, NULL, long_lived_worker, c) == 0);
  size_t ended = 0;
  while (!long_lived_done || ended < ENDED) {
    run_on_thread(short_lived_worker, (void *)(uintptr_t)ended);
    ended++;
  }
  CHECK(pthread_join(long_lived, NULL) == 0);
  expect_rows(c, 7, 1, STEPS, "the long-lived thread's cache, at the end");
  latent_cache_free(c);
}

int main(void) {
  test_append_latent_on_a_worker();
  test_threads_ending_beside_evaluations();
  test_state_views_from_a_worker();
  test_stale_handle();
  test_failing_call_changes_nothing();
  test_reservations_beyond_memory();
  if (failures) {
    fprintf(stderr, "test_threads: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_threads: ok\n");
  return 0;
}
