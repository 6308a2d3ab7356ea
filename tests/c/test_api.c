/* C client test of the latent-cache ABI, run under ASan/UBSan by `make test`: values read back
 * equal what was written, the row layout follows the documented semantics, and every rejected
 * call returns a status and a message and leaves the cache exactly as it was. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "latent_cache.h"

static int failures = 0;

#include "check.h"

enum { RANK = 8, ROPE = 4, INDEX = 6 };

/* The value written at (row, position, family, channel): distinct per slot, so any misplaced
 * position shows up. Positions are counted per row from its first append. */
static float value_at(size_t row, size_t pos, int family, size_t ch) {
  return (float)(row * 100000 + pos * 100 + (size_t)family * 20 + ch) * 0.5f;
}

static size_t width_of(int family, int dsa) {
  return family == 0 ? RANK : family == 1 ? ROPE : (dsa ? INDEX : 0);
}

/* Appends `tokens` positions to `batch` rows; row b's new positions start at start[b]. */
static latent_cache_status append(latent_cache *c, size_t batch, size_t tokens, const size_t *start, int dsa) {
  float *bufs[3];
  size_t lens[3];
  for (int f = 0; f < 3; f++) {
    size_t w = width_of(f, dsa);
    lens[f] = batch * tokens * w;
    bufs[f] = lens[f] ? malloc(lens[f] * sizeof(float)) : NULL;
    for (size_t b = 0; b < batch; b++)
      for (size_t t = 0; t < tokens; t++)
        for (size_t ch = 0; ch < w; ch++)
          bufs[f][(b * tokens + t) * w + ch] = value_at(b, start[b] + t, f, ch);
  }
  latent_cache_status s = latent_cache_append_host(c, batch, tokens, bufs[0], lens[0], bufs[1], lens[1], bufs[2], lens[2]);
  for (int f = 0; f < 3; f++) free(bufs[f]);
  return s;
}

/* Row `row` must hold positions [first, first + len) of the value pattern for logical row `src`. */
static void expect_row(const latent_cache *c, size_t row, size_t src, size_t first, size_t len, int dsa) {
  for (int f = 0; f < (dsa ? 3 : 2); f++) {
    size_t w = width_of(f, dsa), written = 0;
    float *out = malloc((len * w + 1) * sizeof(float));
    OK(latent_cache_read_row_host(c, (uint32_t)f, row, out, len * w + 1, &written));
    CHECK(written == len * w);
    for (size_t t = 0; t < len && written == len * w; t++)
      for (size_t ch = 0; ch < w; ch++)
        if (out[t * w + ch] != value_at(src, first + t, f, ch)) {
          fprintf(stderr, "row %zu family %d pos %zu ch %zu: got %g want %g\n", row, f, t, ch, out[t * w + ch],
                  value_at(src, first + t, f, ch));
          failures++;
          t = len;
          break;
        }
    free(out);
  }
}

static void expect_layout(const latent_cache *c, size_t batch, const size_t *row_offsets) {
  size_t got_batch = 99, offset = 0, rows[16], pads[16], written = 0, longest = 0;
  OK(latent_cache_batch_size(c, &got_batch));
  CHECK(got_batch == batch);
  OK(latent_cache_offset(c, &offset));
  OK(latent_cache_row_offsets(c, rows, 16, &written));
  CHECK(written == batch);
  OK(latent_cache_left_pad(c, pads, 16, &written));
  CHECK(written == batch);
  for (size_t b = 0; b < batch; b++) longest = row_offsets[b] > longest ? row_offsets[b] : longest;
  CHECK(offset == longest);
  for (size_t b = 0; b < batch && b < 16; b++) {
    CHECK(rows[b] == row_offsets[b]);
    CHECK(pads[b] == offset - row_offsets[b]);
  }
}

/* Everything observable about a cache, to prove a rejected call changed nothing. */
typedef struct {
  size_t batch, offset, rows[16], pads[16];
  float *data[3];
  size_t len[3];
  int in_round;
} snapshot;

static snapshot take(const latent_cache *c, int dsa) {
  snapshot s;
  memset(&s, 0, sizeof s);
  size_t written;
  bool round = false;
  OK(latent_cache_batch_size(c, &s.batch));
  OK(latent_cache_offset(c, &s.offset));
  OK(latent_cache_row_offsets(c, s.rows, 16, &written));
  OK(latent_cache_left_pad(c, s.pads, 16, &written));
  OK(latent_cache_in_spec_round(c, &round));
  s.in_round = round;
  for (int f = 0; f < (dsa ? 3 : 2); f++) {
    size_t n = s.batch * s.offset * width_of(f, dsa);
    s.data[f] = malloc((n + 1) * sizeof(float));
    OK(latent_cache_read_host(c, (uint32_t)f, s.data[f], n + 1, &s.len[f]));
  }
  return s;
}

static void expect_unchanged(const latent_cache *c, snapshot *before, int dsa, int line) {
  snapshot now = take(c, dsa);
  int same = now.batch == before->batch && now.offset == before->offset && now.in_round == before->in_round &&
             memcmp(now.rows, before->rows, sizeof now.rows) == 0 && memcmp(now.pads, before->pads, sizeof now.pads) == 0;
  for (int f = 0; f < (dsa ? 3 : 2); f++) {
    same = same && now.len[f] == before->len[f];
    /* Padding positions are unspecified, so compare valid positions only. */
    size_t w = width_of(f, dsa);
    for (size_t b = 0; same && b < now.batch; b++)
      same = memcmp(now.data[f] + (b * now.offset + now.pads[b]) * w, before->data[f] + (b * now.offset + now.pads[b]) * w,
                    (now.offset - now.pads[b]) * w * sizeof(float)) == 0;
    free(now.data[f]);
  }
  if (!same) {
    fprintf(stderr, "line %d: a rejected call changed the cache\n", line);
    failures++;
  }
}

static latent_cache *make(int dsa, size_t max_tokens) {
  latent_cache_config cfg = latent_cache_config_default();
  cfg.kv_lora_rank = RANK;
  cfg.rope_head_dim = ROPE;
  cfg.index_head_dim = dsa ? INDEX : 0;
  cfg.max_tokens = max_tokens;
  latent_cache *c = NULL;
  OK(latent_cache_new(&cfg, &c));
  return c;
}

static void test_config(void) {
  latent_cache_config cfg = latent_cache_config_default();
  CHECK(cfg.kv_lora_rank == 512 && cfg.rope_head_dim == 64 && cfg.index_head_dim == 128 && cfg.max_tokens == 0);
  latent_cache *c = (latent_cache *)0x1;
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_new(NULL, &c));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_new(&cfg, NULL));
  cfg.kv_lora_rank = 0;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  cfg = latent_cache_config_default();
  cfg.hot_window = 256; /* every family float32, as the hot positions: nothing to compose */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  cfg.latent_storage = LATENT_CACHE_STORAGE_Q8;
  cfg.hot_storage = LATENT_CACHE_STORAGE_Q8; /* hot positions must be a float mode */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  cfg.hot_storage = LATENT_CACHE_STORAGE_BF16;
  cfg.rope_storage = LATENT_CACHE_STORAGE_F32; /* more precise than its hot positions */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  cfg.hot_storage = 99;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  CHECK(c == (latent_cache *)0x1); /* outputs untouched on failure */
  CHECK(strcmp(latent_cache_version(), LATENT_CACHE_VERSION) == 0);
  latent_cache_free(NULL);
}

static void test_append_read_trim(void) {
  latent_cache *c = make(1, 0);
  size_t zero[2] = {0, 0}, batch = 99, bpt = 0, max_append = 0, n = 0;
  bool trimmable = false;
  OK(latent_cache_batch_size(c, &batch));
  CHECK(batch == 0);
  OK(latent_cache_bytes_per_token(c, &bpt));
  CHECK(bpt == (RANK + ROPE + INDEX) * 4);
  OK(latent_cache_max_append_tokens(c, &max_append));
  CHECK(max_append == SIZE_MAX);
  OK(latent_cache_is_trimmable(c, &trimmable));
  CHECK(trimmable);
  OK(latent_cache_minimum_reusable_offset(c, &n));
  CHECK(n == 0);

  OK(append(c, 2, 5, zero, 1));
  size_t five[2] = {5, 5};
  OK(append(c, 2, 1, five, 1));
  size_t six[2] = {6, 6};
  expect_layout(c, 2, six);
  expect_row(c, 0, 0, 0, 6, 1);
  expect_row(c, 1, 1, 0, 6, 1);

  OK(latent_cache_trim(c, 2, false));
  size_t four[2] = {4, 4};
  expect_layout(c, 2, four);
  expect_row(c, 1, 1, 0, 4, 1);
  OK(append(c, 2, 3, four, 1)); /* overwrites the trimmed positions */
  size_t seven[2] = {7, 7};
  expect_layout(c, 2, seven);
  expect_row(c, 0, 0, 0, 7, 1);

  char sig[256];
  size_t len = 0;
  OK(latent_cache_signature(c, sig, sizeof sig, &len));
  CHECK(len == strlen(sig) && len > 0);
  latent_cache *plain = make(0, 0);
  char other[256];
  OK(latent_cache_signature(plain, other, sizeof other, &len));
  CHECK(strcmp(sig, other) != 0);

  OK(latent_cache_reset(c));
  OK(latent_cache_batch_size(c, &batch));
  CHECK(batch == 0);
  OK(append(c, 1, 2, zero, 1)); /* a reset cache takes a new batch size */
  expect_row(c, 0, 0, 0, 2, 1);
  latent_cache_free(c);
  latent_cache_free(plain);
}

static void test_rejections(void) {
  latent_cache *c = make(1, 12);
  latent_cache *plain = make(0, 0);
  size_t zero[2] = {0, 0};
  OK(append(c, 2, 4, zero, 1));
  OK(append(plain, 1, 3, zero, 0));
  float buf[2 * 16 * RANK];
  memset(buf, 0, sizeof buf);
  size_t written = 0, rows[4];
  snapshot before = take(c, 1);
  snapshot before_plain = take(plain, 0);

  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_append_host(NULL, 2, 1, buf, 2 * RANK, buf, 2 * ROPE, buf, 2 * INDEX));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_append_host(c, 2, 1, NULL, 2 * RANK, buf, 2 * ROPE, buf, 2 * INDEX));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_append_host(c, 2, 1, buf, 2 * RANK, NULL, 2 * ROPE, buf, 2 * INDEX));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 2, 1, buf, 0, buf, 2 * ROPE, buf, 2 * INDEX));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 2, 1, buf, 2 * RANK - 1, buf, 2 * ROPE, buf, 2 * INDEX));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 2, 1, buf, 2 * RANK, buf, 2 * ROPE, buf, 2 * INDEX + 1));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 0, 1, NULL, 0, NULL, 0, NULL, 0));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 2, 0, NULL, 0, NULL, 0, NULL, 0));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, 1, 1, buf, RANK, buf, ROPE, buf, INDEX)); /* batch mismatch */
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_host(c, SIZE_MAX / 2, 3, buf, 8, buf, 8, buf, 8)); /* overflow */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_append_host(c, 2, 1, buf, 2 * RANK, buf, 2 * ROPE, NULL, 0));
  FAILS(LATENT_CACHE_STATUS_CAPACITY, latent_cache_append_host(c, 2, 9, buf, 18 * RANK, buf, 18 * ROPE, buf, 18 * INDEX));
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_trim(c, 5, false));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_trim(NULL, 1, false));
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 2, buf, sizeof buf / 4, &written));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_read_row_host(c, 7, 0, buf, sizeof buf / 4, &written));
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 0, buf, 4 * RANK - 1, &written));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 0, NULL, 4 * RANK, &written));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 0, buf, 4 * RANK, NULL));
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_read_host(c, LATENT_CACHE_FAMILY_ROPE, buf, 0, &written));
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_row_offsets(c, rows, 1, &written));
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_row_offsets(c, NULL, 0, &written));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_row_offsets(c, NULL, 4, &written));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_offset(c, NULL));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_offset(NULL, &written));
  char small[4];
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_signature(c, small, sizeof small, &written));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_spec_round_commit(c));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_spec_round_rollback(c, 0));
  mlx_array none = {NULL};
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_append_latent(c, none, none, none, NULL, NULL, NULL));
  FAILS(LATENT_CACHE_STATUS_CAPACITY, latent_cache_reserve(c, 13)); /* beyond max_tokens (12) */
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_reserve(NULL, 4));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_state(NULL, NULL, NULL, NULL));
  OK(latent_cache_eval(&none, 1)); /* entries with ctx == NULL (a layer without index keys) are skipped */
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_eval(NULL, 2));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_set_eval_lock(NULL, (latent_cache_lock_fn)0x1, NULL));
  OK(latent_cache_reserve(c, 12)); /* room is not content: nothing observable changes */
  expect_unchanged(c, &before, 1, __LINE__);

  /* Wrong family on a layer without DSA. */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_append_host(plain, 1, 1, buf, RANK, buf, ROPE, buf, INDEX));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_read_row_host(plain, LATENT_CACHE_FAMILY_INDEX_KEYS, 0, buf, 64, &written));
  mlx_array keys;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_stored_index_keys(plain, &keys));
  expect_unchanged(plain, &before_plain, 0, __LINE__);

  /* The next valid call works. */
  size_t four[2] = {4, 4};
  OK(append(c, 2, 1, four, 1));
  expect_row(c, 1, 1, 0, 5, 1);
  for (int f = 0; f < 3; f++) {
    free(before.data[f]);
    free(before_plain.data[f]);
  }
  latent_cache_free(c);
  latent_cache_free(plain);
  /* A freed handle is detected, not dereferenced. */
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_offset(c, &written));
  latent_cache_free(c);
}

/* Two rows verify 3 draft tokens each and accept different counts. */
static void test_speculative_rows(void) {
  latent_cache *c = make(1, 0);
  size_t start[2] = {0, 0};
  OK(append(c, 2, 5, start, 1));
  size_t lens[2] = {5, 5};
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_spec_round_commit(c));
  OK(latent_cache_spec_round_begin(c));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_spec_round_begin(c));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_trim(c, 1, false));
  OK(append(c, 2, 3, lens, 1)); /* the verify forward appends the 3 drafts */
  size_t keep[2] = {3, 1};       /* row 0 accepts all, row 1 only the first */
  size_t too_many[2] = {4, 0}, short_list[1] = {1};
  snapshot before = take(c, 1);
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_spec_round_rollback_rows(c, too_many, 2));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_spec_round_rollback_rows(c, short_list, 1));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_spec_round_rollback_rows(c, NULL, 2));
  expect_unchanged(c, &before, 1, __LINE__);
  for (int f = 0; f < 3; f++) free(before.data[f]);
  OK(latent_cache_spec_round_rollback_rows(c, keep, 2));
  size_t after[2] = {8, 6};
  expect_layout(c, 2, after);
  expect_row(c, 0, 0, 0, 8, 1);
  expect_row(c, 1, 1, 0, 6, 1);
  /* The next step appends to both rows at their own positions. */
  OK(append(c, 2, 1, after, 1));
  size_t next[2] = {9, 7};
  expect_layout(c, 2, next);
  expect_row(c, 1, 1, 0, 7, 1);
  /* A uniform rollback is a trim. */
  OK(latent_cache_spec_round_begin(c));
  OK(append(c, 2, 3, next, 1));
  OK(latent_cache_spec_round_rollback(c, 2));
  size_t uniform[2] = {11, 9};
  expect_layout(c, 2, uniform);
  expect_row(c, 0, 0, 0, 11, 1);
  OK(latent_cache_spec_round_begin(c));
  OK(latent_cache_spec_round_commit(c));
  latent_cache_free(c);
}

/* A request joins a running batch and another finishes. */
static void test_join_and_leave(void) {
  latent_cache *running = make(1, 0), *joiner = make(1, 0), *merged = make(1, 0), *other = make(0, 0);
  size_t zero[2] = {0, 0};
  OK(append(running, 2, 6, zero, 1));
  OK(append(joiner, 1, 2, zero, 1));
  const latent_cache *sources[2] = {running, joiner};
  snapshot before = take(merged, 1);
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_merge_rows(merged, sources, 0));
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_merge_rows(merged, NULL, 2));
  const latent_cache *mismatched[2] = {running, other};
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_merge_rows(merged, mismatched, 2));
  const latent_cache *self[1] = {merged};
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_merge_rows(merged, self, 1));
  expect_unchanged(merged, &before, 1, __LINE__);
  for (int f = 0; f < 3; f++) free(before.data[f]);
  OK(latent_cache_merge_rows(merged, sources, 2));
  /* A merge into rows: the joiner's row joins after them (the rows there stay in place). */
  const latent_cache *again[1] = {joiner};
  OK(latent_cache_merge_rows(merged, again, 1));
  size_t lens[4] = {6, 6, 2, 2};
  expect_layout(merged, 4, lens);
  expect_row(merged, 2, 0, 0, 2, 1); /* the joiner's row 0 */
  expect_row(merged, 3, 0, 0, 2, 1);
  expect_row(merged, 1, 1, 0, 6, 1);
  expect_row(running, 1, 1, 0, 6, 1); /* sources unchanged */

  /* Row 0 finishes, and the second joiner: keep rows 1 and 2. */
  size_t keep[2] = {1, 2}, dup[2] = {1, 1}, out_of_range[1] = {4};
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_filter_rows(merged, dup, 2));
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_filter_rows(merged, out_of_range, 1));
  OK(latent_cache_filter_rows(merged, keep, 2));
  size_t left[2] = {6, 2};
  expect_layout(merged, 2, left);
  expect_row(merged, 0, 1, 0, 6, 1);
  expect_row(merged, 1, 0, 0, 2, 1);

  latent_cache *single = NULL;
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_extract_row(merged, 2, &single));
  CHECK(single == NULL);
  OK(latent_cache_extract_row(merged, 1, &single));
  size_t one[1] = {2};
  expect_layout(single, 1, one);
  expect_row(single, 0, 0, 0, 2, 1);
  latent_cache_free(single);
  latent_cache_free(running);
  latent_cache_free(joiner);
  latent_cache_free(merged);
  latent_cache_free(other);
}

/* Row `row` of `c`: the prompt's first `prefix` positions (source row 0), then its own (`src`). */
static void expect_over_prefix(const latent_cache *c, size_t row, size_t prefix, size_t src, size_t len) {
  for (int f = 0; f < 3; f++) {
    size_t w = width_of(f, 1), written = 0;
    float *out = malloc((len * w + 1) * sizeof(float));
    OK(latent_cache_read_row_host(c, (uint32_t)f, row, out, len * w + 1, &written));
    CHECK(written == len * w);
    for (size_t t = 0; t < len && written == len * w; t++)
      for (size_t ch = 0; ch < w; ch++)
        if (out[t * w + ch] != value_at(t < prefix ? 0 : src, t, f, ch)) {
          fprintf(stderr, "row %zu family %d pos %zu: got %g\n", row, f, t, out[t * w + ch]);
          failures++;
          t = len;
          break;
        }
    free(out);
  }
}

/* Shared prefixes: a stored prompt below two requests (nothing copied), writes stopping at the
 * prefix, a fork of a row into three branches; the prefix handle freed while caches read it. */
static void test_shared_prefix(void) {
  latent_cache *prompt = make(1, 0), *request = make(1, 0);
  size_t zero[1] = {0}, layers = 0, positions = 0, bytes = 0, shared = 0;
  OK(append(prompt, 1, 5, zero, 1));
  latent_cache_prefix *prefix = NULL;
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_share_prefix(prompt, 0, 6, &prefix));
  CHECK(prefix == NULL);
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_prefix_info(NULL, &layers, &positions, &bytes));
  OK(latent_cache_share_prefix(prompt, 0, 5, &prefix));
  OK(latent_cache_prefix_info(prefix, &layers, &positions, &bytes));
  CHECK(layers == 1 && positions == 5 && bytes > 0);
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_attach_prefix(prompt, prefix, 1));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_attach_prefix(request, prefix, 0));
  OK(latent_cache_attach_prefix(request, prefix, 2));
  latent_cache_prefix_free(prefix); /* the request keeps what it reads */
  size_t starts[2] = {5, 5}, lens[2] = {8, 8}, three[3] = {8, 8, 8};
  OK(append(request, 2, 3, starts, 1));
  expect_layout(request, 2, lens);
  expect_over_prefix(request, 0, 5, 0, 8);
  expect_over_prefix(request, 1, 5, 1, 8);
  OK(latent_cache_shared_positions(request, &shared));
  CHECK(shared == 5);
  snapshot before = take(request, 1);
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_trim(request, 4, false));
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_fork_row(request, 2, 3));
  expect_unchanged(request, &before, 1, __LINE__);
  for (int f = 0; f < 3; f++) free(before.data[f]);
  OK(latent_cache_fork_row(request, 1, 3));
  OK(latent_cache_shared_positions(request, &shared));
  CHECK(shared == 8);
  expect_layout(request, 3, three);
  expect_over_prefix(request, 2, 5, 1, 8);
  latent_cache_free(prompt);
  latent_cache_free(request);
}

/* The MLX-native path: arrays in, views out, one evaluation. */
static void test_mlx_arrays(void) {
  latent_cache *c = make(1, 0);
  mlx_array keys = {NULL};
  OK(latent_cache_stored_index_keys(c, &keys));
  CHECK(keys.ctx != NULL);
  latent_cache_array_free(keys);
  float lat[3 * RANK], rope[3 * ROPE], idx[3 * INDEX];
  for (size_t t = 0; t < 3; t++) {
    for (size_t ch = 0; ch < RANK; ch++) lat[t * RANK + ch] = value_at(0, t, 0, ch);
    for (size_t ch = 0; ch < ROPE; ch++) rope[t * ROPE + ch] = value_at(0, t, 1, ch);
    for (size_t ch = 0; ch < INDEX; ch++) idx[t * INDEX + ch] = value_at(0, t, 2, ch);
  }
  mlx_array in[3], out[3] = {{NULL}, {NULL}, {NULL}};
  OK(latent_cache_array_from_host(lat, 3 * RANK, 1, 3, RANK, &in[0]));
  OK(latent_cache_array_from_host(rope, 3 * ROPE, 1, 3, ROPE, &in[1]));
  OK(latent_cache_array_from_host(idx, 3 * INDEX, 1, 3, INDEX, &in[2]));
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_array_from_host(lat, 3 * RANK, 1, 3, RANK + 1, &keys));
  /* Wrong width for rope: rejected, nothing appended. */
  FAILS(LATENT_CACHE_STATUS_SHAPE, latent_cache_append_latent(c, in[0], in[0], in[2], &out[0], &out[1], &out[2]));
  CHECK(out[0].ctx == NULL);
  OK(latent_cache_append_latent(c, in[0], in[1], in[2], &out[0], &out[1], &out[2]));
  OK(latent_cache_eval(out, 3));
  for (int i = 0; i < 3; i++) {
    latent_cache_array_free(in[i]);
    latent_cache_array_free(out[i]);
  }
  expect_row(c, 0, 0, 0, 3, 1);
  OK(latent_cache_state(c, &out[0], NULL, &out[2]));
  OK(latent_cache_eval(out + 2, 1));
  latent_cache_array_free(out[0]);
  latent_cache_array_free(out[2]);
  latent_cache_free(c);
}

/* Every status has its name (for logs and exceptions); an unknown value is "UNKNOWN". */
static void test_status_names(void) {
  CHECK(strcmp(latent_cache_status_name(LATENT_CACHE_STATUS_OK), "OK") == 0);
  CHECK(strcmp(latent_cache_status_name(LATENT_CACHE_STATUS_NULL_ARGUMENT), "NULL_ARGUMENT") == 0);
  CHECK(strcmp(latent_cache_status_name(LATENT_CACHE_STATUS_CAPACITY), "CAPACITY") == 0);
  CHECK(strcmp(latent_cache_status_name(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL), "BUFFER_TOO_SMALL") == 0);
  CHECK(strcmp(latent_cache_status_name(LATENT_CACHE_STATUS_PANIC), "PANIC") == 0);
  CHECK(strcmp(latent_cache_status_name(11), "UNKNOWN") == 0);
  CHECK(strcmp(latent_cache_status_name(0xFFFFFFFFu), "UNKNOWN") == 0);
}

/* bfloat16 round-to-nearest-even, independent of the library. */
static float bf16_round(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  u &= 0xFFFF0000u;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* A layer of the given widths with an 8-bit latent, a bfloat16 rope key and FP8 index keys. */
static latent_cache_config compact_config(size_t latent, size_t rope, size_t index) {
  latent_cache_config cfg = latent_cache_config_default();
  cfg.kv_lora_rank = latent;
  cfg.rope_head_dim = rope;
  cfg.index_head_dim = index;
  cfg.latent_storage = LATENT_CACHE_STORAGE_Q8;
  cfg.rope_storage = LATENT_CACHE_STORAGE_BF16;
  cfg.index_storage = LATENT_CACHE_STORAGE_FP8;
  return cfg;
}

/* Storage modes as an engine configures them: bytes per token, bfloat16 values as rounded,
 * 8-bit values within one quantization step, packed parts, and a refused combination. */
static void test_storage_modes(void) {
  enum { B = 2, T = 3, L = 128, R = 64, K = 128 };
  latent_cache_config cfg = compact_config(L, R, K);
  latent_cache *c = NULL;
  OK(latent_cache_new(&cfg, &c));
  size_t bpt = 0;
  OK(latent_cache_bytes_per_token(c, &bpt));
  CHECK(bpt == (L + (L / 64) * 4) + R * 2 + (K + (K / 128) * 4));
  static float lat[B * T * L], rope[B * T * R], keys[B * T * K];
  for (size_t i = 0; i < B * T * L; i++) lat[i] = (float)((int)((i * 7919) % 2001) - 1000) / 250.0f;
  for (size_t i = 0; i < B * T * R; i++) rope[i] = (float)((int)((i * 104729) % 4001) - 2000) / 3.0f;
  for (size_t i = 0; i < B * T * K; i++) keys[i] = lat[i] * 0.5f;
  OK(latent_cache_append_host(c, B, T, lat, B * T * L, rope, B * T * R, keys, B * T * K));

  static float out[T * L];
  size_t n = 0;
  OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_ROPE, 1, out, T * R, &n));
  CHECK(n == T * R);
  for (size_t i = 0; i < T * R; i++) CHECK(out[i] == bf16_round(rope[T * R + i]));
  OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 0, out, T * L, &n));
  CHECK(n == T * L);
  for (size_t g = 0; g < T * L; g += 64) {
    float lo = lat[g], hi = lat[g];
    for (size_t i = g; i < g + 64; i++) {
      lo = lat[i] < lo ? lat[i] : lo;
      hi = lat[i] > hi ? lat[i] : hi;
    }
    float bound = (hi - lo) / 255.0f + 4.0f * 4.0f / 256.0f + (hi - lo) / 256.0f;
    for (size_t i = g; i < g + 64; i++) CHECK(out[i] - lat[i] <= bound && lat[i] - out[i] <= bound);
  }

  latent_cache_packed p;
  memset(&p, 0, sizeof p);
  OK(latent_cache_packed_state(c, LATENT_CACHE_FAMILY_LATENT, &p));
  CHECK(p.storage == LATENT_CACHE_STORAGE_Q8 && p.bits == 8 && p.group_size == 64);
  CHECK(p.values.ctx != NULL && p.scales.ctx != NULL && p.biases.ctx != NULL);
  latent_cache_packed_release(&p);
  latent_cache_packed_release(&p); /* harmless */
  CHECK(p.values.ctx == NULL && p.scales.ctx == NULL && p.biases.ctx == NULL);
  OK(latent_cache_packed_state(c, LATENT_CACHE_FAMILY_INDEX_KEYS, &p));
  CHECK(p.storage == LATENT_CACHE_STORAGE_FP8 && p.bits == 8 && p.group_size == 128);
  CHECK(p.values.ctx != NULL && p.scales.ctx != NULL && p.biases.ctx == NULL);
  latent_cache_packed_release(&p);
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_packed_state(c, 7, &p));
  latent_cache_packed_release(NULL);

  latent_cache *d = (latent_cache *)0x1;
  cfg.rope_storage = LATENT_CACHE_STORAGE_FP8; /* 64 wide: FP8 blocks are 128 */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &d));
  cfg.rope_storage = 42;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &d));
  CHECK(d == (latent_cache *)0x1);
  latent_cache_free(c);
}

/* The ragged layout as an engine drives it: a padded batched prefill, a round where rows keep
 * different counts (only row ends move), each row's values intact, and no merge across layouts. */
static void test_ragged_layout(void) {
  enum { B = 2, T = 4 };
  latent_cache_config cfg = latent_cache_config_default();
  cfg.kv_lora_rank = RANK;
  cfg.rope_head_dim = ROPE;
  cfg.index_head_dim = 0;
  cfg.layout = LATENT_CACHE_LAYOUT_RAGGED;
  latent_cache *c = NULL, *rj = NULL;
  OK(latent_cache_new(&cfg, &c));
  float lat[B * (T + 3) * RANK], rope[B * (T + 3) * ROPE];
  for (size_t i = 0; i < sizeof lat / sizeof lat[0]; i++) lat[i] = (float)i;
  for (size_t i = 0; i < sizeof rope / sizeof rope[0]; i++) rope[i] = (float)i + 0.5f;
  size_t pad[B] = {0, 3}, bad_pad[B] = {1, 2};
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT,
        latent_cache_append_host_padded(c, B, T, bad_pad, B, lat, B * T * RANK, rope, B * T * ROPE, NULL, 0));
  OK(latent_cache_append_host_padded(c, B, T, pad, B, lat, B * T * RANK, rope, B * T * ROPE, NULL, 0));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE,
        latent_cache_append_host_padded(c, B, T, pad, B, lat, B * T * RANK, rope, B * T * ROPE, NULL, 0));
  size_t ends[B], offs[B], n = 0;
  OK(latent_cache_row_ends(c, ends, B, &n));
  OK(latent_cache_row_offsets(c, offs, B, &n));
  CHECK(n == B && ends[0] == T && ends[1] == T && offs[0] == T && offs[1] == T - 3);

  OK(latent_cache_spec_round_begin(c));
  OK(latent_cache_append_host(c, B, 3, lat, B * 3 * RANK, rope, B * 3 * ROPE, NULL, 0));
  size_t keep[B] = {2, 0};
  OK(latent_cache_spec_round_rollback_rows(c, keep, B));
  OK(latent_cache_row_ends(c, ends, B, &n));
  OK(latent_cache_row_offsets(c, offs, B, &n));
  CHECK(ends[0] == T + 2 && ends[1] == T && offs[0] == T + 2 && offs[1] == T - 3);
  /* Row 1 continues right after what it kept: its next position is written at its own end. */
  OK(latent_cache_append_host(c, B, 1, lat, B * RANK, rope, B * ROPE, NULL, 0));
  static float out[(T + 3) * RANK];
  OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 1, out, sizeof out / sizeof out[0], &n));
  CHECK(n == (T - 3 + 1) * RANK);
  /* Row 1: its one prompt position (the last of its padded prefill), then its new position. */
  for (size_t ch = 0; ch < RANK; ch++) {
    CHECK(out[ch] == lat[(1 * T + 3) * RANK + ch]);
    CHECK(out[RANK + ch] == lat[1 * RANK + ch]);
  }

  cfg.layout = LATENT_CACHE_LAYOUT_RIGHT_JUSTIFIED;
  OK(latent_cache_new(&cfg, &rj));
  const latent_cache *sources[1] = {c};
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_merge_rows(rj, sources, 1));
  cfg.layout = 9;
  latent_cache *d = (latent_cache *)0x1;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &d));
  CHECK(d == (latent_cache *)0x1);
  latent_cache_free(rj);
  latent_cache_free(c);
}

/* The read path as a C engine without mlx-c drives it: a donor captured before the cache moves
 * on, attention over it (queries made from host floats), the output read back and compared with
 * a float64 computation over the rows' values. */
static void test_donor_attention(void) {
  enum { B = 2, H = 2, R = RANK, P = ROPE };
  latent_cache_config cfg = latent_cache_config_default();
  cfg.kv_lora_rank = R;
  cfg.rope_head_dim = P;
  cfg.index_head_dim = 0;
  cfg.layout = LATENT_CACHE_LAYOUT_RAGGED;
  latent_cache *c = NULL;
  OK(latent_cache_new(&cfg, &c));
  float lat[B * 5 * R], rope[B * 5 * P];
  for (size_t i = 0; i < sizeof lat / sizeof lat[0]; i++) lat[i] = (float)((int)(i * 37 % 19) - 9) / 8.0f;
  for (size_t i = 0; i < sizeof rope / sizeof rope[0]; i++) rope[i] = (float)((int)(i * 11 % 13) - 6) / 8.0f;
  size_t pad[B] = {0, 2};
  OK(latent_cache_append_host_padded(c, B, 5, pad, B, lat, B * 5 * R, rope, B * 5 * P, NULL, 0));
  float rows_lat[B][5 * R], rows_rope[B][5 * P];
  size_t len[B], n = 0;
  for (size_t b = 0; b < B; b++) {
    OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, b, rows_lat[b], 5 * R, &n));
    len[b] = n / R;
    OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_ROPE, b, rows_rope[b], 5 * P, &n));
  }
  latent_cache_donor *d = NULL;
  OK(latent_cache_capture_donor_rows(c, &d));
  OK(latent_cache_append_host(c, B, 1, lat, B * R, rope, B * P, NULL, 0)); /* the cache moves on */
  size_t batch = 0, offset = 0, ends[B], lp[B];
  OK(latent_cache_donor_rows(d, &batch, &offset, lp, ends, B));
  CHECK(batch == B && offset == 5 && lp[1] == 2 && ends[0] == 5 && ends[1] == 5);

  float ql[B * H * R], qr[B * H * P];
  for (size_t i = 0; i < B * H * R; i++) ql[i] = (float)((int)(i % 7) - 3) / 4.0f;
  for (size_t i = 0; i < B * H * P; i++) qr[i] = (float)((int)(i % 5) - 2) / 4.0f;
  size_t shape_l[4] = {B, H, 1, R}, shape_r[4] = {B, H, 1, P};
  mlx_array q_latent = {NULL}, q_rope = {NULL}, out = {NULL}, none = {NULL};
  OK(latent_cache_array_from_host_shape(ql, B * H * R, shape_l, 4, &q_latent));
  OK(latent_cache_array_from_host_shape(qr, B * H * P, shape_r, 4, &q_rope));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_donor_attend(d, q_latent, q_rope, 0.5f, 2, none, &out));
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_donor_attend(d, q_latent, q_rope, 0.5f, 7, none, &out));
  CHECK(out.ctx == NULL);
  OK(latent_cache_donor_attend(d, q_latent, q_rope, 0.5f, LATENT_CACHE_MASK_NONE, none, &out));
  static float got[B * H * R];
  OK(latent_cache_array_to_host(out, got, B * H * R, &n));
  CHECK(n == B * H * R);
  float tiny[4];
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_array_to_host(out, tiny, 4, &n));
  for (size_t b = 0; b < B; b++)
    for (size_t h = 0; h < H; h++) {
      const float *qlv = ql + (b * H + h) * R, *qrv = qr + (b * H + h) * P;
      double score[5], max = -1e300, total = 0;
      for (size_t t = 0; t < len[b]; t++) {
        double s = 0;
        for (size_t k = 0; k < R; k++) s += (double)qlv[k] * rows_lat[b][t * R + k];
        for (size_t k = 0; k < P; k++) s += (double)qrv[k] * rows_rope[b][t * P + k];
        score[t] = 0.5 * s;
        if (score[t] > max) max = score[t];
      }
      for (size_t t = 0; t < len[b]; t++) total += (score[t] = exp(score[t] - max));
      for (size_t k = 0; k < R; k++) {
        double want = 0;
        for (size_t t = 0; t < len[b]; t++) want += score[t] / total * rows_lat[b][t * R + k];
        double diff = got[(b * H + h) * R + k] - want;
        CHECK(diff < 1e-4 && diff > -1e-4);
      }
    }
  latent_cache_array_free(out);
  latent_cache_array_free(q_latent);
  latent_cache_array_free(q_rope);
  latent_cache_free(c);
  latent_cache_donor_free(d);

  /* DSA selection on a layer with index keys: scores, the top 2 positions, attention over them. */
  cfg.index_head_dim = 8;
  cfg.layout = LATENT_CACHE_LAYOUT_RIGHT_JUSTIFIED;
  OK(latent_cache_new(&cfg, &c));
  float keys[B * 5 * 8];
  for (size_t i = 0; i < B * 5 * 8; i++) keys[i] = (float)(i % 9) / 9.0f + 0.1f;
  OK(latent_cache_append_host(c, B, 5, lat, B * 5 * R, rope, B * 5 * P, keys, B * 5 * 8));
  latent_cache_donor *dsa = NULL;
  OK(latent_cache_capture_donor_rows(c, &dsa));
  float qi[B * 1 * 1 * 8], w[B * 1 * 1];
  for (size_t i = 0; i < B * 8; i++) qi[i] = 0.5f + (float)i / 32.0f;
  for (size_t i = 0; i < B; i++) w[i] = 1.0f;
  size_t shape_qi[4] = {B, 1, 1, 8}, shape_w[3] = {B, 1, 1};
  mlx_array q_index = {NULL}, weights = {NULL}, scores = {NULL}, picked = {NULL}, sparse = {NULL};
  OK(latent_cache_array_from_host_shape(qi, B * 8, shape_qi, 4, &q_index));
  OK(latent_cache_array_from_host_shape(w, B, shape_w, 3, &weights));
  OK(latent_cache_donor_index_scores(dsa, q_index, weights, LATENT_CACHE_MASK_NONE, &scores));
  float sc[B * 5];
  OK(latent_cache_array_to_host(scores, sc, B * 5, &n));
  CHECK(n == B * 5 && sc[0] > 0.0f);
  OK(latent_cache_donor_select(dsa, scores, 5, &picked));
  CHECK(picked.ctx == NULL); /* no more positions than k: attend densely */
  OK(latent_cache_donor_select(dsa, scores, 2, &picked));
  CHECK(picked.ctx != NULL);
  float pk[B * 2];
  OK(latent_cache_array_to_host(picked, pk, B * 2, &n));
  for (size_t b = 0; b < B; b++) { /* the two best-scoring positions of each row */
    for (size_t j = 0; j < 2; j++) {
      size_t p = (size_t)pk[b * 2 + j], better = 0;
      for (size_t t = 0; t < 5; t++) better += sc[b * 5 + t] > sc[b * 5 + p];
      CHECK(better < 2);
    }
  }
  { /* the selection in one call: the same positions; k covering the window gives none; k 0 refused */
    mlx_array direct = {NULL}, none = {NULL};
    float dk[B * 2];
    OK(latent_cache_donor_index_select(dsa, q_index, weights, LATENT_CACHE_MASK_NONE, 2, &direct));
    OK(latent_cache_array_to_host(direct, dk, B * 2, &n));
    CHECK(n == B * 2 && memcmp(dk, pk, sizeof dk) == 0);
    OK(latent_cache_donor_index_select(dsa, q_index, weights, LATENT_CACHE_MASK_NONE, 5, &none));
    CHECK(none.ctx == NULL);
    CHECK(latent_cache_donor_index_select(dsa, q_index, weights, LATENT_CACHE_MASK_NONE, 0, &none) ==
          LATENT_CACHE_STATUS_INVALID_ARGUMENT);
    CHECK(none.ctx == NULL);
    latent_cache_array_free(direct);
  }
  OK(latent_cache_array_from_host_shape(ql, B * H * R, shape_l, 4, &q_latent));
  OK(latent_cache_array_from_host_shape(qr, B * H * P, shape_r, 4, &q_rope));
  OK(latent_cache_donor_attend_selected(dsa, q_latent, q_rope, 0.5f, LATENT_CACHE_MASK_NONE, picked, &sparse));
  OK(latent_cache_array_to_host(sparse, got, B * H * R, &n));
  CHECK(n == B * H * R);
  mlx_array arrays[7] = {q_index, weights, scores, picked, sparse, q_latent, q_rope};
  for (int i = 0; i < 7; i++) latent_cache_array_free(arrays[i]);
  latent_cache_donor_free(dsa);
  latent_cache_free(c);
  latent_cache_donor_free(d); /* ignored, with a message */
  CHECK(latent_cache_last_error(NULL, 0) > 0);
  FAILS(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_donor_rows(d, &batch, &offset, NULL, NULL, 0));
}

/* Composed storage as an engine drives it: a chunked prefill under maintenance, the newest
 * positions read exactly (float32 hot mode) and older ones as the compact mode gives them, the
 * boundary where the header's rule puts it, a trim below minimum_reusable_offset refused with
 * nothing changed, the config read back. */
static void test_composed(void) {
  enum { L = 64, R = 64, K = 128, H = 100, T = 300 };
  latent_cache_config cfg = compact_config(L, R, K);
  cfg.hot_window = H;
  latent_cache *c = NULL;
  OK(latent_cache_new(&cfg, &c));
  static float lat[T * L], rope[T * R], keys[T * K];
  for (size_t i = 0; i < T * L; i++) lat[i] = (float)((int)((i * 7919) % 2001) - 1000) / 250.0f;
  for (size_t i = 0; i < T * R; i++) rope[i] = (float)((int)((i * 104729) % 4001) - 2000) / 3.0f;
  for (size_t i = 0; i < T * K; i++) keys[i] = lat[i % (T * L)] * 0.5f;
  OK(latent_cache_prefill_begin(c));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_prefill_begin(c));
  for (size_t at = 0; at < T; at += 100) {
    OK(latent_cache_append_host(c, 1, 100, lat + at * L, 100 * L, rope + at * R, 100 * R, keys + at * K, 100 * K));
  }
  size_t conv[2] = {7, 7}, n = 0, boundary = (T - H) / 64 * 64;
  OK(latent_cache_converted_positions(c, conv, 2, &n));
  CHECK(n == 1 && conv[0] == boundary); /* boundaries follow the length, chunks or not */
  size_t row0 = 0;
  FAILS(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_prefill_commit(c, (size_t[]){1}, 1));
  OK(latent_cache_prefill_commit(c, &row0, 1));
  OK(latent_cache_prefill_end(c));
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_prefill_end(c));
  OK(latent_cache_converted_positions(c, conv, 2, &n));
  CHECK(n == 1 && conv[0] == boundary);

  static float out[T * L];
  OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_LATENT, 0, out, T * L, &n));
  CHECK(n == T * L);
  size_t exact_hot = 0, compact_differs = 0;
  for (size_t i = 0; i < T * L; i++) {
    if (i >= boundary * L) exact_hot += out[i] == lat[i];
    else compact_differs += out[i] != lat[i];
    CHECK(fabsf(out[i] - lat[i]) <= 0.05f); /* 8-bit affine of bf16 values within [-4, 4] */
  }
  CHECK(exact_hot == (T - boundary) * L);
  CHECK(compact_differs > 0);
  OK(latent_cache_read_row_host(c, LATENT_CACHE_FAMILY_ROPE, 0, out, T * R, &n));
  for (size_t i = 0; i < T * R; i++) CHECK(out[i] == (i >= boundary * R ? rope[i] : bf16_round(rope[i])));

  size_t reusable = 0, offset = 0, max_append = 0;
  OK(latent_cache_minimum_reusable_offset(c, &reusable));
  CHECK(reusable == boundary + H);
  FAILS(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_trim(c, T - reusable + 1, false));
  OK(latent_cache_offset(c, &offset));
  CHECK(offset == T);
  OK(latent_cache_max_append_tokens(c, &max_append));
  CHECK(max_append == boundary + 64 + H - 1 - T);
  OK(latent_cache_trim(c, T - reusable, false));

  latent_cache_config back;
  memset(&back, 0, sizeof back);
  OK(latent_cache_get_config(c, &back));
  CHECK(back.hot_window == H && back.hot_storage == LATENT_CACHE_STORAGE_F32 &&
        back.latent_storage == LATENT_CACHE_STORAGE_Q8 && back.index_head_dim == K);
  char sig[160];
  OK(latent_cache_signature(c, sig, sizeof sig, &n));
  CHECK(strcmp(sig, "kv:composed:f32:100:kv:mla-storage:q8-bf16-fp8:kv:mla:target:dsa") == 0);
  latent_cache_free(c);
}

/* bfloat16 bits of a float, rounded to nearest even (no NaN here): the reference, in C. */
static uint16_t bf16_bits(float x) {
  uint32_t u;
  memcpy(&u, &x, sizeof u);
  return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

static float bf16_value(uint16_t bits) {
  uint32_t u = (uint32_t)bits << 16;
  float x;
  memcpy(&x, &u, sizeof x);
  return x;
}

/* The config grows by struct_size (a newer header's struct is this one plus fields), host
 * arrays come in the engine's types, MLX's memory is visible and its cache can be cleared. */
static void test_config_growth_and_host_types(void) {
  latent_cache_config cfg = latent_cache_config_default();
  CHECK(cfg.struct_size == sizeof cfg);
  struct newer {
    latent_cache_config base;
    uint64_t added[2];
  } n;
  memset(&n, 0xAB, sizeof n);
  CHECK(latent_cache_config_init(&n.base, sizeof n) == LATENT_CACHE_STATUS_OK);
  CHECK(n.base.struct_size == sizeof n && n.added[0] == 0 && n.added[1] == 0 && n.base.kv_lora_rank == 512);
  latent_cache *c = NULL;
  CHECK(latent_cache_new(&n.base, &c) == LATENT_CACHE_STATUS_OK);
  latent_cache_config back;
  CHECK(latent_cache_get_config(c, &back) == LATENT_CACHE_STATUS_OK);
  CHECK(back.struct_size == sizeof back && back.index_head_dim == 128);
  latent_cache_free(c);
  n.added[1] = 5; /* an option this library does not know */
  c = (latent_cache *)0x1;
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&n.base, &c));
  cfg.struct_size = 12345; /* what an uninitialized struct may hold */
  FAILS(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_new(&cfg, &c));
  CHECK(c == (latent_cache *)0x1);

  enum { N = 6 };
  const float x[N] = {1.0f, -2.5f, 3.14159265f, 1e-3f, -65504.0f, 0.33333333f};
  uint16_t bits[N];
  for (int i = 0; i < N; i++) bits[i] = bf16_bits(x[i]);
  const size_t shape[2] = {2, 3};
  mlx_array a = {0};
  CHECK(latent_cache_array_from_host_typed(bits, N, LATENT_CACHE_DTYPE_BFLOAT16, shape, 2, &a) == LATENT_CACHE_STATUS_OK);
  uint32_t dtype = 99;
  size_t ndim = 0, dims[4] = {0}, written = 0;
  CHECK(latent_cache_array_dtype(a, &dtype) == LATENT_CACHE_STATUS_OK && dtype == LATENT_CACHE_DTYPE_BFLOAT16);
  CHECK(latent_cache_array_ndim(a, &ndim) == LATENT_CACHE_STATUS_OK && ndim == 2);
  CHECK(latent_cache_array_shape(a, dims, 4, &written) == LATENT_CACHE_STATUS_OK && written == 2 && dims[0] == 2 && dims[1] == 3);
  float wide[N];
  CHECK(latent_cache_array_to_host_typed(a, LATENT_CACHE_DTYPE_FLOAT32, wide, N, &written) == LATENT_CACHE_STATUS_OK);
  for (int i = 0; i < N; i++) CHECK(wide[i] == bf16_value(bits[i]));
  int32_t ints[N];
  CHECK(latent_cache_array_to_host_typed(a, LATENT_CACHE_DTYPE_INT32, ints, N, &written) == LATENT_CACHE_STATUS_OK);
  for (int i = 0; i < N; i++) CHECK(ints[i] == (int32_t)bf16_value(bits[i]));
  FAILS(LATENT_CACHE_STATUS_BUFFER_TOO_SMALL, latent_cache_array_to_host_typed(a, LATENT_CACHE_DTYPE_INT32, ints, N - 1, &written));
  FAILS(LATENT_CACHE_STATUS_DTYPE, latent_cache_array_from_host_typed(bits, N, LATENT_CACHE_DTYPE_UINT8, shape, 2, &a));
  latent_cache_array_free(a);

  latent_cache_memory mem;
  CHECK(latent_cache_memory_info(&mem) == LATENT_CACHE_STATUS_OK && mem.limit > 0 && mem.peak >= mem.active);
  CHECK(latent_cache_clear_memory_cache() == LATENT_CACHE_STATUS_OK);
  CHECK(latent_cache_memory_info(&mem) == LATENT_CACHE_STATUS_OK && mem.cache == 0);
  uint32_t device = 99;
  CHECK(latent_cache_get_device(&device) == LATENT_CACHE_STATUS_OK);
  CHECK(device == LATENT_CACHE_DEVICE_CPU || device == LATENT_CACHE_DEVICE_GPU);
}

/* Several processes, from one: a group of this process alone, refusals of sends to itself and
 * of a strict backend that is not configured, and GLM-5.2's pipeline stages. (Two processes over
 * the ring backend: tests/distributed.rs and tests/distributed_stages.rs.) */
static void test_distributed(void) {
  latent_cache_group *g = (latent_cache_group *)0x1;
  EXPECT(LATENT_CACHE_STATUS_BACKEND, latent_cache_group_init("ring", true, &g));
  CHECK(g == (latent_cache_group *)0x1);
  MUST(latent_cache_group_init(NULL, false, &g));
  size_t rank = 9, size = 0;
  OK(latent_cache_group_info(g, &rank, &size));
  CHECK(rank == 0 && size == 1);
  float v[2] = {1, 2};
  mlx_array x = {0};
  MUST(latent_cache_array_from_host(v, 2, 1, 1, 2, &x));
  EXPECT(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_group_send(g, x, 0));
  mlx_array got = {0};
  EXPECT(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_group_recv(g, x, 1, &got));
  CHECK(got.ctx == NULL);
  latent_cache_array_free(x);
  latent_cache_group_free(g);
  latent_cache_group_free(NULL);
  size_t starts[21], written = 0;
  OK(latent_cache_glm52_stage_starts(2, starts, 21, &written));
  CHECK(written == 2 && starts[0] == 0 && starts[1] == 38);
  EXPECT(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_glm52_stage_starts(22, starts, 21, &written));
  OK(latent_cache_glm52_local_starts(starts, 21, &written));
  CHECK(written == 21 && starts[3] == 6 && starts[20] == 74);
  bool crosses = false;
  size_t source = 0;
  OK(latent_cache_glm52_crossing(4, &crosses, &source));
  CHECK(crosses && source == 2);
  OK(latent_cache_glm52_crossing(6, &crosses, &source));
  CHECK(!crosses);
  EXPECT(LATENT_CACHE_STATUS_OUT_OF_RANGE, latent_cache_glm52_crossing(78, &crosses, &source));
}

int main(void) {
  test_status_names();
  test_config();
  test_config_growth_and_host_types();
  test_append_read_trim();
  test_rejections();
  test_speculative_rows();
  test_join_and_leave();
  test_shared_prefix();
  test_mlx_arrays();
  test_storage_modes();
  test_ragged_layout();
  test_donor_attention();
  test_composed();
  test_distributed();
  if (failures) {
    fprintf(stderr, "test_api: %d failure(s)\n", failures);
    return 1;
  }
  printf("test_api: all checks passed\n");
  return 0;
}
