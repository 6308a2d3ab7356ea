//! Body of the Metal DSA top-k kernel: `kernels::cuda::dsa_topk`'s algorithm, one threadgroup of
//! 512 threads per (row, query), SIMD groups of 32 in place of warps.

  constexpr int THREADS = 512, SIMDS = THREADS / 32, BINS = 2048, PER_LANE = BINS / 32;
  // Scores each thread loads before it uses any (independent loads in flight, as on CUDA).
  constexpr int U = 16;
  threadgroup atomic_uint hist[BINS];
  threadgroup uint found[2];
  threadgroup uint counts[2 * SIMDS];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int lane = static_cast<int>(thread_index_in_simdgroup), sg = static_cast<int>(simdgroup_index_in_threadgroup);
  const int qi = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int LQ = static_cast<int>(threadgroups_per_grid.y);
  const int T = scores_shape[2];
  const int64_t s2 = scores_strides[2];
  const device float* row = scores + b * scores_strides[0] + qi * scores_strides[1];

  // Radix select of the K-th largest key, 11, 11 and 10 bits at a time from the top.
  uint prefix = 0, mask = 0, need = K;
  for (int pass = 0; pass < 3; pass++) {
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0, bits = pass == 2 ? 10 : 11;
    for (int i = tid; i < BINS; i += THREADS) atomic_store_explicit(&hist[i], 0u, memory_order_relaxed);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int base = 0; base < T; base += THREADS * U) {
      uint k[U];
      for (int u = 0; u < U; u++) {
        const int t = base + u * THREADS + tid;
        k[u] = t < T ? lc_order_key(row[t * s2]) : 0u;
      }
      for (int u = 0; u < U; u++) {
        if (k[u] != 0u && (k[u] & mask) == prefix) {
          atomic_fetch_add_explicit(&hist[(k[u] >> shift) & ((1u << bits) - 1)], 1u, memory_order_relaxed);
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
      // Lane l holds the bins of group 31 - l (lane 0 the highest), so the keys above a lane's
      // bins are the exclusive prefix sum of the lanes before it.
      const int first = (31 - lane) * PER_LANE;
      uint sum = 0;
      for (int j = 0; j < PER_LANE; j++) sum += atomic_load_explicit(&hist[first + j], memory_order_relaxed);
      uint above = simd_prefix_exclusive_sum(sum);
      if (above < need && need <= above + sum) {
        for (int j = PER_LANE - 1; j >= 0; j--) {
          const uint c = atomic_load_explicit(&hist[first + j], memory_order_relaxed);
          if (above + c >= need) {
            found[0] = static_cast<uint>(first + j);
            found[1] = need - above;
            break;
          }
          above += c;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    prefix |= found[0] << shift;
    mask |= ((1u << bits) - 1) << shift;
    need = found[1];
  }
  // `prefix` is the K-th largest key: positions above it first, in order, then the first `need`
  // ties, in order; each SIMD group counts, then writes, its own stretch of positions.
  // Positions past the stretch read as key 0, which nothing takes.
  const int stretch = (T + SIMDS * 32 * U - 1) / (SIMDS * 32 * U) * 32 * U;
  const int lo = min(T, sg * stretch), hi = min(T, lo + stretch);
  uint n_gt = 0, n_eq = 0;
  for (int base = lo; base < hi; base += 32 * U) {
    uint k[U];
    for (int u = 0; u < U; u++) {
      const int t = base + u * 32 + lane;
      k[u] = t < hi ? lc_order_key(row[t * s2]) : 0u;
    }
    for (int u = 0; u < U; u++) {
      n_gt += simd_sum(static_cast<uint>(k[u] > prefix));
      n_eq += simd_sum(static_cast<uint>(k[u] == prefix));
    }
  }
  if (lane == 0) {
    counts[sg] = n_gt;
    counts[SIMDS + sg] = n_eq;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  uint gt_at = 0, eq_at = 0;
  for (int w = 0; w < sg; w++) {
    gt_at += counts[w];
    eq_at += counts[SIMDS + w];
  }
  device int* out = top + (static_cast<int64_t>(b) * LQ + qi) * K;
  for (int base = lo; base < hi; base += 32 * U) {
    uint k[U];
    for (int u = 0; u < U; u++) {
      const int t = base + u * 32 + lane;
      k[u] = t < hi ? lc_order_key(row[t * s2]) : 0u;
    }
    for (int u = 0; u < U; u++) {
      const int t = base + u * 32 + lane;
      const uint gt = static_cast<uint>(k[u] > prefix), eq = static_cast<uint>(k[u] == prefix);
      const uint gt_off = simd_prefix_exclusive_sum(gt), eq_off = simd_prefix_exclusive_sum(eq);
      if (gt) out[gt_at + gt_off] = t;
      if (eq && eq_at + eq_off < need) out[K - need + eq_at + eq_off] = t;
      gt_at += simd_sum(gt);
      eq_at += simd_sum(eq);
    }
  }
