/* GLM-5.2-shaped decode steps with real attention math over the cache, through the C ABI alone:
 * two layers (one with DSA index keys), a prompt prefilled, then decode steps in which a hidden
 * state is projected by random weights into 64 absorbed query heads (latent and RoPE parts) and
 * 32 index heads, attention is read over a donor snapshot of the cache (dense on the plain layer;
 * index scores, top-k selection and attention over the selected positions on the DSA layer), and
 * the outputs are evaluated once per step. The last step's outputs are checked against the same
 * math done here in double precision.
 *
 * Usage: attention [--context N] [--steps N] [--topk N] */
#define _POSIX_C_SOURCE 199309L /* clock_gettime */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "latent_cache.h"

enum { RANK = 512, ROPE = 64, INDEX = 128, HEADS = 64, INDEX_HEADS = 32, HIDDEN = 64 };

static size_t context = 4096, steps = 16, topk = 2048;

#define TRY(call)                                                        \
  do {                                                                   \
    latent_cache_status s_ = (call);                                     \
    if (s_ != LATENT_CACHE_STATUS_OK) {                                  \
      char msg_[512];                                                    \
      latent_cache_last_error(msg_, sizeof msg_);                        \
      fprintf(stderr, "%s failed: %s: %s\n", #call, latent_cache_status_name(s_), msg_); \
      exit(1);                                                           \
    }                                                                    \
  } while (0)

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

/* A seeded generator: what the model's activations and random weights stand in for. */
static unsigned long long rng_state = 0x9e3779b97f4a7c15ull;
static float uniform(void) {
  rng_state ^= rng_state << 13;
  rng_state ^= rng_state >> 7;
  rng_state ^= rng_state << 17;
  return (float)((rng_state >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

/* The value the model "projects" for (layer, position, family, channel): deterministic, so the
 * reference below reads the cache's contents without keeping a copy. */
static float value_at(int layer, size_t pos, int family, size_t ch) {
  unsigned h = (unsigned)layer * 2654435761u ^ (unsigned)pos * 2246822519u ^ (unsigned)family * 3266489917u;
  h ^= (unsigned)ch * 668265263u;
  h ^= h >> 15;
  h *= 2246822519u;
  h ^= h >> 13;
  return (float)(h % 4001u) / 2000.0f - 1.0f;
}

static size_t width(int family) { return family == 0 ? RANK : family == 1 ? ROPE : INDEX; }

/* Appends positions [pos, pos + n) to a layer. */
static void append(latent_cache *c, int layer, int dsa, size_t pos, size_t n) {
  mlx_array in[3] = {{0}, {0}, {0}};
  for (int f = 0; f < (dsa ? 3 : 2); f++) {
    float *buf = malloc(n * width(f) * sizeof(float));
    for (size_t t = 0; t < n; t++)
      for (size_t ch = 0; ch < width(f); ch++) buf[t * width(f) + ch] = value_at(layer, pos + t, f, ch);
    TRY(latent_cache_array_from_host(buf, n * width(f), 1, n, width(f), &in[f]));
    free(buf);
  }
  mlx_array out[3] = {{0}, {0}, {0}};
  TRY(latent_cache_append_latent(c, in[0], in[1], in[2], &out[0], &out[1], &out[2]));
  for (int f = 0; f < 3; f++) {
    latent_cache_array_free(in[f]);
    latent_cache_array_free(out[f]);
  }
}

/* out[r] = sum_i x[i] * w[i * rows + r]: a projection by random weights. */
static void project(const float *x, const float *w, size_t rows, float *out) {
  for (size_t r = 0; r < rows; r++) out[r] = 0.0f;
  for (size_t i = 0; i < HIDDEN; i++)
    for (size_t r = 0; r < rows; r++) out[r] += x[i] * w[i * rows + r];
}

static mlx_array host_array(const float *data, size_t n, size_t d0, size_t d1, size_t d2, size_t d3, size_t ndim) {
  size_t shape[4] = {d0, d1, d2, d3};
  mlx_array a = {0};
  TRY(latent_cache_array_from_host_shape(data, n, shape, ndim, &a));
  return a;
}

/* Attention of head h over positions `pos` (n of them), in double: softmax(scale * (ql . latent
 * + qr . rope)) . latent, for channel range [0, RANK). */
static void reference_head(int layer, const float *ql, const float *qr, float scale, const size_t *pos, size_t n,
                           double *out) {
  double *logits = malloc(n * sizeof(double)), top = -INFINITY, sum = 0;
  for (size_t i = 0; i < n; i++) {
    double dot = 0;
    for (size_t ch = 0; ch < RANK; ch++) dot += (double)ql[ch] * value_at(layer, pos[i], 0, ch);
    for (size_t ch = 0; ch < ROPE; ch++) dot += (double)qr[ch] * value_at(layer, pos[i], 1, ch);
    logits[i] = scale * dot;
    if (logits[i] > top) top = logits[i];
  }
  for (size_t ch = 0; ch < RANK; ch++) out[ch] = 0;
  for (size_t i = 0; i < n; i++) {
    double p = exp(logits[i] - top);
    sum += p;
    for (size_t ch = 0; ch < RANK; ch++) out[ch] += p * value_at(layer, pos[i], 0, ch);
  }
  for (size_t ch = 0; ch < RANK; ch++) out[ch] /= sum;
  free(logits);
}

static double max_error(const float *got, const double *want, size_t n) {
  double worst = 0;
  for (size_t i = 0; i < n; i++) {
    double e = fabs(got[i] - want[i]) / (1.0 + fabs(want[i]));
    if (e > worst) worst = e;
  }
  return worst;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

int main(int argc, char **argv) {
  for (int i = 1; i + 1 < argc; i += 2) {
    size_t v = (size_t)strtoull(argv[i + 1], NULL, 10);
    if (!strcmp(argv[i], "--context")) context = v;
    else if (!strcmp(argv[i], "--steps")) steps = v;
    else if (!strcmp(argv[i], "--topk")) topk = v;
  }
  latent_cache_config cfg = latent_cache_config_default();
  latent_cache *plain = NULL, *dsa = NULL;
  cfg.index_head_dim = 0;
  TRY(latent_cache_new(&cfg, &plain));
  cfg.index_head_dim = INDEX;
  TRY(latent_cache_new(&cfg, &dsa));
  for (size_t pos = 0; pos < context; pos += 512) {
    size_t n = context - pos < 512 ? context - pos : 512;
    append(plain, 0, 0, pos, n);
    append(dsa, 1, 1, pos, n);
  }
  /* Random weights: hidden -> absorbed query (latent and RoPE parts) per head, index queries and
   * per-head index weights. GLM-5's softmax scale: 1 / sqrt(qk_nope + qk_rope head dims). */
  size_t qdim = (size_t)HEADS * (RANK + ROPE), idim = (size_t)INDEX_HEADS * INDEX;
  float *wq = malloc(HIDDEN * qdim * sizeof(float)), *wi = malloc(HIDDEN * idim * sizeof(float));
  float *ww = malloc(HIDDEN * INDEX_HEADS * sizeof(float));
  for (size_t i = 0; i < HIDDEN * qdim; i++) wq[i] = uniform() * 0.05f;
  for (size_t i = 0; i < HIDDEN * idim; i++) wi[i] = uniform() * 0.05f;
  for (size_t i = 0; i < HIDDEN * INDEX_HEADS; i++) ww[i] = uniform() * 0.2f;
  const float scale = 1.0f / 16.0f;
  float *q = malloc(qdim * sizeof(float)), *qi = malloc(idim * sizeof(float)), *wts = malloc(INDEX_HEADS * sizeof(float));
  float *ql = malloc((size_t)HEADS * RANK * sizeof(float)), *qr = malloc((size_t)HEADS * ROPE * sizeof(float));
  float *dense_out = malloc((size_t)HEADS * RANK * sizeof(float)), *sparse_out = malloc((size_t)HEADS * RANK * sizeof(float));
  double *times = malloc(steps * sizeof(double));
  size_t sel_k = 0;
  int32_t *selected = NULL;
  for (size_t s = 0; s < steps; s++) {
    size_t pos = context + s;
    append(plain, 0, 0, pos, 1);
    append(dsa, 1, 1, pos, 1);
    float x[HIDDEN];
    for (int i = 0; i < HIDDEN; i++) x[i] = uniform();
    project(x, wq, qdim, q);
    project(x, wi, idim, qi);
    project(x, ww, INDEX_HEADS, wts);
    for (size_t h = 0; h < HEADS; h++) {
      memcpy(ql + h * RANK, q + h * (RANK + ROPE), RANK * sizeof(float));
      memcpy(qr + h * ROPE, q + h * (RANK + ROPE) + RANK, ROPE * sizeof(float));
    }
    double start = now_ms();
    mlx_array q_latent = host_array(ql, (size_t)HEADS * RANK, 1, HEADS, 1, RANK, 4);
    mlx_array q_rope = host_array(qr, (size_t)HEADS * ROPE, 1, HEADS, 1, ROPE, 4);
    mlx_array q_index = host_array(qi, idim, 1, INDEX_HEADS, 1, INDEX, 4);
    mlx_array weights = host_array(wts, INDEX_HEADS, 1, 1, INDEX_HEADS, 0, 3);
    latent_cache_donor *d_plain = NULL, *d_dsa = NULL;
    TRY(latent_cache_capture_donor_rows(plain, &d_plain));
    TRY(latent_cache_capture_donor_rows(dsa, &d_dsa));
    mlx_array dense = {0}, scores = {0}, indices = {0}, sparse = {0}, none = {0};
    TRY(latent_cache_donor_attend(d_plain, q_latent, q_rope, scale, LATENT_CACHE_MASK_NONE, none, &dense));
    TRY(latent_cache_donor_index_scores(d_dsa, q_index, weights, LATENT_CACHE_MASK_NONE, &scores));
    TRY(latent_cache_donor_select(d_dsa, scores, topk, &indices));
    if (indices.ctx)
      TRY(latent_cache_donor_attend_selected(d_dsa, q_latent, q_rope, scale, LATENT_CACHE_MASK_NONE, indices, &sparse));
    else
      TRY(latent_cache_donor_attend(d_dsa, q_latent, q_rope, scale, LATENT_CACHE_MASK_NONE, none, &sparse));
    size_t written = 0;
    TRY(latent_cache_array_to_host(dense, dense_out, (size_t)HEADS * RANK, &written));
    TRY(latent_cache_array_to_host(sparse, sparse_out, (size_t)HEADS * RANK, &written));
    times[s] = now_ms() - start;
    if (s + 1 == steps && indices.ctx) {
      /* The positions the library selected, for the check below (int32 through float32: exact
       * below 2^24). */
      sel_k = topk;
      float *as_float = malloc(sel_k * sizeof(float));
      TRY(latent_cache_array_to_host(indices, as_float, sel_k, &written));
      selected = malloc(sel_k * sizeof(int32_t));
      for (size_t i = 0; i < sel_k; i++) selected[i] = (int32_t)as_float[i];
      free(as_float);
    }
    mlx_array all[] = {q_latent, q_rope, q_index, weights, dense, scores, indices, sparse};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) latent_cache_array_free(all[i]);
    latent_cache_donor_free(d_plain); /* before the next append, which then writes in place */
    latent_cache_donor_free(d_dsa);
  }
  qsort(times, steps, sizeof(double), cmp_double);
  size_t total = context + steps;
  printf("attention: 2 GLM-5.2 layers at %zu positions, %d heads (absorbed, kv_lora_rank %d + rope %d), DSA top-%zu "
         "over %d index heads: median %.2f ms per step (dense layer + DSA layer, one evaluation each)\n",
         total, HEADS, RANK, ROPE, topk, INDEX_HEADS, times[steps / 2]);

  /* The check: heads 0 and 63 of the last step, dense over every position, and on the DSA layer
   * over the positions with the highest index scores, computed here. */
  size_t *every = malloc(total * sizeof(size_t));
  for (size_t i = 0; i < total; i++) every[i] = i;
  double want[RANK], worst = 0;
  for (size_t h = 0; h < HEADS; h += HEADS - 1) {
    reference_head(0, ql + h * RANK, qr + h * ROPE, scale, every, total, want);
    double e = max_error(dense_out + h * RANK, want, RANK);
    if (e > worst) worst = e;
  }
  /* Index scores here: sum over index heads of weight * ReLU(q . k). Every position the library
   * selected must score at least the reference's k-th best (within float32's rounding, so a tie at
   * the boundary may go either way); the sparse output is then checked over those positions. */
  size_t n_sel = total;
  size_t *chosen = every;
  if (selected) {
    double *sc = malloc(total * sizeof(double)), *sorted = malloc(total * sizeof(double)), top = 0;
    for (size_t t = 0; t < total; t++) {
      double acc = 0;
      for (size_t hh = 0; hh < INDEX_HEADS; hh++) {
        double dot = 0;
        for (size_t ch = 0; ch < INDEX; ch++) dot += (double)qi[hh * INDEX + ch] * value_at(1, t, 2, ch);
        acc += wts[hh] * (dot > 0 ? dot : 0);
      }
      sc[t] = sorted[t] = acc;
      if (fabs(acc) > top) top = fabs(acc);
    }
    qsort(sorted, total, sizeof(double), cmp_double);
    double kth = sorted[total - topk];
    chosen = malloc(topk * sizeof(size_t));
    for (size_t i = 0; i < topk; i++) {
      chosen[i] = (size_t)selected[i];
      if (chosen[i] >= total || sc[chosen[i]] < kth - 1e-5 * top) {
        fprintf(stderr, "attention: selected position %zu is not among the reference's top %zu\n", chosen[i], topk);
        return 1;
      }
    }
    n_sel = topk;
    free(sorted);
    free(sc);
  }
  for (size_t h = 0; h < HEADS; h += HEADS - 1) {
    reference_head(1, ql + h * RANK, qr + h * ROPE, scale, chosen, n_sel, want);
    double e = max_error(sparse_out + h * RANK, want, RANK);
    if (e > worst) worst = e;
  }
  printf("check: dense and DSA-selected attention (heads 0 and %d) match a float64 computation within %.1e%s\n",
         HEADS - 1, worst, selected ? "; the selected positions are the reference's top-k" : " (window <= top-k: dense)");
  if (worst > 1e-3) {
    fprintf(stderr, "attention: error %.3e beyond 1e-3\n", worst);
    return 1;
  }
  if (chosen != every) free(chosen);
  free(every);
  free(selected);
  free(times);
  free(wq);
  free(wi);
  free(ww);
  free(q);
  free(qi);
  free(wts);
  free(ql);
  free(qr);
  free(dense_out);
  free(sparse_out);
  latent_cache_free(plain);
  latent_cache_free(dsa);
  return 0;
}
