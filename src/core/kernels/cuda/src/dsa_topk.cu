//! Body of the DSA top-k kernel: one block of 512 threads per (row, query).

  constexpr int THREADS = 512, WARPS = THREADS / 32, BINS = 2048;
  // Scores each thread (a lane, in the collecting passes) loads before it uses any, so that U
  // independent reads are in flight rather than one at a time.
  constexpr int U = 16;
  __shared__ unsigned int hist[BINS];
  __shared__ unsigned int s_bin, s_need;
  __shared__ unsigned int s_counts[2 * WARPS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, qi = blockIdx.y, b = blockIdx.z;
  const int T = scores_shape[2];
  const long long s2 = scores_strides[2];
  const float* row = scores + b * scores_strides[0] + qi * scores_strides[1];
  // Scores as unsigned keys in the same order (negative floats' bits reversed, positive ones'
  // sign set), so that -inf (a position the query does not see) is below every finite score.
  // Positions past the row read as key 0, which no pass counts or takes.
  auto key = [&](int t) -> unsigned int {
    if (t >= T) return 0u;
    const unsigned int u = __float_as_uint(row[t * s2]);
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  };

  // Radix select of the K-th largest key, 11, 11 and 10 bits at a time from the top: each pass
  // counts the keys that match the bits found so far by their next bits, and the bin where the
  // count from the top reaches the keys still needed is the next bits of the K-th largest.
  unsigned int prefix = 0, mask = 0, need = K;
  #pragma unroll 1
  for (int pass = 0; pass < 3; pass++) {
    const int shift = pass == 0 ? 21 : pass == 1 ? 10 : 0, bits = pass == 2 ? 10 : 11;
    for (int i = tid; i < BINS; i += THREADS) hist[i] = 0;
    __syncthreads();
    // (The loop's bound is the same for every thread: a warp's lanes match bins together.)
    for (int base = 0; base < T; base += THREADS * U) {
      unsigned int k[U];
      #pragma unroll
      for (int u = 0; u < U; u++) k[u] = key(base + u * THREADS + tid);
      #pragma unroll
      for (int u = 0; u < U; u++) {
        // Scores cluster in few bins (one exponent holds most of a row): the lanes of a warp
        // that share a bin add to it once, with their count (key 0 counts nowhere).
        const bool counted = k[u] != 0u && (k[u] & mask) == prefix;
        const unsigned int bin = counted ? (k[u] >> shift) & ((1u << bits) - 1) : 0xffffffffu;
        const unsigned int peers = __match_any_sync(0xffffffffu, bin);
        if (counted && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
      }
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins [64 l, 64 l + 64); `above` counts the keys in the lanes above it.
      unsigned int sum = 0;
      for (int j = 0; j < BINS / 32; j++) sum += hist[lane * (BINS / 32) + j];
      unsigned int from_here = sum;
      #pragma unroll
      for (int off = 1; off < 32; off <<= 1) {
        const unsigned int v = __shfl_down_sync(0xffffffffu, from_here, off);
        if (lane + off < 32) from_here += v;
      }
      unsigned int above = from_here - sum;
      if (above < need && need <= from_here) {
        for (int j = BINS / 32 - 1; j >= 0; j--) {
          const unsigned int c = hist[lane * (BINS / 32) + j];
          if (above + c >= need) {
            s_bin = lane * (BINS / 32) + j;
            s_need = need - above;
            break;
          }
          above += c;
        }
      }
    }
    __syncthreads();
    prefix |= s_bin << shift;
    mask |= ((1u << bits) - 1) << shift;
    need = s_need;
  }
  // `prefix` is the K-th largest key; K - need keys are above it and `need` of those equal to it
  // are taken, the first by position. Each warp walks its own stretch of positions (coalesced
  // reads, counted by ballots), once to count, once to write: positions above the K-th largest
  // first, in order, then the ties, in order, so the result does not depend on scheduling.
  const int stretch = (T + WARPS * 32 * U - 1) / (WARPS * 32 * U) * 32 * U;
  const int lo = min(T, warp * stretch), hi = min(T, lo + stretch);
  unsigned int n_gt = 0, n_eq = 0;
  for (int base = lo; base < hi; base += 32 * U) {
    unsigned int k[U];
    #pragma unroll
    for (int u = 0; u < U; u++) k[u] = base + u * 32 + lane < hi ? key(base + u * 32 + lane) : 0u;
    #pragma unroll
    for (int u = 0; u < U; u++) {
      n_gt += __popc(__ballot_sync(0xffffffffu, k[u] > prefix));
      n_eq += __popc(__ballot_sync(0xffffffffu, k[u] == prefix));
    }
  }
  if (lane == 0) {
    s_counts[warp] = n_gt;
    s_counts[WARPS + warp] = n_eq;
  }
  __syncthreads();
  unsigned int gt_at = 0, eq_at = 0;
  for (int w = 0; w < warp; w++) {
    gt_at += s_counts[w];
    eq_at += s_counts[WARPS + w];
  }
  int* out = top + (static_cast<long long>(b) * gridDim.y + qi) * K;
  const unsigned int below = (1u << lane) - 1;  // the lanes before this one
  for (int base = lo; base < hi; base += 32 * U) {
    unsigned int k[U];
    #pragma unroll
    for (int u = 0; u < U; u++) k[u] = base + u * 32 + lane < hi ? key(base + u * 32 + lane) : 0u;
    #pragma unroll
    for (int u = 0; u < U; u++) {
      const int t = base + u * 32 + lane;
      const unsigned int gt = __ballot_sync(0xffffffffu, k[u] > prefix);
      const unsigned int eq = __ballot_sync(0xffffffffu, k[u] == prefix);
      if (k[u] > prefix) out[gt_at + __popc(gt & below)] = t;
      if (k[u] == prefix) {
        const unsigned int e = eq_at + __popc(eq & below);
        if (e < need) out[K - need + e] = t;
      }
      gt_at += __popc(gt);
      eq_at += __popc(eq);
    }
  }
