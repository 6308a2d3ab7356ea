// Runs the library's Metal decode kernels (src/core/kernels/metal/src/*.metal, through the emulation in
// metal_shim.h) over small attentions with padded, ragged and causal rows, strided views and
// empty splits, and compares each output with a float64 computation of the same formula.
// Prints one line a case; exits 1 if any differs by more than rounding.
#include <cstdio>
#include <random>

#include "kernels.inc"

namespace {

// Values exact in float32, bfloat16 and float16: k / 64 for k in [-32, 32].
std::vector<float> values(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> k(-32, 32);
  std::vector<float> v(n);
  for (auto& x : v) x = k(rng) / 64.f;
  return v;
}

// k distinct positions of [0, T) per row, for `rows` rows, in no order.
std::vector<int> selection(int rows, int k, int T) {
  std::vector<int> out;
  for (int b = 0; b < rows; b++) {
    for (int i = 0; i < k; i++) out.push_back((37 * i + 11 + 5 * b) % T);
  }
  return out;
}

// `sel` with, in each row of 30, a position named twice, one before the first (-3) and one
// past the last stored (1000): read clamped into the buffer, as the library reads a caller's.
std::vector<int> unruly(std::vector<int> sel) {
  for (size_t row = 0; row + 30 <= sel.size(); row += 30) {
    sel[row + 1] = sel[row + 2];
    sel[row + 4] = -3;
    sel[row + 9] = 1000;
  }
  return sel;
}

template <typename T>
std::vector<T> as(const std::vector<float>& v) {
  std::vector<T> out;
  for (float x : v) out.push_back(T(x));
  return out;
}

// One case: `heads` x `LQ` queries per row over a [B, cap, R] buffer viewed as its first T
// positions, rows' valid ranges `ranges`, `S` splits; with GATHER, each row's window is instead
// `sel`'s k positions of the buffer (k per row, out of order), and `ranges` bound the stored
// positions a row's selection may name (a prefill chunk's causal mask). `shared`: every row
// reads one stored buffer, broadcast over the rows (stride 0), as a prefill chunk's queries do,
// each a row of its own; `transposed`: the rows' queries are one [1, heads, B, w] array viewed
// as [B, heads, 1, w], as the library hands a chunk's queries over (one query a row). Without
// GATHER the stand-in for `sel` is one-dimensional, as the library's launches pass it. Returns
// the largest difference from the float64 result relative to the largest output.
template <typename TS, int R, int P, int HEADS, int LQ, bool CAUSAL, bool GATHER = false>
double run(int B, int T, int cap, const std::vector<std::pair<int, int>>& ranges, int S, uint32_t seed,
           const std::vector<int>& sel = {}, bool shared = false, bool transposed = false) {
  static_assert(LQ == 1 || !GATHER, "a selection's rows have one query each");
  constexpr int H = HEADS * LQ;
  std::mt19937 rng(seed);
  const int Bs = shared ? 1 : B;
  const auto ql = values(size_t(B) * H * R, rng), qr = values(size_t(B) * H * P, rng);
  const auto lat = values(size_t(Bs) * cap * R, rng), rop = values(size_t(Bs) * cap * P, rng);
  const auto qlt = as<TS>(ql), qrt = as<TS>(qr), latt = as<TS>(lat), ropt = as<TS>(rop);
  const int qls[4] = {B, HEADS, LQ, R}, qrs[4] = {B, HEADS, LQ, P}, ls[3] = {B, T, R}, rs[3] = {B, T, P};
  int64_t qlst[4] = {int64_t(H) * R, int64_t(LQ) * R, R, 1}, qrst[4] = {int64_t(H) * P, int64_t(LQ) * P, P, 1};
  if (transposed) {
    // Row b's head h at [h, b] of [heads, B, w] (one query a row).
    qlst[0] = R, qlst[1] = int64_t(B) * R, qrst[0] = P, qrst[1] = int64_t(B) * P;
  }
  // Where row b's (head, query) pair h starts in the query values.
  auto q_at = [&](int b, int h) { return transposed ? size_t(h) * B + b : size_t(b) * H + h; };
  const int64_t lst[3] = {shared ? 0 : int64_t(cap) * R, R, 1}, rst[3] = {shared ? 0 : int64_t(cap) * P, P, 1};
  // Row b's stored values start at `base(b)` positions into the buffers.
  auto base = [&](int b) { return size_t(shared ? 0 : b) * cap; };
  std::vector<int> rng_bounds;
  for (auto [lo, hi] : ranges) rng_bounds.insert(rng_bounds.end(), {lo, hi});
  const int bs[1] = {2 * B}, ss[1] = {1};
  const int k = GATHER ? int(sel.size()) / B : 0;
  const int sels[3] = {B, 1, k};
  const int64_t selst[3] = {k, k, 1};
  // The stored position window position t of row b reads.
  auto stored = [&](int b, int t) { return GATHER ? std::clamp(sel[size_t(b) * k + t], 0, std::min(T, cap) - 1) : t; };
  const int64_t one[1] = {1};
  const float scale[1] = {0.125f};
  std::vector<float> o_part(size_t(B) * S * H * R, NAN), ml(size_t(B) * S * H * 2, NAN), out(size_t(B) * H * R, NAN);
  const int ops[4] = {B, S, H, R}, mls[4] = {B, S, H, 2};
  const int64_t opst[4] = {int64_t(S) * H * R, int64_t(H) * R, R, 1}, mlst[4] = {int64_t(S) * H * 2, int64_t(H) * 2, 2, 1};
  dispatch({uint(S), uint(B), uint((H + 15) / 16)}, 256, [&](const Attributes& a) {
    lc_partial<R, P, H, LQ, CAUSAL, GATHER, TS>(qlt.data(), qls, qlst, qrt.data(), qrs, qrst, latt.data(), ls, lst, ropt.data(), rs, rst,
                                     rng_bounds.data(), bs, one, scale, ss, one, GATHER ? sel.data() : rng_bounds.data(),
                                     GATHER ? sels : bs, GATHER ? selst : one,
                                     o_part.data(), ml.data(), a);
  });
  dispatch({1, uint(H), uint(B)}, 256, [&](const Attributes& a) {
    lc_combine<R, H, 256>(o_part.data(), ops, opst, ml.data(), mls, mlst, out.data(), a);
  });
  double worst = 0, largest = 0;
  for (int b = 0; b < B; b++) {
    const auto [lo, hi] = ranges[b];
    for (int h = 0; h < H; h++) {
      // The stored positions the row's query sees: its window's (GATHER: those of its
      // selection within its bounds).
      std::vector<int> seen;
      if (GATHER) {
        for (int t = 0; t < k; t++) if (stored(b, t) >= lo && stored(b, t) < hi) seen.push_back(stored(b, t));
      } else {
        for (int t = lo; t < (CAUSAL ? hi - LQ + 1 + h % LQ : hi); t++) seen.push_back(t);
      }
      std::vector<double> s;
      for (int p : seen) {
        double d = 0;
        for (int c = 0; c < R; c++) d += double(ql[q_at(b, h) * R + c]) * lat[(base(b) + p) * R + c];
        for (int c = 0; c < P; c++) d += double(qr[q_at(b, h) * P + c]) * rop[(base(b) + p) * P + c];
        s.push_back(0.125 * d);
      }
      const double top = *std::max_element(s.begin(), s.end());
      double total = 0;
      for (auto& x : s) total += (x = std::exp(x - top));
      for (int c = 0; c < R; c++) {
        double want = 0;
        for (size_t i = 0; i < seen.size(); i++) want += s[i] * lat[(base(b) + seen[i]) * R + c];
        want /= total;
        const double got = out[(size_t(b) * H + h) * R + c];
        worst = std::isfinite(got) ? std::max(worst, std::abs(got - want)) : INFINITY;
        largest = std::max(largest, std::abs(want));
      }
    }
  }
  return worst / std::max(largest, 1e-30);
}

// Top-k of `B` rows x `LQ` queries of T scores each, drawn from `levels` values (ties where
// few) with some -inf, read through a strided view (every other value of a wider buffer): the
// kernel's positions against the host's (positions above the K-th largest score in order, then
// the first ties at it). Returns the number of positions that differ.
template <int K, int CAP = 2048>
double top_k(int B, int LQ, int T, int levels, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int> draw(0, levels);
  std::vector<float> wide(size_t(B) * LQ * T * 2, NAN);
  for (size_t i = 0; i < wide.size(); i += 2) {
    const int v = draw(rng);
    wide[i] = v == 0 ? -INFINITY : float(v - levels / 2) * 0.5f;
  }
  const int shape[3] = {B, LQ, T};
  const int64_t strides[3] = {int64_t(LQ) * T * 2, int64_t(T) * 2, 2};
  std::vector<int> top(size_t(B) * LQ * K, -1);
  // The two kernels as the library launches them: the histogram (its output zeroed, as MLX
  // zeroes it), then the selection, whose bitmaps are a scratch output of unknown contents.
  std::vector<uint> hist(size_t(B) * LQ * 2048, 0u);
  const int words = (T + 31) / 32;
  std::vector<uint> bits(size_t(B) * LQ * 2 * words, 0xdeadbeefu);
  const int hist_shape[3] = {B, LQ, 2048};
  const int64_t hist_strides[3] = {int64_t(LQ) * 2048, 2048, 1};
  dispatch({uint((T + 4095) / 4096), uint(LQ), uint(B)}, 256,
           [&](const Attributes& a) { lc_topk_hist(wide.data(), shape, strides, hist.data(), a); });
  dispatch({1, uint(LQ), uint(B)}, 512, [&](const Attributes& a) {
    lc_topk<K, CAP>(wide.data(), shape, strides, hist.data(), hist_shape, hist_strides, top.data(), bits.data(), a);
  });
  double wrong = 0;
  for (int r = 0; r < B * LQ; r++) {
    std::vector<float> row(T);
    for (int t = 0; t < T; t++) row[t] = wide[(size_t(r) * T + t) * 2];
    std::vector<float> sorted = row;
    std::sort(sorted.begin(), sorted.end(), [](float x, float y) { return x > y; });
    const float kth = sorted[K - 1];
    std::vector<int> want;
    for (int t = 0; t < T; t++) if (row[t] > kth) want.push_back(t);
    for (int t = 0; t < T && int(want.size()) < K; t++) if (row[t] == kth) want.push_back(t);
    for (int i = 0; i < K; i++) wrong += top[size_t(r) * K + i] != want[i];
  }
  return wrong;
}

// DSA index scores of `B` rows x LQ queries of HEADS heads over a [B, cap, W] key buffer viewed
// as its first T positions, rows visible over `ranges` (RANGES) and causal queries (CAUSAL):
// against float64, every unseen position -inf. Returns the largest difference relative to the
// largest score (infinite where a seen position is not finite or an unseen one not -inf).
template <typename TQ, typename TK, int HEADS, int W, int LQ, bool RANGES, bool CAUSAL>
struct ScoreInputs {
  const int B, T;
  std::mt19937 rng;
  const std::vector<float> q, w, k;
  const std::vector<TQ> qt;
  const std::vector<TK> kt;
  std::vector<int> bounds;
  const int qs[4], ws[3], ks[3], rs[1];
  const int64_t qst[4], wst[3], kst[3], one[1] = {1};
  ScoreInputs(int B, int T, int cap, const std::vector<std::pair<int, int>>& ranges, uint32_t seed)
      : B(B), T(T), rng(seed), q(values(size_t(B) * HEADS * LQ * W, rng)), w(values(size_t(B) * LQ * HEADS, rng)),
        k(values(size_t(B) * cap * W, rng)), qt(as<TQ>(q)), kt(as<TK>(k)), qs{B, HEADS, LQ, W}, ws{B, LQ, HEADS},
        ks{B, T, W}, rs{2 * B}, qst{int64_t(HEADS) * LQ * W, int64_t(LQ) * W, W, 1}, wst{int64_t(LQ) * HEADS, HEADS, 1},
        kst{int64_t(cap) * W, W, 1} {
    for (auto [lo, hi] : ranges) bounds.insert(bounds.end(), {lo, hi});
  }
  uint3 grid() const { return {uint((T + 127) / 128), uint(LQ), uint(B)}; }
  // The scores kernel into `out`.
  void score(std::vector<float>& out) const {
    dispatch(grid(), 128, [&](const Attributes& a) {
      lc_scores<HEADS, W, LQ, RANGES, CAUSAL, TQ, float, TK>(qt.data(), qs, qst, w.data(), ws, wst, kt.data(), ks, kst,
                                                             bounds.data(), rs, one, out.data(), a);
    });
  }
};

template <typename TQ, typename TK, int HEADS, int W, int LQ, bool RANGES, bool CAUSAL>
double scores(int B, int T, int cap, const std::vector<std::pair<int, int>>& ranges, uint32_t seed) {
  const ScoreInputs<TQ, TK, HEADS, W, LQ, RANGES, CAUSAL> in(B, T, cap, ranges, seed);
  const auto &q = in.q, &w = in.w, &k = in.k;
  std::vector<float> out(size_t(B) * LQ * T, NAN);
  in.score(out);
  double worst = 0, largest = 1e-30;
  for (int b = 0; b < B; b++) {
    for (int i = 0; i < LQ; i++) {
      const int lo = RANGES ? ranges[b].first : 0, hi = (RANGES ? ranges[b].second : T) - (CAUSAL ? LQ - 1 - i : 0);
      for (int t = 0; t < T; t++) {
        const float got = out[(size_t(b) * LQ + i) * T + t];
        if (t < lo || t >= hi) {
          if (!(std::isinf(got) && got < 0)) return INFINITY;
          continue;
        }
        double want = 0;
        for (int h = 0; h < HEADS; h++) {
          double dot = 0;
          for (int c = 0; c < W; c++) dot += double(q[((size_t(b) * HEADS + h) * LQ + i) * W + c]) * k[(size_t(b) * cap + t) * W + c];
          want += double(w[(size_t(b) * LQ + i) * HEADS + h]) * std::max(dot, 0.0);
        }
        if (!std::isfinite(got)) return INFINITY;
        worst = std::max(worst, std::abs(got - want));
        largest = std::max(largest, std::abs(want));
      }
    }
  }
  return worst / largest;
}

// The index scores that count the top-k's histogram, over `scores`' inputs: the same scores as
// the scores kernel, bit for bit, and the histogram the histogram kernel counts of them (both
// outputs zeroed first, as MLX zeroes them). Returns the number of values that differ.
template <typename TQ, typename TK, int HEADS, int W, int LQ, bool RANGES, bool CAUSAL>
double counted(int B, int T, int cap, const std::vector<std::pair<int, int>>& ranges, uint32_t seed) {
  const ScoreInputs<TQ, TK, HEADS, W, LQ, RANGES, CAUSAL> in(B, T, cap, ranges, seed);
  std::vector<float> plain(size_t(B) * LQ * T, NAN), scores(size_t(B) * LQ * T, 0.f);
  std::vector<uint> hist(size_t(B) * LQ * 2048, 0u), want(size_t(B) * LQ * 2048, 0u);
  in.score(plain);
  dispatch(in.grid(), 128, [&](const Attributes& a) {
    lc_scores_counted<HEADS, W, LQ, RANGES, CAUSAL, TQ, float, TK>(in.qt.data(), in.qs, in.qst, in.w.data(), in.ws, in.wst,
                                                                   in.kt.data(), in.ks, in.kst, in.bounds.data(), in.rs,
                                                                   in.one, scores.data(), hist.data(), a);
  });
  const int shape[3] = {B, LQ, T};
  const int64_t strides[3] = {int64_t(LQ) * T, T, 1};
  dispatch({uint((T + 4095) / 4096), uint(LQ), uint(B)}, 256,
           [&](const Attributes& a) { lc_topk_hist(plain.data(), shape, strides, want.data(), a); });
  double wrong = 0;
  for (size_t i = 0; i < plain.size(); i++) wrong += std::memcmp(&plain[i], &scores[i], sizeof(float)) != 0;
  for (size_t i = 0; i < hist.size(); i++) wrong += hist[i] != want[i];
  return wrong;
}

}  // namespace

int main() {
  struct Case {
    const char* what;
    double error;
  };
  const Case cases[] = {
      {"float32, 20 heads, padded and ragged rows, strided views, 5 splits",
       run<float, 64, 32, 20, 1, false>(2, 300, 320, {{0, 300}, {7, 290}}, 5, 1)},
      {"bfloat16, 8 heads x 3 causal queries (verify), padded and ragged rows, 3 splits",
       run<bfloat16_t, 128, 64, 8, 3, true>(2, 150, 150, {{0, 150}, {20, 131}}, 3, 2)},
      {"bfloat16, GLM-5.2's widths and 64 heads, 2 splits",
       run<bfloat16_t, 512, 64, 64, 1, false>(1, 100, 128, {{0, 100}}, 2, 3)},
      {"float16, 5 heads x 2 queries unmasked, 8 splits (three of them empty)",
       run<float16_t, 64, 32, 5, 2, false>(1, 40, 40, {{0, 40}}, 8, 4)},
      {"index scores: bfloat16 keys of a wider buffer, 4 heads x 2 causal queries, padded and ragged rows",
       scores<bfloat16_t, bfloat16_t, 4, 32, 2, true, true>(2, 300, 320, {{0, 300}, {7, 290}}, 11)},
      {"index scores: float16, GLM-5.2's 32 heads of 128, one query, whole rows",
       scores<float16_t, float16_t, 32, 128, 1, false, false>(1, 130, 130, {{0, 130}}, 12)},
      {"bfloat16, GLM-5.2's widths, 64 heads, 2 rows each reading 50 selected positions out of order (one bounded), 3 splits",
       run<bfloat16_t, 512, 64, 64, 1, false, true>(2, 90, 96, {{0, 90}, {10, 60}}, 3, 5, selection(2, 50, 90))},
      {"float32, 20 heads, selected positions outside the window read clamped into it",
       run<float, 64, 32, 20, 1, false, true>(1, 30, 32, {{0, 30}}, 2, 6, {-4, 3, 29, 40, 7, 2147483647, 0, 11, -2147483647 - 1, 5, 28, 1})},
      {"bfloat16, a prefill chunk: 6 queries each a row over one broadcast buffer, 40 selected, causal bounds",
       run<bfloat16_t, 512, 64, 64, 1, false, true>(6, 90, 96, {{0, 85}, {0, 86}, {0, 87}, {0, 88}, {0, 89}, {0, 90}}, 3, 15,
                                                   selection(6, 40, 91), true)},
      {"float16, a prefill chunk as the library views it: 8 transposed queries each a row over one broadcast buffer, "
       "selections naming positions twice, before the first and past the last, causal bounds",
       run<float16_t, 128, 64, 8, 1, false, true>(8, 70, 70, {{0, 63}, {0, 64}, {0, 65}, {0, 66}, {0, 67}, {0, 68}, {0, 69}, {0, 70}},
                                                  2, 16, unruly(selection(8, 30, 70)), true, true)},
  };
  int failed = 0;
  for (const auto& c : cases) {
    const bool ok = c.error <= 1e-4;
    std::printf("%s: %s (largest difference %.3g of the largest output)\n", ok ? "ok" : "FAILED", c.what, c.error);
    failed += !ok;
  }
  const Case selections[] = {
      {"top-300 of 5000 scores from 50 values, 2 rows x 2 queries", top_k<300>(2, 2, 5000, 50, 7)},
      {"top-3 of 100 scores (fewer than the threads) from 4 values", top_k<3>(1, 1, 100, 4, 8)},
      {"top-2048 of 9001 distinct-ish scores", top_k<2048>(1, 1, 9001, 1 << 20, 9)},
      {"top-699 of 700 scores from 3 values", top_k<699>(1, 2, 700, 3, 10)},
      // Bins of more keys than the list holds: narrowed by a further read of the row (a list of
      // 64 for 6000 scores of 400 values), and to a tie at the K-th where even that is too few
      // (20000 scores of 3 values).
      {"top-100 of 6000 scores from 400 values, a list of 64", top_k<100, 64>(1, 2, 6000, 400, 11)},
      {"top-2048 of 20000 scores from 3 values", top_k<2048>(1, 1, 20000, 3, 12)},
  };
  for (const auto& c : selections) {
    const bool ok = c.error == 0;
    std::printf("%s: %s (%g positions differ from the host's)\n", ok ? "ok" : "FAILED", c.what, c.error);
    failed += !ok;
  }
  // The scores kernel counting the histogram: padded, ragged and causal rows over threadgroups.
  const Case counts[] = {
      {"counted index scores: bfloat16 keys of a wider buffer, 4 heads x 2 causal queries, padded rows",
       counted<bfloat16_t, bfloat16_t, 4, 32, 2, true, true>(2, 300, 320, {{0, 300}, {7, 290}}, 13)},
      {"counted index scores: float16, GLM-5.2's 32 heads of 128, one query, 3 rows of 700",
       counted<float16_t, float16_t, 32, 128, 1, false, false>(3, 700, 700, {{0, 700}, {0, 700}, {0, 700}}, 14)},
  };
  for (const auto& c : counts) {
    const bool ok = c.error == 0;
    std::printf("%s: %s (%g scores or counts differ)\n", ok ? "ok" : "FAILED", c.what, c.error);
    failed += !ok;
  }
  return failed ? 1 : 0;
}
