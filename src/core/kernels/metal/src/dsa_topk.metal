//! Body of the Metal DSA top-k's second kernel: `kernels::cuda::dsa_topk`'s selection, one
//! threadgroup of 512 threads per (row, query), SIMD groups of 32 in place of warps. From the
//! first kernel's histogram it finds the bin of the K-th largest key; the first bin (of one
//! digit or more) that holds at most CAP keys is collected in one read of the row, keys above it
//! into a bitmap of positions and its own keys into a list in threadgroup memory, where the
//! remaining digits are found among them alone; the bitmaps then give the positions in order.

  constexpr int THREADS = 512, SIMDS = THREADS / 32, BINS = 2048, PER_LANE = BINS / 32;
  // Scores each lane loads before it uses any (independent loads in flight).
  constexpr int U = 16;
  threadgroup atomic_uint hist_tg[BINS];
  threadgroup atomic_uint n_cand;
  threadgroup uint found[3];
  threadgroup uint ckey[CAP];
  threadgroup int cpos[CAP];
  threadgroup uint sums[SIMDS];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int lane = static_cast<int>(thread_index_in_simdgroup), sg = static_cast<int>(simdgroup_index_in_threadgroup);
  const int qi = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int LQ = static_cast<int>(threadgroups_per_grid.y);
  const int T = scores_shape[2], words = (T + 31) / 32;
  const int64_t s2 = scores_strides[2];
  const device float* row = scores + b * scores_strides[0] + qi * scores_strides[1];
  const int64_t at = static_cast<int64_t>(b) * LQ + qi;
  // The row's two bitmaps (scratch output): positions above the K-th largest key, ties at it.
  device uint* above = bits + at * 2 * words;
  device uint* ties = above + words;
  if (tid == 0) atomic_store_explicit(&n_cand, 0u, memory_order_relaxed);

  uint prefix = 0, mask = 0, need = K;
  bool collected = false, exact = false;
  for (int level = 0; level < 3; level++) {
    const int shift = level == 0 ? 21 : level == 1 ? 10 : 0;
    const uint digit = level == 2 ? 0x3ffu : 0x7ffu;
    // This digit's histogram among the keys matching the digits found: the first kernel's for
    // the top one; then from the row where nothing is collected yet, else from the list.
    if (level == 0) {
      for (int i = tid; i < BINS; i += THREADS) atomic_store_explicit(&hist_tg[i], hist[at * BINS + i], memory_order_relaxed);
    } else {
      for (int i = tid; i < BINS; i += THREADS) atomic_store_explicit(&hist_tg[i], 0u, memory_order_relaxed);
      threadgroup_barrier(mem_flags::mem_threadgroup);
      if (!collected) {
        for (int base = 0; base < T; base += THREADS * U) {
          uint k[U];
          for (int u = 0; u < U; u++) {
            const int t = base + u * THREADS + tid;
            k[u] = t < T ? lc_order_key(row[t * s2]) : 0u;
          }
          for (int u = 0; u < U; u++) {
            if (k[u] != 0u && (k[u] & mask) == prefix) {
              atomic_fetch_add_explicit(&hist_tg[(k[u] >> shift) & digit], 1u, memory_order_relaxed);
            }
          }
        }
      } else {
        const int n = min(static_cast<int>(atomic_load_explicit(&n_cand, memory_order_relaxed)), CAP);
        for (int i = tid; i < n; i += THREADS) {
          if ((ckey[i] & mask) == prefix) atomic_fetch_add_explicit(&hist_tg[(ckey[i] >> shift) & digit], 1u, memory_order_relaxed);
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (sg == 0) {
      // Lane l holds the bins of group 31 - l (lane 0 the highest), so the keys above a lane's
      // bins are the exclusive prefix sum of the lanes before it.
      const int first = (31 - lane) * PER_LANE;
      uint sum = 0;
      for (int j = 0; j < PER_LANE; j++) sum += atomic_load_explicit(&hist_tg[first + j], memory_order_relaxed);
      uint before = simd_prefix_exclusive_sum(sum);
      if (before < need && need <= before + sum) {
        for (int j = PER_LANE - 1; j >= 0; j--) {
          const uint c = atomic_load_explicit(&hist_tg[first + j], memory_order_relaxed);
          if (before + c >= need) {
            found[0] = static_cast<uint>(first + j);
            found[1] = need - before;
            found[2] = c;
            break;
          }
          before += c;
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    prefix |= found[0] << shift;
    mask |= digit << shift;
    need = found[1];
    if (collected || (found[2] > CAP && level < 2)) continue;
    // One read of the row: keys above the bin into `above`, a word (32 positions) a SIMD group's
    // OR; the bin's keys into `ties` where the K-th largest key is known, else into the list.
    // Each SIMD group walks its own stretch of whole words.
    collected = true;
    exact = level == 2;
    const int stretch = (words + SIMDS - 1) / SIMDS * 32;
    const int lo = min(T, sg * stretch), hi = min(T, lo + stretch);
    for (int base = lo; base < hi; base += 32 * U) {
      uint k[U];
      for (int u = 0; u < U; u++) {
        const int t = base + u * 32 + lane;
        k[u] = t < hi ? lc_order_key(row[t * s2]) : 0u;
      }
      for (int u = 0; u < U && base + u * 32 < hi; u++) {
        const int t = base + u * 32 + lane;
        const uint km = k[u] & mask;
        const bool gt = k[u] != 0u && km > prefix, eq = k[u] != 0u && km == prefix;
        const uint gw = simd_or(gt ? 1u << lane : 0u), ew = simd_or(eq ? 1u << lane : 0u);
        if (lane == 0) {
          above[t >> 5] = gw;
          ties[t >> 5] = exact ? ew : 0u;
        }
        if (!exact && ew != 0u) {
          uint first = 0;
          if (lane == 0) first = atomic_fetch_add_explicit(&n_cand, popcount(ew), memory_order_relaxed);
          first = simd_sum(first);
          // (The bin holds at most CAP keys: the histogram counted them; the bound is kept anyway.)
          const uint i = first + simd_prefix_exclusive_sum(eq ? 1u : 0u);
          if (eq && i < uint(CAP)) {
            ckey[i] = k[u];
            cpos[i] = t;
          }
        }
      }
    }
    threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  }
  // The list's keys above the K-th largest key, and its ties, into the bitmaps.
  if (!exact) {
    device atomic_uint* map = (device atomic_uint*)above;
    const int n = min(static_cast<int>(atomic_load_explicit(&n_cand, memory_order_relaxed)), CAP);
    for (int i = tid; i < n; i += THREADS) {
      const uint word = 1u << (cpos[i] & 31);
      if (ckey[i] > prefix) atomic_fetch_or_explicit(&map[cpos[i] >> 5], word, memory_order_relaxed);
      if (ckey[i] == prefix) atomic_fetch_or_explicit(&map[words + (cpos[i] >> 5)], word, memory_order_relaxed);
    }
  }
  threadgroup_barrier(mem_flags::mem_device);

  // The positions in order: K - need above the K-th largest key, then the first `need` ties.
  // Each thread takes a run of words; a threadgroup scan of their counts gives where it writes.
  device int* out = top + at * K;
  const int per = (words + THREADS - 1) / THREADS, w0 = min(words, tid * per), w1 = min(words, w0 + per);
  for (int pass = 0; pass < 2; pass++) {
    const device uint* map = pass == 0 ? above : ties;
    uint n = 0;
    for (int w = w0; w < w1; w++) n += popcount(map[w]);
    const uint in_simd = simd_prefix_exclusive_sum(n), simd_total = simd_sum(n);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (lane == 0) sums[sg] = simd_total;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    uint i = in_simd + (pass == 0 ? 0u : uint(K) - need);
    for (int s = 0; s < sg; s++) i += sums[s];
    const uint end = pass == 0 ? uint(K) - need : uint(K);
    for (int w = w0; w < w1 && i < end; w++) {
      uint m = map[w];
      while (m != 0u && i < end) {
        out[i++] = w * 32 + static_cast<int>(ctz(m));
        m &= m - 1;
      }
    }
  }
