// C++ client test: the RAII header over the whole C ABI, under ASan/UBSan (and LeakSanitizer: every
// array, packed state and cache the wrapper owns is freed). Errors arrive as exceptions with the
// right status, and a rejected call leaves the cache as it was.
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "latent_cache.h"
#include "latent_cache.hpp"

using latent_cache_cpp::Array;
using latent_cache_cpp::Cache;
using latent_cache_cpp::Error;
using latent_cache_cpp::Packed;
using latent_cache_cpp::State;

static int failures = 0;

#include "check.h"
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

  // Queries.
  CHECK(moved.batch_size() == 2 && moved.kv_lora_rank() == 4 && moved.rope_head_dim() == 2 && moved.index_head_dim() == 0);
  CHECK(moved.bytes_per_token() == (4 + 2) * 4);
  CHECK(moved.row_ends() == (std::vector<size_t>{6, 6}));
  CHECK(moved.is_trimmable() && !moved.in_spec_round() && moved.minimum_reusable_offset() == 0);
  CHECK(moved.signature() == "kv:mla:target");
  CHECK(moved.read(LATENT_CACHE_FAMILY_LATENT).size() == 2 * 6 * 4);

  CHECK(moved.converted_positions().empty() && moved.config().hot_window == 0);

  {
    // Composed storage: bf16 hot positions over a Q8 latent, prefill maintenance, the boundary.
    latent_cache_config composed = latent_cache_config_default();
    composed.kv_lora_rank = 64;
    composed.rope_head_dim = 64;
    composed.index_head_dim = 0;
    composed.latent_storage = LATENT_CACHE_STORAGE_Q8;
    composed.rope_storage = LATENT_CACHE_STORAGE_BF16;
    composed.hot_storage = LATENT_CACHE_STORAGE_BF16;
    composed.hot_window = 10;
    Cache c(composed);
    std::vector<float> l(200 * 64, 0.25f), r(200 * 64, -1.0f);
    c.prefill_begin();
    c.append(1, 100, std::vector<float>(l.begin(), l.begin() + 100 * 64), std::vector<float>(r.begin(), r.begin() + 100 * 64));
    c.append(1, 100, std::vector<float>(l.begin(), l.begin() + 100 * 64), std::vector<float>(r.begin(), r.begin() + 100 * 64));
    CHECK(c.converted_positions() == (std::vector<size_t>{128}));
    c.prefill_commit({0});
    c.prefill_end();
    CHECK(c.converted_positions() == (std::vector<size_t>{128}));
    CHECK(c.config().hot_window == 10 && c.config().hot_storage == LATENT_CACHE_STORAGE_BF16);
    try {
      c.prefill_end();
      CHECK(false);
    } catch (const Error &err) {
      CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_STATE);
    }
  }

  // Rows: extract, merge, filter; a uniform rollback.
  Cache single = moved.extract_row(1);
  CHECK(single.row_offsets() == (std::vector<size_t>{6}));
  Cache merged(config);
  merged.merge_rows({&moved, &single});
  CHECK(merged.row_offsets() == (std::vector<size_t>{4, 6, 6}));
  merged.filter_rows({2, 0});
  CHECK(merged.row_offsets() == (std::vector<size_t>{6, 4}));
  // A request joins the running batch in the slot the filter freed, then leaves again.
  merged.reserve_rows(3);
  merged.merge_rows({&single});
  CHECK(merged.row_offsets() == (std::vector<size_t>{6, 4, 6}));
  CHECK(merged.read_row(LATENT_CACHE_FAMILY_LATENT, 2) == single.read_row(LATENT_CACHE_FAMILY_LATENT, 0));
  merged.filter_rows({0, 1});
  merged.shrink_rows();
  CHECK(merged.row_offsets() == (std::vector<size_t>{6, 4}));
  merged.spec_round_begin();
  merged.append(2, 2, std::vector<float>(2 * 2 * 4, 1.0f), std::vector<float>(2 * 2 * 2, 1.0f));
  merged.spec_round_rollback(size_t{1});
  CHECK(merged.row_offsets() == (std::vector<size_t>{7, 5}));
  merged.reserve(64);
  merged.trim(1);
  merged.reset();
  CHECK(merged.batch_size() == 0);

  // A padded prefill: row 0's prompt is 2 long, padded with 1 at its end; row 1 is 3 long.
  merged.prefill_prepare({2, 3}, {}, {1, 0});
  merged.append(2, 3, latent, rope);
  merged.prefill_finalize();
  CHECK(merged.row_offsets() == (std::vector<size_t>{2, 3}));
  CHECK(merged.read_row(LATENT_CACHE_FAMILY_LATENT, 0) == std::vector<float>(latent.begin(), latent.begin() + 8));
  try {
    merged.prefill_prepare({1, 2, 3}, {}, {0});  // vectors of different lengths
    CHECK(false);
  } catch (const Error &err) {
    CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_ARGUMENT);
  }

  // The MLX-array path: arrays own themselves, State and Packed release their views.
  {
    latent_cache_config ragged = config;
    ragged.layout = LATENT_CACHE_LAYOUT_RAGGED;
    Cache c(ragged);
    Array l = Array::from_host(latent, 2, 3, 4), r = Array::from_host(rope, 2, 3, 2);
    State s = c.append_latent_padded({0, 2}, l, r);
    CHECK(!s.latent.empty() && !s.rope.empty() && s.index_keys.empty());
    latent_cache_cpp::eval({&s.latent, &s.rope, &s.index_keys});
    s = State();  // released before the next append
    CHECK(c.row_offsets() == (std::vector<size_t>{3, 1}));
    CHECK(c.left_pad() == (std::vector<size_t>{0, 2}));
    c.spec_round_begin();
    c.append_latent_only(l, r);
    c.spec_round_rollback(std::vector<size_t>{3, 0});
    CHECK(c.row_ends() == (std::vector<size_t>{6, 3}));
    State now = c.state();
    CHECK(!now.latent.empty());
    Packed p = c.packed_state(LATENT_CACHE_FAMILY_LATENT);
    CHECK(p.storage() == LATENT_CACHE_STORAGE_F32 && p.bits() == 32 && p.values().ctx != nullptr);
    Packed moved_packed = std::move(p);
    CHECK(moved_packed.values().ctx != nullptr && p.values().ctx == nullptr);
    try {
      (void)c.stored_index_keys();  // no index keys on this layer
      CHECK(false);
    } catch (const Error &err) {
      CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_ARGUMENT);
    }
    latent_cache_cpp::Donor donor = c.capture_donor_rows();
    CHECK(donor.batch_size() == 2 && donor.row_ends() == (std::vector<size_t>{6, 3}));
    Array q_latent = latent_cache_cpp::array_from_host(std::vector<float>(8, 1.0f), {2, 1, 1, 4});
    Array q_rope = latent_cache_cpp::array_from_host(std::vector<float>(4, 1.0f), {2, 1, 1, 2});
    std::vector<float> attended = latent_cache_cpp::to_host(donor.attend(q_latent, q_rope, 0.5f));
    CHECK(attended.size() == 2 * 4);
    Array handed = Array::from_host(latent, 2, 3, 4);
    mlx_array raw = handed.release();
    CHECK(handed.empty());
    latent_cache_array_free(raw);
  }
  // A model-level set: lent layers, set-wide rounds and rows.
  {
    std::vector<latent_cache_config> glm = latent_cache_cpp::Set::glm52_configs();
    CHECK(glm.size() == 79 && glm[78].role == LATENT_CACHE_ROLE_MTP);
    std::vector<latent_cache_config> small(3, config);
    latent_cache_cpp::Set set(small);
    CHECK(set.layer_count() == 3);
    for (size_t l = 0; l < 3; l++) {
      latent_cache *layer = set.layer(l);
      latent_cache_cpp::check(latent_cache_append_host(layer, 2, 3, latent.data(), latent.size(), rope.data(),
                                                       rope.size(), nullptr, 0));
    }
    set.spec_round_begin();
    set.spec_round_rollback(size_t{0});
    set.reserve(32);
    latent_cache_cpp::Set one = set.extract_row(1);
    latent_cache_cpp::Set both(small);
    both.merge_rows({&set, &one});
    both.reserve_rows(4);
    both.merge_rows({&one});
    size_t joined_rows = 0;
    latent_cache_cpp::check(latent_cache_batch_size(both.layer(2), &joined_rows));
    CHECK(joined_rows == 4);
    size_t reserved_bytes = both.bytes_in_use();
    both.filter_rows({0, 1, 2});
    both.shrink_rows();
    CHECK(both.bytes_in_use() < reserved_bytes);
    both.filter_rows({2, 0});
    both.trim(1);
    CHECK(both.bytes_in_use() > 0);
    latent_cache_cpp::Set copy = latent_cache_cpp::Set::load_from_buffer(both.save_to_buffer());
    CHECK(copy.layer_count() == 3);
    // The seed's file format: one request (rows of one length), its tokens beside it.
    const std::string seed_file = "/tmp/latent-cache-test-cpp-" + std::to_string(getpid()) + ".mlxkv";
    one.save_mlxbun(seed_file, {11, 12, 13});
    latent_cache_cpp::Set reloaded = latent_cache_cpp::Set::load_mlxbun(seed_file);
    CHECK(reloaded.layer_count() == 3);
    CHECK(latent_cache_cpp::Set::mlxbun_tokens(seed_file) == (std::vector<uint32_t>{11, 12, 13}));
    // Its block layout: a manifest in a folder of its own, the blocks beside it.
    const std::string folder = "/tmp/latent-cache-test-cpp-blocks-" + std::to_string(getpid());
    CHECK(mkdir(folder.c_str(), 0700) == 0);
    one.save_mlxbun_blocks(folder + "/m.mlxkv", {11, 12, 13}, 64);
    latent_cache_cpp::Set from_blocks = latent_cache_cpp::Set::load_mlxbun(folder + "/m.mlxkv");
    CHECK(from_blocks.layer_count() == 3);
    CHECK(latent_cache_cpp::Set::mlxbun_tokens(folder + "/m.mlxkv") == (std::vector<uint32_t>{11, 12, 13}));
    CHECK(std::system(("rm -rf '" + folder + "'").c_str()) == 0);
    std::remove(seed_file.c_str());
    try {
      (void)latent_cache_cpp::Set::mlxbun_tokens(seed_file);  // removed
      CHECK(false);
    } catch (const Error &err) {
      CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_ARGUMENT);
    }
    try {
      set.spec_round_rollback(std::vector<size_t>{1, 1});  // no round open
      CHECK(false);
    } catch (const Error &err) {
      CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_STATE);
    }
    set.reset();
  }
  // The prefix store: a put, a lookup, a restore into an empty set, and a refusal.
  {
    std::vector<latent_cache_config> one(2, config);
    latent_cache_cpp::Set from(one), into(one);
    std::vector<float> l4(4 * 4), r4(4 * 2);
    for (size_t i = 0; i < l4.size(); i++) l4[i] = static_cast<float>(i);
    for (size_t l = 0; l < 2; l++)
      latent_cache_cpp::check(
          latent_cache_append_host(from.layer(l), 1, 4, l4.data(), l4.size(), r4.data(), r4.size(), nullptr, 0));
    latent_cache_cpp::Store store({"", 2, 1 << 20, 0});
    const std::vector<uint32_t> tokens{5, 6, 7, 8, 9};
    CHECK(store.put(from, 0, "ns", tokens) == 2);
    CHECK(store.lookup(from, "ns", tokens) == 4 && store.lookup(from, "other", tokens) == 0);
    CHECK(store.restore(into, "ns", tokens) == 4);
    std::vector<float> back(l4.size());
    size_t written = 0;
    latent_cache_cpp::check(latent_cache_read_row_host(into.layer(1), 0, 0, back.data(), back.size(), &written));
    CHECK(written == l4.size() && back == l4);
    try {
      (void)store.restore(into, "ns", tokens);  // the set is no longer empty
      CHECK(false);
    } catch (const Error &err) {
      CHECK(err.status() == LATENT_CACHE_STATUS_INVALID_STATE);
    }
    CHECK(store.stats().restores == 1);
  }
  CHECK(std::string(latent_cache_cpp::version()) == LATENT_CACHE_VERSION);
  if (failures) {
    std::fprintf(stderr, "test_cpp: %d failure(s)\n", failures);
    return 1;
  }
  std::printf("test_cpp: all checks passed\n");
  return 0;
}
