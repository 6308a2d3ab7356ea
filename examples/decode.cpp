// A C++ engine loop over latent_cache.hpp: a few MLA layers (one with DSA index keys) in the
// ragged layout, a padded batched prefill of two prompts, decode steps with one evaluation per
// step, and speculative rounds where the rows keep different counts. Every stored value is
// checked at the end. Errors are exceptions (latent_cache_cpp::Error); nothing is freed by hand.
//
// Usage: decode [--steps N]
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "latent_cache.hpp"

using latent_cache_cpp::Array;
using latent_cache_cpp::Cache;
using latent_cache_cpp::State;

namespace {

constexpr size_t kRank = 512, kRope = 64, kIndex = 128, kLayers = 4, kRows = 2;

// What the model "projects" for (layer, row, position, family, channel): exact in float32.
float value_at(size_t layer, size_t row, size_t pos, size_t family, size_t ch) {
  return static_cast<float>((layer * 7 + row * 131 + pos * 17 + family * 3 + ch) % 1024) / 8.0f;
}

size_t width(size_t family) { return family == 0 ? kRank : family == 1 ? kRope : kIndex; }

// Inputs for `tokens` new positions per row: row r's first pad[r] of them are padding, the
// rest its positions pos[r], pos[r] + 1, ...
Array inputs(size_t layer, size_t family, const std::vector<size_t> &pos, const std::vector<size_t> &pad,
             size_t tokens) {
  std::vector<float> data(kRows * tokens * width(family), 0.0f);
  for (size_t r = 0; r < kRows; r++)
    for (size_t t = pad[r]; t < tokens; t++)
      for (size_t ch = 0; ch < width(family); ch++)
        data[(r * tokens + t) * width(family) + ch] = value_at(layer, r, pos[r] + t - pad[r], family, ch);
  return Array::from_host(data, kRows, tokens, width(family));
}

// One forward: every layer appends, the views are evaluated once, then released.
void forward(std::vector<Cache> &layers, const std::vector<size_t> &pos, const std::vector<size_t> &pad,
             size_t tokens, bool first) {
  std::vector<State> views;
  for (size_t l = 0; l < layers.size(); l++) {
    Array latent = inputs(l, 0, pos, pad, tokens), rope = inputs(l, 1, pos, pad, tokens);
    Array keys = l == 0 ? inputs(l, 2, pos, pad, tokens) : Array();
    views.push_back(first ? layers[l].append_latent_padded(pad, latent, rope, keys)
                          : layers[l].append_latent(latent, rope, keys));
  }
  std::vector<const Array *> outputs;
  for (const State &s : views) outputs.insert(outputs.end(), {&s.latent, &s.rope, &s.index_keys});
  latent_cache_cpp::eval(outputs);
}

}  // namespace

int main(int argc, char **argv) {
  size_t steps = 16;
  if (argc == 3 && !std::strcmp(argv[1], "--steps")) steps = static_cast<size_t>(std::atoi(argv[2]));
  try {
    std::vector<Cache> layers;
    for (size_t l = 0; l < kLayers; l++) {
      latent_cache_config config = latent_cache_config_default();
      config.index_head_dim = l == 0 ? kIndex : 0;
      config.layout = LATENT_CACHE_LAYOUT_RAGGED;
      layers.emplace_back(config);
      layers.back().reserve(256);
    }
    // Prompts of 24 and 10 positions in one padded forward.
    std::vector<size_t> pos = {0, 0}, pad = {0, 14}, none = {0, 0};
    forward(layers, pos, pad, 24, true);
    pos = {24, 10};
    for (size_t s = 0; s < steps; s++) {
      forward(layers, pos, none, 1, false);
      for (size_t &p : pos) p++;
    }
    // Speculative rounds: 3 drafts per row, the rows keep different counts.
    for (size_t round = 0; round < 4; round++) {
      for (Cache &c : layers) c.spec_round_begin();
      forward(layers, pos, none, 3, false);
      std::vector<size_t> keep = {round % 4, (round + 1) % 3};
      for (Cache &c : layers) c.spec_round_rollback(keep);
      for (size_t r = 0; r < kRows; r++) pos[r] += keep[r];
    }
    size_t checked = 0;
    for (size_t l = 0; l < kLayers; l++) {
      std::vector<size_t> rows = layers[l].row_offsets();
      for (size_t r = 0; r < kRows; r++) {
        if (rows[r] != pos[r]) {
          std::fprintf(stderr, "layer %zu row %zu holds %zu positions, expected %zu\n", l, r, rows[r], pos[r]);
          return 1;
        }
        for (size_t f = 0; f < (l == 0 ? 3u : 2u); f++) {
          std::vector<float> got = layers[l].read_row(static_cast<latent_cache_family>(f), r);
          for (size_t t = 0; t < pos[r]; t++)
            for (size_t ch = 0; ch < width(f); ch++)
              if (got[t * width(f) + ch] != value_at(l, r, t, f, ch)) {
                std::fprintf(stderr, "MISMATCH layer %zu row %zu family %zu position %zu\n", l, r, f, t);
                return 1;
              }
          checked += got.size();
        }
      }
    }
    std::vector<size_t> ends = layers[0].row_ends();
    std::printf("decode.cpp: %zu layers, rows of %zu and %zu positions (ends %zu, %zu), %zu values checked\n", kLayers,
                pos[0], pos[1], ends[0], ends[1], checked);
  } catch (const latent_cache_cpp::Error &err) {
    std::fprintf(stderr, "latent-cache: %s\n", err.what());
    return 1;
  }
  return 0;
}
