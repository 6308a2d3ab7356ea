// An engine on MLX's C++ API alone, with no mlx-c in the program (as C++ engines on `mlx::core`
// are): it links MLX's libmlx itself and the library built with MLX=host, whose mlx-c is its
// own and private. Its `mlx::core::array`s go into the cache as `mlx_array{ &array }` (mlx-c's
// handle is a pointer to an `mlx::core::array`, whatever mlx-c version declares it), and the
// arrays the cache returns are taken back as `mlx::core::array`s, evaluated on the program's
// own stream and computed on with MLX's C++ API. The values come from a random seed (printed;
// pass it after the label to repeat a run) and are checked against what was appended.
//   host-core-shared|host-core-static LABEL [SEED]
#include <mlx/mlx.h>

#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "checks.h"

namespace mx = mlx::core;

// An array the library handed out, taken over as the program's own: the handle's array is
// copied (an `mlx::core::array` is a shared reference) and the handle freed.
static mx::array take(mlx_array handle) {
  mx::array out = *static_cast<mx::array *>(handle.ctx);
  latent_cache_array_free(handle);
  return out;
}

// `view` ([batch, T, width], any strides) against the appends it holds, times `scale`: row b's
// positions are chunk 0's row b, then chunk 1's (each [batch, n, width], row-major).
static void check_view(const mx::array &view, const char *family, int batch, int width,
                       const std::vector<const std::vector<float> *> &chunks, const std::vector<int> &tokens,
                       float scale, const mx::Stream &stream) {
  const int total = tokens[0] + tokens[1];
  CHECK(view.ndim() == 3 && view.shape(0) == batch && view.shape(1) == total && view.shape(2) == width);
  CHECK(view.dtype() == mx::float32);
  if (failures != 0) return;
  mx::array dense = mx::contiguous(view, false, stream);
  mx::eval(dense);
  check_values(dense.data<float>(), family, batch, width, chunks, tokens, scale);
}

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "host_core";
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : std::random_device{}();
  std::printf("%s: seed %u\n", label, seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_int_distribution<int> extent(1, 5);
  // The program's own stream, on the device MLX chose for it.
  mx::Stream stream = mx::new_stream(mx::default_device());

  const Layer layer = random_layer(rng);
  if (layer.cache == nullptr) return 1;
  latent_cache *cache = layer.cache;
  const int batch = layer.batch;
  const int *widths = layer.widths;

  // Two appends (a prefill chunk, then a decode step) of the program's own arrays, borrowed by
  // the call as `mlx_array{ &array }`.
  std::vector<int> tokens = {extent(rng) + 3, 1};
  std::vector<std::vector<float>> values[3];
  for (int step = 0; step < 2; step++) {
    std::vector<mx::array> in;
    for (int f = 0; f < 3; f++) {
      std::vector<float> v(static_cast<size_t>(batch) * tokens[step] * widths[f]);
      for (float &x : v) x = value(rng);
      values[f].push_back(v);
      in.emplace_back(v.begin(), mx::Shape{batch, tokens[step], widths[f]}, mx::float32);
    }
    mlx_array handles[3] = {{&in[0]}, {&in[1]}, {&in[2]}};
    mlx_array out[3] = {{nullptr}, {nullptr}, {nullptr}};
    if (ok(latent_cache_append_latent(cache, handles[0], handles[1], handles[2], &out[0], &out[1], &out[2]),
           "append_latent")) {
      // The append's views, taken and dropped before the next append (so it writes in place).
      for (mlx_array h : out) take(h);
    }
  }

  mlx_array state[3] = {{nullptr}, {nullptr}, {nullptr}};
  if (ok(latent_cache_state(cache, &state[0], &state[1], &state[2]), "state")) {
    const char *names[3] = {"latent", "rope", "index_keys"};
    std::vector<mx::array> views;
    for (int f = 0; f < 3; f++) views.push_back(take(state[f]));
    for (int f = 0; f < 3; f++) {
      std::vector<const std::vector<float> *> chunks = {&values[f][0], &values[f][1]};
      check_view(views[f], names[f], batch, widths[f], chunks, tokens, 1.0f, stream);
    }
    // A graph of the program's own over the library's view, on its own stream.
    mx::array doubled = mx::multiply(views[0], mx::array(2.0f), stream);
    std::vector<const std::vector<float> *> chunks = {&values[0][0], &values[0][1]};
    check_view(doubled, "2 * latent", batch, widths[0], chunks, tokens, 2.0f, stream);
  }
  // (The program evaluates its own graphs itself: MLX's streams are per thread, and the
  // library evaluates on a thread of its own, which does not know the program's streams.)
  latent_cache_free(cache);

  if (failures != 0) {
    std::fprintf(stderr, "%s: %d check(s) failed (seed %u)\n", label, failures, seed);
    return 1;
  }
  std::printf("%s: ok (batch %d, widths %d/%d/%d), no mlx-c in the program\n", label, batch, widths[0], widths[1],
              widths[2]);
  return 0;
}
