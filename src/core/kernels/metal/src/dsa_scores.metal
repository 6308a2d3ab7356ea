//! Body of the Metal DSA index-score kernel: `kernels::cuda::dsa_scores`' formula, one thread a
//! position, the block's queries and weights in threadgroup memory. With LC_SCORES_COUNT (the
//! header `dsa_scores_counted.h.metal`) it also counts the top-k's histogram of its scores, as
//! `dsa_topk_hist.metal` counts them.

  constexpr int THREADS = 128;
  threadgroup float sq[HI * W];
  threadgroup float sw[HI];
#if LC_SCORES_COUNT
  threadgroup atomic_uint counts[2048];
#endif
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int qi = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int T = keys_shape[1];
  const int t = static_cast<int>(threadgroup_position_in_grid.x) * THREADS + tid;
  for (int i = tid; i < HI * W; i += THREADS) {
    const int h = i / W, c = i % W;
    sq[i] = static_cast<float>(q_index[b * q_index_strides[0] + h * q_index_strides[1] + qi * q_index_strides[2] +
                                       c * q_index_strides[3]]);
  }
  for (int h = tid; h < HI; h += THREADS) {
    sw[h] = static_cast<float>(weights[b * weights_strides[0] + qi * weights_strides[1] + h * weights_strides[2]]);
  }
#if LC_SCORES_COUNT
  for (int i = tid; i < 2048; i += THREADS) atomic_store_explicit(&counts[i], 0u, memory_order_relaxed);
#endif
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (t < T) {
    // The row's visible window, less the later positions a causal query does not see.
    const int lo = RANGES ? ranges[2 * b] : 0;
    const int hi = (RANGES ? ranges[2 * b + 1] : T) - (CAUSAL ? LQ - 1 - qi : 0);
    device float* row = scores + (static_cast<int64_t>(b) * LQ + qi) * T;
    // -inf, written as bits whatever the math mode.
    float s = as_type<float>(0xff800000u);
    if (t >= lo && t < hi) {
      float acc[HI];
      for (int h = 0; h < HI; h++) acc[h] = 0.f;
      const int64_t base = b * keys_strides[0] + t * keys_strides[1];
      for (int c = 0; c < W; c++) {
        const float k = static_cast<float>(keys[base + c * keys_strides[2]]);
        for (int h = 0; h < HI; h++) acc[h] = fma(sq[h * W + c], k, acc[h]);
      }
      s = 0.f;
      for (int h = 0; h < HI; h++) s = fma(sw[h], max(acc[h], 0.f), s);
    }
    row[t] = s;
#if LC_SCORES_COUNT
    atomic_fetch_add_explicit(&counts[lc_order_key(s) >> 21], 1u, memory_order_relaxed);
#endif
  }
#if LC_SCORES_COUNT
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device atomic_uint* out = (device atomic_uint*)hist + (static_cast<int64_t>(b) * LQ + qi) * 2048;
  for (int i = tid; i < 2048; i += THREADS) {
    const uint c = atomic_load_explicit(&counts[i], memory_order_relaxed);
    if (c != 0u) atomic_fetch_add_explicit(&out[i], c, memory_order_relaxed);
  }
#endif
