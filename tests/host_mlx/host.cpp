// An engine that brings its own MLX and its own mlx-c: this program compiles mlx-c itself (from
// the same source as the library's, built apart) and links MLX's libmlx itself, beside the
// library built with MLX=host, whose mlx-c is its own and private (no mlx_* symbol of either
// meets the other's). Arrays made with the program's mlx-c go into the cache as they are, and
// the views the cache returns are read, and computed on, with the program's mlx-c: one MLX
// runtime in the process. The values come from a random seed
// (printed; pass it after the label to repeat a run) and are checked against what was appended.
// The program may carry another version of mlx-c than the library's (built with
// -DENGINE_MLXC_0_6 for mlx-c 0.6.0, whose io callbacks return nothing where 0.7.0's return
// counts): it saves and loads an array through its own io beside the library's save and load
// through the library's, so a function of one mlx-c called with the other's arguments fails here.
//   host-shared|host-static LABEL [SEED]
#include <mlx/c/mlx.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "checks.h"

// An array of the program's own mlx-c: float32 [batch, tokens, width].
static mlx_array host_array(const std::vector<float> &values, int batch, int tokens, int width) {
  const int shape[3] = {batch, tokens, width};
  return mlx_array_new_data(values.data(), shape, 3, MLX_FLOAT32);
}

// Checks a [batch, T, width] view against the appends it holds: row b's positions are the
// first append's row b, then the second's (each chunk [batch, n, width], row-major).
static void check_view(mlx_array view, const char *family, int batch, int width,
                       const std::vector<const std::vector<float> *> &chunks,
                       const std::vector<int> &chunk_tokens, float scale) {
  int total = 0;
  for (int n : chunk_tokens) total += n;
  CHECK(view.ctx != nullptr);
  if (view.ctx == nullptr) return;
  CHECK(mlx_array_ndim(view) == 3);
  CHECK(mlx_array_dim(view, 0) == batch && mlx_array_dim(view, 1) == total && mlx_array_dim(view, 2) == width);
  CHECK(mlx_array_dtype(view) == MLX_FLOAT32);
  if (failures != 0) return;
  // Evaluated by the program's mlx-c (single-threaded here: nothing else evaluates meanwhile).
  CHECK(mlx_array_eval(view) == 0);
  // Views may be strided windows of a larger buffer; a contiguous copy reads row-major.
  mlx_stream stream = mlx_default_cpu_stream_new();
  mlx_array dense = mlx_array_new();
  CHECK(mlx_contiguous(&dense, view, false, stream) == 0);
  CHECK(mlx_array_eval(dense) == 0);
  const float *data = mlx_array_data_float32(dense);
  CHECK(data != nullptr);
  check_values(data, family, batch, width, chunks, chunk_tokens, scale);
  mlx_array_free(dense);
  mlx_stream_free(stream);
}

// Bytes in memory behind the program's own mlx-c io: its vtable as that version declares it.
struct Memory {
  std::vector<char> bytes;
  size_t pos = 0;
};
#ifdef ENGINE_MLXC_0_6
using SeekResult = void;
using CountResult = void;
#define IO_RETURN(value) return
#else
using SeekResult = int;
using CountResult = size_t;
#define IO_RETURN(value) return value
#endif
static Memory &memory(void *desc) { return *static_cast<Memory *>(desc); }
static bool io_is_open(void *) { return true; }
static bool io_good(void *desc) { return memory(desc).pos <= memory(desc).bytes.size(); }
static size_t io_tell(void *desc) { return memory(desc).pos; }
static SeekResult io_seek(void *desc, int64_t off, int whence) {
  Memory &m = memory(desc);
  const int64_t base = whence == SEEK_CUR ? static_cast<int64_t>(m.pos)
                       : whence == SEEK_END ? static_cast<int64_t>(m.bytes.size())
                                            : 0;
  m.pos = static_cast<size_t>(base + off);
  IO_RETURN(0);
}
static CountResult io_read_at(void *desc, char *out, size_t n, size_t off) {
  Memory &m = memory(desc);
  const size_t k = off < m.bytes.size() ? std::min(n, m.bytes.size() - off) : 0;
  std::copy(m.bytes.begin() + static_cast<std::ptrdiff_t>(off), m.bytes.begin() + static_cast<std::ptrdiff_t>(off + k), out);
  IO_RETURN(k);
}
static CountResult io_read(void *desc, char *out, size_t n) {
  Memory &m = memory(desc);
  const size_t k = m.pos < m.bytes.size() ? std::min(n, m.bytes.size() - m.pos) : 0;
  io_read_at(desc, out, k, m.pos);
  m.pos += k;
  IO_RETURN(k);
}
static CountResult io_write(void *desc, const char *data, size_t n) {
  Memory &m = memory(desc);
  if (m.bytes.size() < m.pos + n) m.bytes.resize(m.pos + n);
  std::copy(data, data + n, m.bytes.begin() + static_cast<std::ptrdiff_t>(m.pos));
  m.pos += n;
  IO_RETURN(n);
}
static const char *io_label(void *) { return "the engine's memory"; }
static void io_free(void *) {}  // the Memory is the program's, on its stack
static const mlx_io_vtable ENGINE_IO = {io_is_open, io_good, io_tell, io_seek, io_read, io_read_at, io_write, io_label, io_free};

// `view` saved through the program's own mlx-c io into memory and loaded back through it.
static mlx_array engine_round_trip(mlx_array view, Memory &m) {
  mlx_io_writer writer = mlx_io_writer_new(&m, ENGINE_IO);
  CHECK(mlx_save_writer(writer, view) == 0);
  mlx_io_writer_free(writer);
  CHECK(!m.bytes.empty());
  m.pos = 0;
  mlx_io_reader reader = mlx_io_reader_new(&m, ENGINE_IO);
  mlx_stream stream = mlx_default_cpu_stream_new();
  mlx_array loaded = mlx_array_new();
  CHECK(mlx_load_reader(&loaded, reader, stream) == 0);
  mlx_io_reader_free(reader);
  mlx_stream_free(stream);
  return loaded;
}

int main(int argc, char **argv) {
  const char *label = argc > 1 ? argv[1] : "host_mlx";
  const unsigned seed = argc > 2 ? static_cast<unsigned>(std::strtoul(argv[2], nullptr, 10)) : std::random_device{}();
  std::printf("%s: seed %u\n", label, seed);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-4.0f, 4.0f);
  std::uniform_int_distribution<int> extent(1, 5);

  const Layer layer = random_layer(rng);
  if (layer.cache == nullptr) return 1;
  latent_cache *cache = layer.cache;
  const int batch = layer.batch;
  const int *widths = layer.widths;

  // Two appends (a prefill chunk, then a decode step), each from arrays of the program's mlx-c.
  std::vector<int> chunk_tokens = {extent(rng) + 3, 1};
  std::vector<std::vector<float>> values[3];
  for (int step = 0; step < 2; step++) {
    mlx_array in[3];
    for (int f = 0; f < 3; f++) {
      std::vector<float> v(static_cast<size_t>(batch) * chunk_tokens[step] * widths[f]);
      for (float &x : v) x = value(rng);
      values[f].push_back(v);
      in[f] = host_array(values[f].back(), batch, chunk_tokens[step], widths[f]);
    }
    mlx_array out[3] = {{nullptr}, {nullptr}, {nullptr}};
    ok(latent_cache_append_latent(cache, in[0], in[1], in[2], &out[0], &out[1], &out[2]), "append_latent");
    // The append's views are released before the next append (so it writes in place); the
    // program frees them, and its inputs, with its own mlx-c.
    for (int f = 0; f < 3; f++) {
      mlx_array_free(out[f]);
      mlx_array_free(in[f]);
    }
  }
  size_t offset = 0;
  ok(latent_cache_offset(cache, &offset), "offset");
  CHECK(offset == static_cast<size_t>(chunk_tokens[0] + chunk_tokens[1]));

  mlx_array state[3] = {{nullptr}, {nullptr}, {nullptr}};
  if (ok(latent_cache_state(cache, &state[0], &state[1], &state[2]), "state")) {
    const char *names[3] = {"latent", "rope", "index_keys"};
    for (int f = 0; f < 3; f++) {
      std::vector<const std::vector<float> *> chunks = {&values[f][0], &values[f][1]};
      check_view(state[f], names[f], batch, widths[f], chunks, chunk_tokens, 1.0f);
    }
    // A graph of the program's mlx-c over the library's view: latent * 2, read back.
    mlx_stream stream = mlx_default_cpu_stream_new();
    mlx_array two = mlx_array_new_float(2.0f);
    mlx_array doubled = mlx_array_new();
    CHECK(mlx_multiply(&doubled, state[0], two, stream) == 0);
    std::vector<const std::vector<float> *> chunks = {&values[0][0], &values[0][1]};
    check_view(doubled, "2 * latent", batch, widths[0], chunks, chunk_tokens, 2.0f);
    mlx_array_free(doubled);
    mlx_array_free(two);
    mlx_stream_free(stream);
    // The engine's io (its mlx-c) on the latent view, then the library's save and load (its
    // own mlx-c's io) of the same cache, read back through the program's mlx-c again.
    Memory m;
    mlx_array loaded = engine_round_trip(state[0], m);
    check_view(loaded, "latent through the engine's io", batch, widths[0], chunks, chunk_tokens, 1.0f);
    mlx_array_free(loaded);
    uint8_t *bytes = nullptr;
    size_t len = 0;
    latent_cache *copy = nullptr;
    if (ok(latent_cache_save_to_buffer(cache, &bytes, &len), "save_to_buffer") &&
        ok(latent_cache_load_from_buffer(bytes, len, &copy), "load_from_buffer")) {
      mlx_array again[3] = {{nullptr}, {nullptr}, {nullptr}};
      if (ok(latent_cache_state(copy, &again[0], &again[1], &again[2]), "state of the loaded cache")) {
        check_view(again[0], "latent saved and loaded by the library", batch, widths[0], chunks, chunk_tokens, 1.0f);
        for (mlx_array a : again) mlx_array_free(a);
      }
    }
    latent_cache_free(copy);
    latent_cache_bytes_free(bytes, len);
    for (mlx_array a : state) mlx_array_free(a);
  }
  latent_cache_free(cache);

  if (failures != 0) {
    std::fprintf(stderr, "%s: %d check(s) failed (seed %u)\n", label, failures, seed);
    return 1;
  }
  std::printf("%s: ok (batch %d, %zu positions, widths %d/%d/%d)\n", label, batch, offset, widths[0], widths[1],
              widths[2]);
  return 0;
}
