//! Body of the Metal DSA top-k's first kernel: `kernels::cuda::dsa_topk`'s histogram, each row's
//! keys counted by their top 11 bits, a threadgroup of 256 per 4096 positions of a (row, query),
//! summed into `hist` (zeroed by MLX) by one device atomic add per bin it saw.

  constexpr int THREADS = 256, U = 16, BINS = 2048;
  threadgroup atomic_uint h[BINS];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int qi = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int LQ = static_cast<int>(threadgroups_per_grid.y);
  const int T = scores_shape[2];
  const int64_t s2 = scores_strides[2];
  const device float* row = scores + b * scores_strides[0] + qi * scores_strides[1];
  for (int i = tid; i < BINS; i += THREADS) atomic_store_explicit(&h[i], 0u, memory_order_relaxed);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  const int t0 = static_cast<int>(threadgroup_position_in_grid.x) * THREADS * U;
  uint k[U];
  for (int u = 0; u < U; u++) {
    const int t = t0 + u * THREADS + tid;
    k[u] = t < T ? lc_order_key(row[t * s2]) : 0u;
  }
  for (int u = 0; u < U; u++) {
    if (k[u] != 0u) atomic_fetch_add_explicit(&h[k[u] >> 21], 1u, memory_order_relaxed);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  device atomic_uint* out = (device atomic_uint*)hist + (static_cast<int64_t>(b) * LQ + qi) * BINS;
  for (int i = tid; i < BINS; i += THREADS) {
    const uint c = atomic_load_explicit(&h[i], memory_order_relaxed);
    if (c != 0u) atomic_fetch_add_explicit(&out[i], c, memory_order_relaxed);
  }
