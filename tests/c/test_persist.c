/* Saving in one process and loading in another, under ASan/UBSan: `test_persist save FILE`
 * writes a three-layer set (float, 8-bit and ragged layers, padded rows) and `test_persist load
 * FILE` loads it in a fresh process and checks every value; the load side also damages copies of
 * the file (truncated, bytes flipped) and expects a status every time, with nothing created.
 * `test_persist store-put DIR` puts a conversation into a prefix store on DIR (and checks its
 * lookups, attaches and refusals); `test_persist store-restore DIR` restores it in a fresh
 * process and checks every value. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "latent_cache.h"

static int failures = 0;

#include "check.h"
enum { LAYERS = 3, B = 2, T = 6, R = 128, P = 64, K = 128 };

static float value_at(size_t layer, size_t row, size_t pos, size_t family, size_t ch) {
  return (float)((layer * 131 + row * 17 + pos * 7 + family * 3 + ch) % 256) * 0.25f;
}

static void configs(latent_cache_config *cfg) {
  for (int l = 0; l < LAYERS; l++) {
    cfg[l] = latent_cache_config_default();
    cfg[l].kv_lora_rank = R;
    cfg[l].rope_head_dim = P;
    cfg[l].index_head_dim = l == 0 ? K : 0;
  }
  cfg[1].latent_storage = LATENT_CACHE_STORAGE_BF16; /* exact for these values */
  cfg[1].rope_storage = LATENT_CACHE_STORAGE_BF16;
  cfg[2].layout = LATENT_CACHE_LAYOUT_RAGGED;
}

static size_t width(size_t f) { return f == 0 ? R : f == 1 ? P : K; }

static void save(const char *path) {
  latent_cache_config cfg[LAYERS];
  configs(cfg);
  latent_cache_set *set = NULL;
  MUST(latent_cache_set_new(cfg, LAYERS, &set));
  size_t pad[B] = {0, 2};
  static float buf[3][B * T * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    for (size_t f = 0; f < 3; f++)
      for (size_t b = 0; b < B; b++)
        for (size_t t = 0; t < T; t++)
          for (size_t c = 0; c < width(f); c++)
            buf[f][(b * T + t) * width(f) + c] = t < pad[b] ? 0.0f : value_at(l, b, t - pad[b], f, c);
    MUST(latent_cache_append_host_padded(layer, B, T, pad, B, buf[0], B * T * R, buf[1], B * T * P, l == 0 ? buf[2] : NULL,
                                       l == 0 ? B * T * K : 0));
  }
  MUST(latent_cache_set_save(set, path));
  uint8_t *bytes = NULL;
  size_t len = 0;
  MUST(latent_cache_set_save_to_buffer(set, &bytes, &len));
  CHECK(len > 0 && bytes != NULL);
  latent_cache_set *again = NULL;
  MUST(latent_cache_set_load_from_buffer(bytes, len, &again));
  latent_cache_bytes_free(bytes, len);
  latent_cache_set_free(again);
  latent_cache_set_free(set);
}

static void load(const char *path) {
  latent_cache_set *set = NULL;
  MUST(latent_cache_set_load(path, &set));
  size_t n = 0;
  MUST(latent_cache_set_layer_count(set, &n));
  CHECK(n == LAYERS);
  static float out[T * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    size_t rows[B], written = 0;
    MUST(latent_cache_row_offsets(layer, rows, B, &written));
    CHECK(written == B && rows[0] == T && rows[1] == T - 2);
    for (size_t f = 0; f < (l == 0 ? 3u : 2u); f++)
      for (size_t b = 0; b < B; b++) {
        MUST(latent_cache_read_row_host(layer, (uint32_t)f, b, out, T * K, &written));
        CHECK(written == rows[b] * width(f));
        for (size_t t = 0; t < rows[b]; t++)
          for (size_t c = 0; c < width(f); c++) CHECK(out[t * width(f) + c] == value_at(l, b, t, f, c));
      }
  }
  latent_cache_set_free(set);

  /* Damaged copies: truncated at 32 points, and bytes flipped in the data. */
  FILE *fp = fopen(path, "rb");
  CHECK(fp != NULL);
  fseek(fp, 0, SEEK_END);
  long size = ftell(fp);
  fseek(fp, 0, SEEK_SET);
  uint8_t *file = malloc((size_t)size);
  CHECK(fread(file, 1, (size_t)size, fp) == (size_t)size);
  fclose(fp);
  for (int k = 0; k < 32; k++) {
    latent_cache_set *damaged = (latent_cache_set *)0x1;
    size_t cut = (size_t)size * (size_t)k / 32;
    CHECK(latent_cache_set_load_from_buffer(file, cut, &damaged) != LATENT_CACHE_STATUS_OK);
    CHECK(damaged == (latent_cache_set *)0x1 && latent_cache_last_error(NULL, 0) > 0);
  }
  uint64_t header = 0;
  memcpy(&header, file, sizeof header);
  for (int k = 0; k < 16; k++) {
    size_t at = 8 + (size_t)header + ((size_t)size - 8 - (size_t)header) * (size_t)k / 16;
    file[at] ^= 0x10;
    latent_cache_set *damaged = (latent_cache_set *)0x1;
    CHECK(latent_cache_set_load_from_buffer(file, (size_t)size, &damaged) == LATENT_CACHE_STATUS_INVALID_ARGUMENT);
    CHECK(damaged == (latent_cache_set *)0x1);
    file[at] ^= 0x10;
  }
  free(file);
}

enum { STORE_T = 40, STORE_BLOCK = 16 };
static const uint8_t NS[] = "model-a";

static void store_tokens(uint32_t *tokens) {
  for (uint32_t t = 0; t < STORE_T; t++) tokens[t] = 1000 + t * 7;
}

/* Checks every layer of `set` holds `rows` rows of the conversation's first `n` positions. */
static void check_store_rows(latent_cache_set *set, size_t rows, size_t n) {
  static float out[STORE_T * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    size_t offsets[4], held = 0, written = 0;
    MUST(latent_cache_row_offsets(layer, offsets, 4, &held));
    CHECK(held == rows);
    for (size_t b = 0; b < held && b < 4; b++) {
      CHECK(offsets[b] == n);
      for (size_t f = 0; f < (l == 0 ? 3u : 2u); f++) {
        MUST(latent_cache_read_row_host(layer, (uint32_t)f, b, out, STORE_T * K, &written));
        for (size_t t = 0; t < n; t++)
          for (size_t c = 0; c < width(f); c++) CHECK(out[t * width(f) + c] == value_at(l, 0, t, f, c));
      }
    }
  }
}

static void store_put(const char *dir) {
  latent_cache_config cfg[LAYERS];
  configs(cfg);
  latent_cache_set *set = NULL;
  MUST(latent_cache_set_new(cfg, LAYERS, &set));
  static float buf[3][STORE_T * K];
  for (size_t l = 0; l < LAYERS; l++) {
    latent_cache *layer = NULL;
    MUST(latent_cache_set_layer(set, l, &layer));
    for (size_t f = 0; f < 3; f++)
      for (size_t t = 0; t < STORE_T; t++)
        for (size_t c = 0; c < width(f); c++) buf[f][t * width(f) + c] = value_at(l, 0, t, f, c);
    MUST(latent_cache_append_host(layer, 1, STORE_T, buf[0], STORE_T * R, buf[1], STORE_T * P, l == 0 ? buf[2] : NULL,
                                  l == 0 ? STORE_T * K : 0));
  }
  uint32_t tokens[STORE_T];
  store_tokens(tokens);
  latent_cache_store *store = (latent_cache_store *)0x1;
  EXPECT(LATENT_CACHE_STATUS_INVALID_ARGUMENT, latent_cache_store_open(dir, 0, 1 << 26, 1 << 26, &store));
  CHECK(store == (latent_cache_store *)0x1);
  MUST(latent_cache_store_open(dir, STORE_BLOCK, 1 << 26, 1 << 26, &store));
  size_t stored = 0, n = 0;
  EXPECT(LATENT_CACHE_STATUS_NULL_ARGUMENT, latent_cache_store_put(store, set, 0, NS, sizeof NS, NULL, 3, &stored));
  MUST(latent_cache_store_put(store, set, 0, NS, sizeof NS, tokens, STORE_T, &stored));
  CHECK(stored == 2);
  MUST(latent_cache_store_lookup(store, set, NS, sizeof NS, tokens, STORE_T, &n));
  CHECK(n == 32);
  EXPECT(LATENT_CACHE_STATUS_INVALID_STATE, latent_cache_store_restore(store, set, NS, sizeof NS, tokens, STORE_T, &n));
  latent_cache_set *lent = NULL;
  MUST(latent_cache_set_new(cfg, LAYERS, &lent));
  MUST(latent_cache_store_attach(store, lent, NS, sizeof NS, tokens, STORE_T, 2, &n));
  CHECK(n == 32);
  check_store_rows(lent, 2, 32);
  OK(latent_cache_store_sync(store));
  latent_cache_store_stats stats;
  OK(latent_cache_store_info(store, &stats));
  CHECK(stats.blocks_written == 2 && stats.ram_blocks == 2 && stats.attaches == 1 && stats.write_failures == 0);
  latent_cache_store_free(store);
  latent_cache_store_free(NULL);
  latent_cache_set_free(lent);
  latent_cache_set_free(set);
}

static void store_restore(const char *dir) {
  latent_cache_config cfg[LAYERS];
  configs(cfg);
  latent_cache_set *set = NULL;
  MUST(latent_cache_set_new(cfg, LAYERS, &set));
  uint32_t tokens[STORE_T];
  store_tokens(tokens);
  latent_cache_store *store = NULL;
  MUST(latent_cache_store_open(dir, STORE_BLOCK, 1 << 26, 1 << 26, &store));
  size_t n = 0;
  MUST(latent_cache_store_restore(store, set, NS, sizeof NS, tokens, STORE_T, &n));
  CHECK(n == 32);
  check_store_rows(set, 1, 32);
  tokens[3] ^= 1;
  MUST(latent_cache_store_lookup(store, set, NS, sizeof NS, tokens, STORE_T, &n));
  CHECK(n == 0);
  latent_cache_store_stats stats;
  OK(latent_cache_store_info(store, &stats));
  CHECK(stats.ssd_blocks == 2 && stats.restores == 1 && stats.damaged == 0);
  latent_cache_store_free(store);
  latent_cache_set_free(set);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: test_persist save|load FILE, or store-put|store-restore DIR\n");
    return 2;
  }
  if (!strcmp(argv[1], "save")) save(argv[2]);
  else if (!strcmp(argv[1], "store-put")) store_put(argv[2]);
  else if (!strcmp(argv[1], "store-restore")) store_restore(argv[2]);
  else load(argv[2]);
  if (failures) {
    fprintf(stderr, "test_persist %s: %d failure(s)\n", argv[1], failures);
    return 1;
  }
  printf("test_persist %s: all checks passed\n", argv[1]);
  return 0;
}
