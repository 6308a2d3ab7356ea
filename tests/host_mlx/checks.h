// checks.h: what the engines of tests/host_mlx share: the failure count, CHECK, a status check
// that prints the library's message, a small random DSA layer, and the comparison of a
// [batch, T, width] row-major read of the stored values with the appends that made them.
#pragma once

#include <cstddef>
#include <cstdio>
#include <random>
#include <vector>

#include "latent_cache.h"

static int failures = 0;

#define CHECK(cond)                                                           \
  do {                                                                        \
    if (!(cond)) {                                                            \
      std::fprintf(stderr, "%s:%d: failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                             \
    }                                                                         \
  } while (0)

static bool ok(latent_cache_status status, const char *what) {
  if (status == LATENT_CACHE_STATUS_OK) return true;
  char message[512];
  latent_cache_last_error(message, sizeof message);
  std::fprintf(stderr, "%s: %s: %s\n", what, latent_cache_status_name(status), message);
  failures++;
  return false;
}

// `data` ([batch, T, width] row-major, T the chunks' tokens together) against the appends, times
// `scale`: row b's positions are chunk 0's row b, then chunk 1's (each [batch, n, width]).
static void check_values(const float *data, const char *family, int batch, int width,
                         const std::vector<const std::vector<float> *> &chunks, const std::vector<int> &tokens,
                         float scale) {
  int total = 0;
  for (int n : tokens) total += n;
  size_t mismatches = 0, checked = 0;
  for (int b = 0; data != nullptr && b < batch; b++) {
    int t = 0;
    for (size_t c = 0; c < chunks.size(); c++) {
      for (int i = 0; i < tokens[c]; i++, t++) {
        for (int w = 0; w < width; w++) {
          float want = scale * (*chunks[c])[(static_cast<size_t>(b) * tokens[c] + i) * width + w];
          float got = data[(static_cast<size_t>(b) * total + t) * width + w];
          checked++;
          if (got != want && mismatches++ < 5)
            std::fprintf(stderr, "%s[%d, %d, %d] = %g, expected %g\n", family, b, t, w, got, want);
        }
      }
    }
  }
  CHECK(mismatches == 0);
  CHECK(checked == static_cast<size_t>(batch) * total * width);
}

// A small DSA layer of random widths, every family in float32 (so the views must equal the
// input exactly), and a random batch; `cache` is null (and a failure counted) if it is refused.
struct Layer {
  latent_cache *cache = nullptr;
  int batch = 0;
  int widths[3] = {0, 0, 0};
};

static Layer random_layer(std::mt19937 &rng) {
  std::uniform_int_distribution<int> extent(1, 5);
  latent_cache_config config = latent_cache_config_default();
  config.kv_lora_rank = static_cast<size_t>(8 * extent(rng));
  config.rope_head_dim = static_cast<size_t>(2 * extent(rng));
  config.index_head_dim = static_cast<size_t>(4 * extent(rng));
  Layer layer;
  layer.batch = extent(rng);
  layer.widths[0] = static_cast<int>(config.kv_lora_rank);
  layer.widths[1] = static_cast<int>(config.rope_head_dim);
  layer.widths[2] = static_cast<int>(config.index_head_dim);
  ok(latent_cache_new(&config, &layer.cache), "latent_cache_new");
  return layer;
}
