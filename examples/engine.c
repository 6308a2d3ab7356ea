/* An engine loop shaped like GLM-5.2 driving one latent cache per layer through the C ABI:
 * 78 layers (DSA index keys on 21 of them), a chunked prefill, decode steps with one MLX
 * evaluation per step, speculative rounds where rows of prompts of different lengths accept
 * different counts (ragged layout: a round costs what it appended), and a batch whose rows join
 * and finish at different times; then composed storage (8-bit history, the newest positions
 * exact). Decode runs one step at a time, then pipelined as MLX engines run it (step n + 1 built and
 * handed to MLX with latent_cache_eval_async before the wait for step n). It prints positions,
 * bytes, time per step, and checks what it reads back.
 *
 * Usage: engine [--layers N] [--dsa N] [--prefill N] [--chunk N] [--decode N] */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "latent_cache.h"

enum { RANK = 512, ROPE = 64, INDEX = 128, MAX_ROWS = 8 };

typedef struct {
  latent_cache *cache;
  int dsa;
} layer;

static int n_layers = 78, n_dsa = 21, prefill = 4096, chunk = 512, decode = 256;

static void die(const char *what, latent_cache_status status) {
  char message[512];
  latent_cache_last_error(message, sizeof message);
  fprintf(stderr, "%s failed (status %d): %s\n", what, (int)status, message);
  exit(1);
}
#define TRY(call)                                  \
  do {                                             \
    latent_cache_status s_ = (call);               \
    if (s_ != LATENT_CACHE_STATUS_OK) die(#call, s_); \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* What the model "projects" for (layer, request, position, family, channel): deterministic, so
 * any stored value can be checked without keeping a copy. Small integers over 64: exact in f32. */
static float value_at(int l, int request, size_t pos, int family, size_t ch) {
  unsigned h = (unsigned)l * 2654435761u ^ (unsigned)request * 40503u ^ (unsigned)pos * 97u ^ (unsigned)family * 131u;
  return (float)((h + (unsigned)ch * 7u) % 2001u) / 64.0f - 15.0f;
}

static size_t width(int family) { return family == 0 ? RANK : family == 1 ? ROPE : INDEX; }

/* Builds one layer's input arrays for `rows` rows: row b's `tokens` new positions start at
 * pos[b] of request req[b], after pad[b] padding positions (pad NULL: none). */
static void build_inputs(int l, int dsa, int rows, const int *req, const size_t *pos, const size_t *pad, size_t tokens,
                         mlx_array out[3]) {
  static float *buf = NULL;
  static size_t cap = 0;
  for (int f = 0; f < 3; f++) {
    out[f].ctx = NULL;
    if (f == 2 && !dsa) continue;
    size_t n = (size_t)rows * tokens * width(f);
    if (n > cap) {
      buf = realloc(buf, n * sizeof(float));
      cap = n;
    }
    for (int b = 0; b < rows; b++) {
      size_t skip = pad ? pad[b] : 0;
      for (size_t t = 0; t < tokens; t++)
        for (size_t ch = 0; ch < width(f); ch++)
          buf[((size_t)b * tokens + t) * width(f) + ch] = t < skip ? 0.0f : value_at(l, req[b], pos[b] + t - skip, f, ch);
    }
    TRY(latent_cache_array_from_host(buf, n, (size_t)rows, tokens, width(f), &out[f]));
  }
}

/* One forward over every layer: on DSA layers read the index keys stored so far (a real engine
 * scores them), append, keep the views; then ONE evaluation of everything; release the views.
 * With `pad` (a padded batch's first forward) row b's first pad[b] positions are padding. */
static double forward(layer *layers, mlx_array (*inputs)[3], const size_t *pad, size_t rows) {
  mlx_array *outputs = malloc(sizeof(mlx_array) * (size_t)n_layers * 4);
  size_t n_out = 0;
  double start = now_ms();
  for (int l = 0; l < n_layers; l++) {
    if (layers[l].dsa) TRY(latent_cache_stored_index_keys(layers[l].cache, &outputs[n_out++]));
    /* Keep the latent and RoPE views for attention. On DSA layers the stored keys read above
     * are what selection needs; asking for the append's index-key view too (and evaluating it
     * with them) would make MLX copy the layer's index keys every step. */
    if (pad)
      TRY(latent_cache_append_latent_padded(layers[l].cache, pad, rows, inputs[l][0], inputs[l][1], inputs[l][2],
                                            &outputs[n_out], &outputs[n_out + 1], NULL));
    else
      TRY(latent_cache_append_latent(layers[l].cache, inputs[l][0], inputs[l][1], inputs[l][2], &outputs[n_out],
                                     &outputs[n_out + 1], NULL));
    n_out += 2;
  }
  TRY(latent_cache_eval(outputs, n_out));
  for (size_t i = 0; i < n_out; i++) latent_cache_array_free(outputs[i]);
  double elapsed = now_ms() - start;
  for (int l = 0; l < n_layers; l++)
    for (int f = 0; f < 3; f++) latent_cache_array_free(inputs[l][f]);
  free(outputs);
  return elapsed;
}

static double padded_step(layer *layers, int rows, const int *req, const size_t *pos, const size_t *pad, size_t tokens) {
  mlx_array (*inputs)[3] = malloc(sizeof(*inputs) * (size_t)n_layers);
  for (int l = 0; l < n_layers; l++) build_inputs(l, layers[l].dsa, rows, req, pos, pad, tokens, inputs[l]);
  double ms = forward(layers, inputs, pad, (size_t)rows);
  free(inputs);
  return ms;
}

static double step(layer *layers, int rows, const int *req, const size_t *pos, size_t tokens) {
  return padded_step(layers, rows, req, pos, NULL, tokens);
}

/* One pipelined decode step: every layer appends its position (no views: nothing here keeps the
 * buffers) and attends over its rows through a donor, freed at once (the graph holds what it
 * reads); the step's attention outputs are handed to MLX, then the previous step's are waited
 * for and freed. Appends into a layer the previous step still reads wait inside the append for
 * those reads, so they write in place. Returns the milliseconds since the previous step's
 * completion was seen. */
static mlx_array q_latent, q_rope, none;
static double pipelined_step(layer *layers, int req, size_t pos, mlx_array **prev, double *last) {
  mlx_array *outs = malloc(sizeof(mlx_array) * (size_t)n_layers);
  for (int l = 0; l < n_layers; l++) {
    mlx_array in[3];
    build_inputs(l, layers[l].dsa, 1, &req, &pos, NULL, 1, in);
    TRY(latent_cache_append_latent(layers[l].cache, in[0], in[1], in[2], NULL, NULL, NULL));
    for (int f = 0; f < 3; f++) latent_cache_array_free(in[f]);
    latent_cache_donor *donor = NULL;
    TRY(latent_cache_capture_donor_rows(layers[l].cache, &donor));
    TRY(latent_cache_donor_attend(donor, q_latent, q_rope, 0.05f, LATENT_CACHE_MASK_NONE, none, &outs[l]));
    latent_cache_donor_free(donor);
  }
  TRY(latent_cache_eval_async(outs, (size_t)n_layers));
  double ms = 0;
  if (*prev) {
    TRY(latent_cache_eval(*prev, (size_t)n_layers)); /* waits for step n */
    for (int l = 0; l < n_layers; l++) latent_cache_array_free((*prev)[l]);
    free(*prev);
    double t = now_ms();
    ms = t - *last;
    *last = t;
  }
  *prev = outs;
  return ms;
}

static layer *new_layers_with(uint32_t layout) {
  layer *layers = calloc((size_t)n_layers, sizeof(layer));
  for (int l = 0; l < n_layers; l++) {
    latent_cache_config cfg = latent_cache_config_default();
    cfg.layout = layout;
    /* Spread the DSA layers evenly over the stack. */
    layers[l].dsa = n_dsa > 0 && (l * n_dsa) / n_layers != ((l + 1) * n_dsa) / n_layers;
    cfg.index_head_dim = layers[l].dsa ? INDEX : 0;
    TRY(latent_cache_new(&cfg, &layers[l].cache));
  }
  return layers;
}

static layer *new_layers(void) { return new_layers_with(LATENT_CACHE_LAYOUT_RIGHT_JUSTIFIED); }

/* The MTP layer's append for the same positions (values of "layer" n_layers), evaluated. */
static void step_mtp(layer *mtp, int req, size_t pos, size_t tokens) {
  mlx_array in[3];
  build_inputs(n_layers, 0, 1, &req, &pos, NULL, tokens, in);
  mlx_array out[2] = {{NULL}, {NULL}};
  TRY(latent_cache_append_latent(mtp->cache, in[0], in[1], in[2], &out[0], &out[1], NULL));
  TRY(latent_cache_eval(out, 2));
  for (int i = 0; i < 2; i++) latent_cache_array_free(out[i]);
  for (int f = 0; f < 3; f++) latent_cache_array_free(in[f]);
}

static void free_layers(layer *layers) {
  for (int l = 0; l < n_layers; l++) latent_cache_free(layers[l].cache);
  free(layers);
}

static size_t rows_of(const latent_cache *c, size_t *row_offsets) {
  size_t written = 0;
  TRY(latent_cache_row_offsets(c, row_offsets, MAX_ROWS, &written));
  return written;
}

/* Reads row `row` of layer l back and compares every value with request `req`'s positions
 * [0, len). Returns the number of values checked; exits on a mismatch. */
static size_t check_one(const layer *one, int l, size_t row, int req, size_t len);

static size_t check_row(const layer *layers, int l, size_t row, int req, size_t len) {
  return check_one(&layers[l], l, row, req, len);
}

/* As check_row, for one layer whose values were made as layer l's. */
static size_t check_one(const layer *one, int l, size_t row, int req, size_t len) {
  size_t checked = 0;
  for (int f = 0; f < (one->dsa ? 3 : 2); f++) {
    size_t n = len * width(f), written = 0;
    float *out = malloc(n * sizeof(float) + 1);
    TRY(latent_cache_read_row_host(one->cache, (uint32_t)f, row, out, n, &written));
    if (written != n) {
      fprintf(stderr, "layer %d row %zu: read %zu values, expected %zu\n", l, row, written, n);
      exit(1);
    }
    for (size_t t = 0; t < len; t++)
      for (size_t ch = 0; ch < width(f); ch++)
        if (out[t * width(f) + ch] != value_at(l, req, t, f, ch)) {
          fprintf(stderr, "MISMATCH layer %d row %zu family %d position %zu channel %zu\n", l, row, f, t, ch);
          exit(1);
        }
    checked += n;
    free(out);
  }
  return checked;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void parse_args(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    int v = atoi(argv[i + 1]);
    if (!strcmp(argv[i], "--layers")) n_layers = v;
    else if (!strcmp(argv[i], "--dsa")) n_dsa = v;
    else if (!strcmp(argv[i], "--prefill")) prefill = v;
    else if (!strcmp(argv[i], "--chunk")) chunk = v;
    else if (!strcmp(argv[i], "--decode")) decode = v;
    else {
      fprintf(stderr, "unknown option %s\n", argv[i]);
      exit(2);
    }
  }
  if (n_layers < 1 || n_dsa < 0 || n_dsa > n_layers || prefill < 1 || chunk < 1 || decode < 1) {
    fprintf(stderr, "bad sizes\n");
    exit(2);
  }
}

/* Phase 1 and 2: one sequence, chunked prefill then decode. The model's multi-token-prediction
 * (MTP) layer keeps a cache of its own beside the target layers (role MTP, no index keys),
 * appended with every position and checked like them. */
static void single_sequence(void) {
  layer *layers = new_layers();
  latent_cache_config mtp_cfg = latent_cache_config_default();
  mtp_cfg.index_head_dim = 0;
  mtp_cfg.role = LATENT_CACHE_ROLE_MTP;
  layer mtp = {NULL, 0};
  TRY(latent_cache_new(&mtp_cfg, &mtp.cache));
  TRY(latent_cache_reserve(mtp.cache, (size_t)(prefill + decode)));
  int req = 0;
  for (int l = 0; l < n_layers; l++) TRY(latent_cache_reserve(layers[l].cache, (size_t)(prefill + decode)));
  double prefill_ms = 0; /* time in the cache calls and the evaluation, not in making inputs */
  for (size_t pos = 0; pos < (size_t)prefill; pos += (size_t)chunk) {
    size_t n = (size_t)prefill - pos < (size_t)chunk ? (size_t)prefill - pos : (size_t)chunk;
    prefill_ms += step(layers, 1, &req, &pos, n);
    step_mtp(&mtp, req, pos, n);
  }
  printf("prefill: %d positions in chunks of %d: %.1f ms in the cache (%.0f positions/s across %d layers)\n", prefill, chunk,
         prefill_ms, prefill / (prefill_ms / 1e3), n_layers);

  /* The decode one step at a time, its last steps (at most 8: each attends over every layer,
   * MLX's operations on a CPU) pipelined. */
  int piped = decode < 16 ? decode / 2 : 8, single = decode - piped;
  double *times = malloc(sizeof(double) * (size_t)decode);
  for (int s = 0; s < single; s++) {
    size_t pos = (size_t)prefill + (size_t)s;
    times[s] = step(layers, 1, &req, &pos, 1);
    step_mtp(&mtp, req, pos, 1);
  }
  qsort(times, (size_t)single, sizeof(double), cmp_double);
  printf("decode: %d steps, one evaluation per step: median %.2f ms per step (p10 %.2f, p90 %.2f)\n", single,
         times[single / 2], times[single / 10], times[single * 9 / 10]);
  static float q_data[RANK];
  for (size_t i = 0; i < RANK; i++) q_data[i] = (float)((i * 7) % 13) / 13.0f - 0.5f;
  size_t q_shape[4] = {1, 1, 1, RANK}, r_shape[4] = {1, 1, 1, ROPE}; /* one head */
  TRY(latent_cache_array_from_host_shape(q_data, RANK, q_shape, 4, &q_latent));
  TRY(latent_cache_array_from_host_shape(q_data, ROPE, r_shape, 4, &q_rope));
  mlx_array *prev = NULL;
  double last = now_ms();
  for (int s = 0; s < piped; s++) {
    size_t pos = (size_t)prefill + (size_t)(single + s);
    times[s] = pipelined_step(layers, req, pos, &prev, &last);
    /* The MTP layer's append joins the step lazily (an evaluation here would wait for it). */
    mlx_array in[3];
    build_inputs(n_layers, 0, 1, &req, &pos, NULL, 1, in);
    TRY(latent_cache_append_latent(mtp.cache, in[0], in[1], in[2], NULL, NULL, NULL));
    for (int f = 0; f < 3; f++) latent_cache_array_free(in[f]);
  }
  if (prev) {
    TRY(latent_cache_eval(prev, (size_t)n_layers));
    for (int l = 0; l < n_layers; l++) latent_cache_array_free(prev[l]);
    free(prev);
  }
  latent_cache_array_free(q_latent);
  latent_cache_array_free(q_rope);
  if (piped > 1) {
    qsort(times + 1, (size_t)piped - 1, sizeof(double), cmp_double);
    printf("decode: %d steps pipelined (latent_cache_eval_async, then the wait for the step before), one attention "
           "head over every layer: median %.2f ms per step\n",
           piped, times[1 + (piped - 1) / 2]);
  }
  free(times);

  size_t stored = 0, offset = 0, total_bytes = 0, bpt_dsa = 0, bpt_plain = 0;
  for (int l = 0; l < n_layers; l++) {
    size_t bpt = 0;
    TRY(latent_cache_offset(layers[l].cache, &offset));
    TRY(latent_cache_bytes_per_token(layers[l].cache, &bpt));
    stored += offset;
    total_bytes += bpt * offset;
    if (layers[l].dsa) bpt_dsa = bpt;
    else bpt_plain = bpt;
  }
  printf("stored: %zu positions per layer, %zu across %d layers; bytes per token: %zu (DSA layer), %zu (other), "
         "%.1f KiB per token for the model; %.1f MiB in total\n",
         offset, stored, n_layers, bpt_dsa, bpt_plain, (double)total_bytes / (double)offset / 1024.0,
         (double)total_bytes / (1024.0 * 1024.0));

  /* Every stored value of every layer, and of the MTP layer (layer index n_layers). */
  size_t checked = 0, valid_bytes = 0;
  for (int l = 0; l < n_layers; l++) checked += check_row(layers, l, 0, req, offset);
  checked += check_one(&mtp, n_layers, 0, req, offset);
  char sig[64];
  size_t len = 0;
  TRY(latent_cache_signature(mtp.cache, sig, sizeof sig, &len));
  TRY(latent_cache_byte_length(mtp.cache, &valid_bytes));
  printf("check: %zu values read back from %d layers and the MTP layer (%s, %zu bytes) equal what was written\n",
         checked, n_layers, sig, valid_bytes);
  latent_cache_free(mtp.cache);
  free_layers(layers);
}

/* Phase 3: two rows with prompts of different lengths verify draft tokens in rounds and accept
 * different counts. Ragged layout: each row's positions are [left_pad[b], row_end[b]) of the
 * window, so a rollback only moves row ends; an engine masks window position t of row b with
 * left_pad[b] <= t < row_end[b] and gives it RoPE position t - left_pad[b]. */
static void speculative(void) {
  enum { DRAFT = 3, ROUNDS = 8, PROMPT = 32, SHORT_PROMPT = 20 };
  layer *layers = new_layers_with(LATENT_CACHE_LAYOUT_RAGGED);
  int req[2] = {1, 2};
  size_t pos[2] = {0, 0}, accepted[2] = {0, 0}, pad[2] = {0, PROMPT - SHORT_PROMPT};
  padded_step(layers, 2, req, pos, pad, PROMPT); /* one padded batched prefill */
  pos[0] = PROMPT;
  pos[1] = SHORT_PROMPT;
  for (int r = 0; r < ROUNDS; r++) {
    for (int l = 0; l < n_layers; l++) TRY(latent_cache_spec_round_begin(layers[l].cache));
    step(layers, 2, req, pos, DRAFT); /* the verify forward appends the drafts */
    size_t keep[2];
    for (int b = 0; b < 2; b++) {
      /* A stand-in for the verifier: accept counts that differ per row and per round. */
      keep[b] = (size_t)((r * 5 + b * 2 + (r * b) % 3) % (DRAFT + 1));
      accepted[b] += keep[b];
    }
    for (int l = 0; l < n_layers; l++) TRY(latent_cache_spec_round_rollback_rows(layers[l].cache, keep, 2));
    /* A row's kept drafts are its next positions; what it rejected is gone, and its next
     * append continues right after what it kept. */
    size_t rows[MAX_ROWS];
    rows_of(layers[0].cache, rows);
    size_t ends[MAX_ROWS], n_ends = 0;
    TRY(latent_cache_row_ends(layers[0].cache, ends, MAX_ROWS, &n_ends));
    for (int b = 0; b < 2; b++) {
      if (rows[b] != pos[b] + keep[b] || ends[b] != pad[b] + rows[b]) {
        fprintf(stderr, "row %d holds %zu positions ending at %zu, expected %zu ending at %zu\n", b, rows[b], ends[b],
                pos[b] + keep[b], pad[b] + pos[b] + keep[b]);
        exit(1);
      }
      pos[b] = rows[b];
    }
    /* Both rows continue from their own position; positions of the drafts were numbered from
     * each row's length, so the pattern stays contiguous per request. */
  }
  size_t rows[MAX_ROWS], pads[MAX_ROWS], written;
  rows_of(layers[0].cache, rows);
  TRY(latent_cache_left_pad(layers[0].cache, pads, MAX_ROWS, &written));
  size_t checked = 0;
  for (int l = 0; l < n_layers; l++)
    for (size_t b = 0; b < 2; b++) checked += check_row(layers, l, b, req[b], rows[b]);
  printf("speculative (ragged layout, prompts of %d and %d): %d rounds of %d drafts; row 0 accepted %zu/%d, row 1 "
         "accepted %zu/%d; positions per row %zu, %zu (left_pad %zu, %zu); %zu values checked\n",
         PROMPT, SHORT_PROMPT,
         ROUNDS, DRAFT, accepted[0], ROUNDS * DRAFT, accepted[1], ROUNDS * DRAFT, rows[0], rows[1], pads[0], pads[1], checked);
  free_layers(layers);
}

/* Phase 4: continuous batching: requests join (merge) and finish (filter) at different times. */
static void batching(void) {
  enum { STEPS = 24 };
  layer *batch = new_layers();
  /* Slots for the largest batch, so joins never rebuild it. */
  for (int l = 0; l < n_layers; l++) TRY(latent_cache_reserve_rows(batch[l].cache, MAX_ROWS));
  int req[MAX_ROWS] = {10};
  size_t pos[MAX_ROWS] = {0};
  int rows = 1, next_request = 11;
  step(batch, 1, req, pos, 40);
  pos[0] = 40;
  printf("batch:");
  for (int s = 0; s < STEPS; s++) {
    if (s % 6 == 2 && rows < MAX_ROWS) { /* a request joins after its own prefill */
      layer *joiner = new_layers();
      int jreq = next_request++;
      size_t zero = 0, plen = (size_t)(8 + 5 * s);
      step(joiner, 1, &jreq, &zero, plen);
      for (int l = 0; l < n_layers; l++) {
        /* Into the running batch: the joiner takes a free slot, the rows there are not copied. */
        const latent_cache *sources[1] = {joiner[l].cache};
        TRY(latent_cache_merge_rows(batch[l].cache, sources, 1));
      }
      free_layers(joiner);
      req[rows] = jreq;
      pos[rows] = plen;
      rows++;
      printf(" [step %d: request %d joins with %zu positions]", s, jreq, plen);
    }
    if (s % 7 == 5 && rows > 1) { /* the oldest request finishes: row 0's slot moves on, nothing is copied */
      size_t keep[MAX_ROWS];
      for (int b = 1; b < rows; b++) keep[b - 1] = (size_t)b;
      for (int l = 0; l < n_layers; l++) TRY(latent_cache_filter_rows(batch[l].cache, keep, (size_t)rows - 1));
      printf(" [step %d: request %d finishes]", s, req[0]);
      memmove(req, req + 1, sizeof(int) * (size_t)(rows - 1));
      memmove(pos, pos + 1, sizeof(size_t) * (size_t)(rows - 1));
      rows--;
    }
    step(batch, rows, req, pos, 1);
    for (int b = 0; b < rows; b++) pos[b]++;
  }
  size_t lens[MAX_ROWS], checked = 0;
  size_t n = rows_of(batch[0].cache, lens);
  printf("\nbatch: %zu rows after %d steps; positions per row:", n, STEPS);
  for (size_t b = 0; b < n; b++) printf(" request %d: %zu", req[b], lens[b]);
  for (int l = 0; l < n_layers; l++)
    for (size_t b = 0; b < n; b++) checked += check_row(batch, l, b, req[b], lens[b]);
  printf("; %zu values checked\n", checked);
  free_layers(batch);
}

/* Phase 5: the model's caches as one set, made from the GLM-5.2 preset (78 layers and the MTP
 * layer): layers are lent for the forward, rounds and row operations move every layer at once. */
/* A set of the given layers, and its layers lent as `layer`s (free the array, not the lent
 * handles: the set releases them). */
static layer *new_set(const latent_cache_config *configs, size_t n_configs, latent_cache_set **set) {
  TRY(latent_cache_set_new(configs, n_configs, set));
  layer *layers = calloc(n_configs, sizeof(layer));
  for (size_t l = 0; l < n_configs; l++) {
    TRY(latent_cache_set_layer(*set, l, &layers[l].cache));
    layers[l].dsa = configs[l].index_head_dim > 0;
  }
  return layers;
}

static void model_set(void) {
  enum { PRESET = 79, ROWS = 2, PROMPT = 16, DRAFT = 3 };
  latent_cache_config configs[PRESET];
  size_t n_configs = 0;
  TRY(latent_cache_glm52_configs(configs, PRESET, &n_configs));
  latent_cache_set *set = NULL;
  layer *layers = new_set(configs, n_configs, &set);
  int saved = n_layers, req[ROWS] = {30, 31};
  n_layers = (int)n_configs; /* step() walks every layer of the set */
  size_t pos[ROWS] = {0, 0};
  TRY(latent_cache_set_reserve(set, 64));
  step(layers, ROWS, req, pos, PROMPT);
  pos[0] = pos[1] = PROMPT;
  TRY(latent_cache_set_spec_round_begin(set));
  step(layers, ROWS, req, pos, DRAFT);
  size_t keep[ROWS] = {2, 0};
  TRY(latent_cache_set_spec_round_rollback_rows(set, keep, ROWS));
  /* A forward that stops partway (an append refused at a middle layer, CAPACITY under MLX's
   * memory limit, say): the first half of the layers hold the new position, so set-wide calls
   * refuse the set until latent_cache_set_recover cuts every layer back to what all hold. */
  size_t next[ROWS] = {PROMPT + keep[0], PROMPT + keep[1]}, dropped = 0;
  n_layers = (int)n_configs / 2;
  step(layers, ROWS, req, next, 1);
  n_layers = (int)n_configs;
  if (latent_cache_set_trim(set, 0, false) != LATENT_CACHE_STATUS_INVALID_STATE) die("a set driven apart", LATENT_CACHE_STATUS_OK);
  TRY(latent_cache_set_recover(set, &dropped));
  if (dropped != 1) die("recover dropped the wrong count", LATENT_CACHE_STATUS_OK);
  size_t checked = 0, bytes = 0;
  for (int l = 0; l < n_layers; l++)
    for (size_t b = 0; b < ROWS; b++) checked += check_row(layers, l, b, req[b], PROMPT + keep[b]);
  TRY(latent_cache_set_bytes_in_use(set, &bytes));
  printf("set: GLM-5.2 preset, %zu layers (MTP included) moved together through a round and recovered from a "
         "forward stopped halfway; %zu values checked, %.1f MiB in use\n",
         n_configs, checked, (double)bytes / (1024.0 * 1024.0));
  n_layers = saved;
  free(layers); /* lent handles: the set releases them */
  latent_cache_set_free(set);
}

/* Composed storage, as a memory-bound engine would set it: the preset's layers with an 8-bit
 * latent and index keys, a bfloat16 rope key, and each row's newest 256 positions (prefill/8 for
 * short prompts) kept in float32. A chunked prefill under set-wide prefill maintenance (the seed's protocol; the hot
 * side stays the size of the window throughout), then decode steps. The hot positions read back exactly, the compact ones within 8-bit
 * precision; the bytes held are printed beside what float32 storage would take. */
static void composed(void) {
  enum { PRESET = 79 };
  latent_cache_config configs[PRESET];
  size_t n_configs = 0;
  TRY(latent_cache_glm52_configs(configs, PRESET, &n_configs));
  size_t hot = prefill / 8 > 256 ? 256 : prefill / 8 > 0 ? (size_t)prefill / 8 : 1, f32_bytes = 0;
  for (size_t l = 0; l < n_configs; l++) {
    size_t projected = 0;
    TRY(latent_cache_projected_bytes(&configs[l], 1, (size_t)(prefill + decode), &projected));
    f32_bytes += projected;
    configs[l].latent_storage = LATENT_CACHE_STORAGE_Q8;
    configs[l].rope_storage = LATENT_CACHE_STORAGE_BF16;
    configs[l].index_storage = LATENT_CACHE_STORAGE_Q8;
    configs[l].hot_window = hot;
  }
  latent_cache_set *set = NULL;
  layer *layers = new_set(configs, n_configs, &set);
  int saved = n_layers, req[1] = {50};
  n_layers = (int)n_configs;
  size_t pos[1] = {0}, row0 = 0;
  /* Reserved, as an engine that knows the request's length does: bytes in use are then the
   * positions held, not a growth step. */
  TRY(latent_cache_set_reserve(set, (size_t)(prefill + decode)));
  TRY(latent_cache_set_prefill_begin(set));
  for (; pos[0] < (size_t)prefill; pos[0] += (size_t)chunk) {
    size_t tokens = (size_t)prefill - pos[0] < (size_t)chunk ? (size_t)prefill - pos[0] : (size_t)chunk;
    step(layers, 1, req, pos, tokens);
    pos[0] += tokens - (size_t)chunk;
  }
  TRY(latent_cache_set_prefill_commit(set, &row0, 1));
  TRY(latent_cache_set_prefill_end(set));
  for (int d = 0; d < decode; d++, pos[0]++) step(layers, 1, req, pos, 1);
  size_t len = pos[0], converted = 0, n = 0, bytes = 0, exact = 0;
  float *row = malloc(len * RANK * sizeof(float));
  double worst = 0.0;
  TRY(latent_cache_converted_positions(layers[0].cache, &converted, 1, &n));
  TRY(latent_cache_read_row_host(layers[0].cache, LATENT_CACHE_FAMILY_LATENT, 0, row, len * RANK, &n));
  for (size_t p = 0; p < len; p++)
    for (size_t ch = 0; ch < RANK; ch++) {
      double want = value_at(0, req[0], p, 0, ch), err = row[p * RANK + ch] - want;
      err = err < 0 ? -err : err;
      if (p >= converted && err != 0.0) die("a hot position read back exactly", LATENT_CACHE_STATUS_BACKEND);
      exact += p >= converted;
      worst = err > worst ? err : worst;
    }
  if (worst > 0.25) die("compact positions within 8-bit precision", LATENT_CACHE_STATUS_BACKEND);
  TRY(latent_cache_set_bytes_in_use(set, &bytes));
  printf("composed: %zu layers, 8-bit with the newest %zu positions in float32; %zu positions per layer, "
         "%zu compact; %zu hot values exact, compact ones within %.3f; %.1f MiB in use (float32: %.1f MiB)\n",
         n_configs, hot, len, converted, exact, worst, (double)bytes / (1024.0 * 1024.0),
         (double)f32_bytes / (1024.0 * 1024.0));
  free(row);
  n_layers = saved;
  free(layers);
  latent_cache_set_free(set);
}

int main(int argc, char **argv) {
  parse_args(argc, argv);
  printf("latent-cache %s demo: GLM-5.2 shape, %d layers (%d with DSA index keys), kv_lora_rank %d, rope %d, "
         "index %d, float32\n",
         latent_cache_version(), n_layers, n_dsa, RANK, ROPE, INDEX);
  single_sequence();
  speculative();
  batching();
  model_set();
  composed();
  printf("demo: all read-back checks passed\n");
  return 0;
}
