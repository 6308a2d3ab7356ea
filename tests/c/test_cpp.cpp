// C++ client test: the RAII header over the C ABI, under ASan/UBSan. Errors arrive as
// exceptions with the right status, and a rejected call leaves the cache as it was.
#include <cstdio>
#include <vector>

#include "latent_cache.h"
#include "latent_cache.hpp"

using latent_cache_cpp::Cache;
using latent_cache_cpp::Error;

static int failures = 0;
#define CHECK(cond)                                                                 \
  do {                                                                              \
    if (!(cond)) {                                                                  \
      std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
      failures++;                                                                   \
    }                                                                               \
  } while (0)

int main() {
  latent_cache_config config = latent_cache_config_default();
  config.kv_lora_rank = 4;
  config.rope_head_dim = 2;
  config.index_head_dim = 0;
  Cache cache(config);
  std::vector<float> latent(2 * 3 * 4), rope(2 * 3 * 2);
  for (size_t i = 0; i < latent.size(); i++) latent[i] = static_cast<float>(i);
  for (size_t i = 0; i < rope.size(); i++) rope[i] = -static_cast<float>(i);
  cache.append(2, 3, latent, rope);
  CHECK(cache.offset() == 3);
  std::vector<float> row1 = cache.read_row(LATENT_CACHE_FAMILY_LATENT, 1);
  CHECK(row1 == std::vector<float>(latent.begin() + 12, latent.end()));

  try {
    cache.append(2, 1, latent, rope);  // lengths disagree with 2 x 1 x width
    CHECK(false);
  } catch (const Error &err) {
    CHECK(err.status() == LATENT_CACHE_STATUS_SHAPE);
    CHECK(std::string(err.what()).rfind("SHAPE: ", 0) == 0);  // the status name, then the message
    CHECK(std::string(err.what()).size() > 7);
  }
  CHECK(cache.offset() == 3);

  cache.spec_round_begin();
  cache.append(2, 3, latent, rope);
  cache.spec_round_rollback({1, 3});
  CHECK(cache.row_offsets() == (std::vector<size_t>{4, 6}));
  CHECK(cache.left_pad() == (std::vector<size_t>{2, 0}));
  std::vector<float> row0 = cache.read_row(LATENT_CACHE_FAMILY_ROPE, 0);
  std::vector<float> want(rope.begin(), rope.begin() + 6);
  want.insert(want.end(), rope.begin(), rope.begin() + 2);
  CHECK(row0 == want);

  Cache moved = std::move(cache);
  CHECK(moved.offset() == 6);
  if (failures) {
    std::fprintf(stderr, "test_cpp: %d failure(s)\n", failures);
    return 1;
  }
  std::printf("test_cpp: all checks passed\n");
  return 0;
}
