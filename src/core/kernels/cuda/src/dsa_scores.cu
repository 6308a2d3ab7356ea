//! Body of the DSA index scores kernel: the products on tensor cores (`mma.sync` m16n8k16), each
//! warp scoring 16 positions at a time for every head.

  static_assert(KT >= 0 && QT >= 0 && WT >= 0, "dtype tags");
  using E = typename lc_elem<decltype(keys)>::type;  // the keys' 16-bit float type
  // Positions: 16 a product's rows, TILES products a warp. Heads pad to 8 (a product's
  // columns) and channels to 16 (its depth) with zeros; a query row of PAIRS words (four over
  // half the channels) puts the eight heads one product reads in distinct banks.
  constexpr int THREADS = 256, WARPS = THREADS / 32, TILES = 2;
  constexpr int HP = (HI + 7) / 8 * 8, WP = (W + 15) / 16 * 16, PAIRS = WP / 2 + 4, STEPS = WP / 16;
  // Queries of another dtype than the keys (float32, say) are the sum of two 16-bit parts, each
  // multiplied exactly, so the scores keep about 16 bits of the queries where one part keeps 8.
  constexpr bool SPLIT = QT != KT;
  __shared__ uint32_t qhi[HP * PAIRS];
  __shared__ uint32_t qlo[SPLIT ? HP * PAIRS : 1];
  __shared__ float sw[HP];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c4 = lane & 3;
  const int qi = blockIdx.y, b = blockIdx.z;
  const int T = keys_shape[1];
#if LC_SCORES_COUNT
  // The top-k's histogram of this block's scores, as `dsa_topk_hist.cu` counts them.
  __shared__ unsigned int counts[2048];
  for (int i = tid; i < 2048; i += THREADS) counts[i] = 0;
#endif
  for (int i = tid; i < HP * (WP / 2); i += THREADS) {
    const int h = i / (WP / 2), p = i % (WP / 2);
    float v[2];
    #pragma unroll
    for (int j = 0; j < 2; j++) {
      const int c = 2 * p + j;
      v[j] = h < HI && c < W ? static_cast<float>(q_index[b * q_index_strides[0] + h * q_index_strides[1] +
                                                          qi * q_index_strides[2] + c * q_index_strides[3]])
                             : 0.f;
    }
    const E h0 = static_cast<E>(v[0]), h1 = static_cast<E>(v[1]);
    qhi[h * PAIRS + p] = lc_pack(h0, h1);
    if (SPLIT) qlo[h * PAIRS + p] = lc_pack(static_cast<E>(v[0] - static_cast<float>(h0)), static_cast<E>(v[1] - static_cast<float>(h1)));
  }
  for (int h = tid; h < HP; h += THREADS) {
    sw[h] = h < HI ? static_cast<float>(weights[b * weights_strides[0] + qi * weights_strides[1] + h * weights_strides[2]]) : 0.f;
  }
  __syncthreads();
  const int* rp = reinterpret_cast<const int*>(ranges);
  const int lo = RANGES ? rp[2 * b] : 0;
  const int hi = (RANGES ? rp[2 * b + 1] : T) - (CAUSAL ? LQ - 1 - qi : 0);
  const unsigned short* kp = reinterpret_cast<const unsigned short*>(keys);
  const long long base = b * keys_strides[0], s1 = keys_strides[1], s2 = keys_strides[2];
  // Two channels a 32-bit read where rows are contiguous and aligned (the stored buffers are).
  const bool pairs = s2 == 1 && W % 2 == 0 && s1 % 2 == 0 && base % 2 == 0 &&
                     (reinterpret_cast<unsigned long long>(keys) & 3) == 0;
  // Channels c and c + 1 of position t (zeros past the row or the width).
  auto pair = [&](int t, int c) -> uint32_t {
    if (t >= T || c >= W) return 0u;
    const long long at = base + t * s1 + c * s2;
    if (pairs) return *reinterpret_cast<const uint32_t*>(kp + at);
    return static_cast<uint32_t>(kp[at]) | (c + 1 < W ? static_cast<uint32_t>(kp[at + s2]) << 16 : 0u);
  };
  float* row = scores + (static_cast<long long>(b) * LQ + qi) * T;
  #pragma unroll 1
  for (int tile = 0; tile < TILES; tile++) {
    const int t0 = (blockIdx.x * WARPS + warp) * TILES * 16 + tile * 16;
    if (t0 >= T) break;
    // The 16 positions' keys as the products' A operands: rows g and g + 8, channels 2 c4 and
    // 2 c4 + 8 of each 16; every read issued before the first product.
    uint32_t a[STEPS][4];
    #pragma unroll
    for (int s = 0; s < STEPS; s++) {
      const int c = s * 16 + 2 * c4;
      a[s][0] = pair(t0 + g, c);
      a[s][1] = pair(t0 + g + 8, c);
      a[s][2] = pair(t0 + g, c + 8);
      a[s][3] = pair(t0 + g + 8, c + 8);
    }
    // Each lane's share of the scores of positions t0 + g and t0 + g + 8: heads 2 c4 and
    // 2 c4 + 1 of every 8.
    float s0 = 0.f, s8 = 0.f;
    #pragma unroll
    for (int n = 0; n < HP / 8; n++) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
      const int q0 = (n * 8 + g) * PAIRS + c4;
      #pragma unroll
      for (int s = 0; s < STEPS; s++) {
        lc_mma(acc, a[s][0], a[s][1], a[s][2], a[s][3], qhi[q0 + s * 8], qhi[q0 + s * 8 + 4], BF16);
        if (SPLIT) lc_mma(acc, a[s][0], a[s][1], a[s][2], a[s][3], qlo[q0 + s * 8], qlo[q0 + s * 8 + 4], BF16);
      }
      const float w0 = sw[n * 8 + 2 * c4], w1 = sw[n * 8 + 2 * c4 + 1];
      s0 += w0 * fmaxf(acc[0], 0.f) + w1 * fmaxf(acc[1], 0.f);
      s8 += w0 * fmaxf(acc[2], 0.f) + w1 * fmaxf(acc[3], 0.f);
    }
    // The four lanes of a row hold its heads in four shares.
    #pragma unroll
    for (int off = 1; off < 4; off <<= 1) {
      s0 += __shfl_xor_sync(0xffffffffu, s0, off);
      s8 += __shfl_xor_sync(0xffffffffu, s8, off);
    }
    #pragma unroll
    for (int r = 0; r < 2; r++) {
      const int t = t0 + g + 8 * r;
      const bool mine = c4 == 0 && t < T;
      const float v = t < lo || t >= hi ? __int_as_float(0xff800000) : (r == 0 ? s0 : s8);
      if (mine) row[t] = v;
#if LC_SCORES_COUNT
      lc_count(counts, mine ? lc_key(v) >> 21 : 0xffffffffu, lane);
#endif
    }
  }
#if LC_SCORES_COUNT
  __syncthreads();
  unsigned int* out = hist + (static_cast<long long>(b) * LQ + qi) * 2048;
  for (int i = tid; i < 2048; i += THREADS) {
    if (counts[i] != 0) atomicAdd(&out[i], counts[i]);
  }
#endif
