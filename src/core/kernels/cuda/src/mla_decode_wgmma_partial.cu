//! The wgmma partial pass's body, part 2: producer and consumer warpgroups.
  const int wg = tid >> 7, r0 = (warp & 3) * 16 + g;
  auto core = [](int row, int c, int rows) { return ((c >> 3) * (rows / 8) + (row >> 3)) * 64 + (row & 7) * 8 + (c & 7); };

  // Query rows h0.. (row h is head h / LQ's query h % LQ; rows past H are zero), by every thread.
  if (qvec) {
    for (int it = warp; it < (M / 8) * (D / 32); it += THREADS / 32) {
      const int r = (it % (M / 8)) * 8 + (lane & 7), c = ((it / (M / 8)) * 4 + (lane >> 3)) * 8, h = h0 + r;
      const uint16_t* src = h >= H ? qlat
                            : c < R ? qlat + b * q0 + (h / LQ) * q1 + (h % LQ) * q2 + c
                                    : qrop + b * p0 + (h / LQ) * p1 + (h % LQ) * p2 + (c - R);
      lc_cp_async16(sq + core(r, c, M), src, h < H);
    }
    asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::);
  } else {
    for (int i = tid; i < M * D; i += THREADS) {
      const int r = i / D, c = i % D, h = h0 + r;
      uint16_t v = 0;
      if (h < H) {
        v = c < R ? qlat[b * q0 + (h / LQ) * q1 + (h % LQ) * q2 + c * q3]
                  : qrop[b * p0 + (h / LQ) * p1 + (h % LQ) * p2 + (c - R) * p3];
      }
      sq[core(r, c, M)] = v;
    }
  }
  if (tid == 0) {
    for (int i = 0; i < STAGES; i++) {
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(lc_smem_addr(full + i)), "r"(128));
      asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" :: "r"(lc_smem_addr(empty + i)), "r"(8));
    }
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::);
  }
  asm volatile("fence.proxy.async.shared::cta;\n" ::);
  __syncthreads();

  if (wg == 2) {
    // The producer warpgroup gives most of its registers to the other two and streams tiles
    // into the key buffers, STAGES ahead of the warpgroups computing on them.
    asm volatile("setmaxnreg.dec.sync.aligned.u32 64;\n" ::);
    const int pw = warp - 8;
    // Each step copies 8 positions by 32 channels: a phase of 8 lanes fills one core matrix (no
    // bank conflicts) and neighbouring lanes read neighbouring 16 bytes of a stored row.
    int i = 0;
    for (int tile = begin; tile < end; tile += N, i++) {
      const int st = i % STAGES;
      if (i >= STAGES) lc_wait(empty + st, ((i / STAGES) & 1) ^ 1);
      uint16_t* sk = sk0 + st * KT;
      auto kcore = [](int r, int c) { return (c >> 3) * CS + (r >> 3) * 64 + (r & 7) * 8 + (c & 7); };
      if (vec) {
        for (int it = pw; it < (N / 8) * (D / 32); it += 4) {
          const int r = (it % (N / 8)) * 8 + (lane & 7), c = ((it / (N / 8)) * 4 + (lane >> 3)) * 8, pos = tile + r;
          const bool in = pos < end;
          const uint16_t* src = !in ? lat : c < R ? lat + b * l0 + at(pos) * l1 + c : rop + b * r0s + at(pos) * r1s + (c - R);
          lc_cp_async16(sk + kcore(r, c), src, in);
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(lc_smem_addr(full + st)));
      } else {
        for (int e = tid - 256; e < N * D; e += 128) {
          const int r = e / D, c = e % D, pos = tile + r;
          uint16_t v = 0;
          if (pos < end) v = c < R ? lat[b * l0 + at(pos) * l1 + c * l2] : rop[b * r0s + at(pos) * r1s + (c - R) * r2s];
          sk[kcore(r, c)] = v;
        }
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(lc_smem_addr(full + st)));
      }
    }
    asm volatile("cp.async.wait_all;\n" ::);
    // In a cluster the producers join the epilogue's two cluster barriers (`..._cluster.cu`).
    if constexpr (CLUSTER != 0) {
      cg::this_cluster().sync();
      cg::this_cluster().sync();
    }
    return;
  }

  // The two warpgroups: each computes every score of a tile and its half of the output channels.
  asm volatile("setmaxnreg.inc.sync.aligned.u32 216;\n" ::);
  float m[2] = {LC_NEG_INF, LC_NEG_INF}, l[2] = {0.f, 0.f};
  int lim[2];
  #pragma unroll
  for (int i = 0; i < 2; i++) lim[i] = CAUSAL ? min(end, hi - LQ + 1 + (h0 + r0 + 8 * i) % LQ) : end;
  // Output accumulators: rows r0, r0 + 8 by this warpgroup's channels wg * NC + 8j + 2t, + 1.
  float o[NC / 2];
  #pragma unroll
  for (int j = 0; j < NC / 2; j++) o[j] = 0.f;

  int i = 0;
  for (int tile = begin; tile < end; tile += N, i++) {
    const int st = i % STAGES;
    lc_wait(full + st, (i / STAGES) & 1);
    // The producer's copies, seen through the barrier, are made visible to the tensor cores.
    asm volatile("fence.proxy.async.shared::cta;\n" ::);
    const uint16_t* sk = sk0 + st * KT;

    float s[16];
    #pragma unroll
    for (int j = 0; j < 16; j++) s[j] = 0.f;
    asm volatile("wgmma.fence.sync.aligned;\n" ::);
    #pragma unroll
    for (int ks = 0; ks < KS; ks++) {
      lc_wg_ss(s, lc_desc(sq + ks * 2 * (M / 8) * 64, (M / 8) * 128, 128),
               lc_desc(sk + ks * 2 * CS, CS * 2, 128), BF16);
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::);

    // Online softmax in registers: element (j, e) is row r0 + 8 (e >> 1), position
    // tile + 8j + 2t + (e & 1); a row's four threads are neighbouring lanes.
    float mx[2] = {LC_NEG_INF, LC_NEG_INF};
    #pragma unroll
    for (int j = 0; j < 4; j++) {
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int k = e >> 1;
        const int pos = tile + 8 * j + 2 * t + (e & 1);
        const float v = pos < lim[k] && seen(pos) ? s[4 * j + e] * sc : LC_NEG_INF;
        s[4 * j + e] = v;
        mx[k] = fmaxf(mx[k], v);
      }
    }
    float alpha[2], sum[2] = {0.f, 0.f};
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffff, mx[k], 1));
      mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffff, mx[k], 2));
      const float m_new = fmaxf(m[k], mx[k]);
      alpha[k] = m_new == LC_NEG_INF ? 1.f : exp2f(m[k] - m_new);
      m[k] = m_new;
    }
    #pragma unroll
    for (int j = 0; j < 4; j++) {
      #pragma unroll
      for (int e = 0; e < 4; e++) {
        const int k = e >> 1;
        const float p = m[k] == LC_NEG_INF ? 0.f : exp2f(s[4 * j + e] - m[k]);
        s[4 * j + e] = p;
        sum[k] += p;
      }
    }
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      sum[k] += __shfl_xor_sync(0xffffffff, sum[k], 1);
      sum[k] += __shfl_xor_sync(0xffffffff, sum[k], 2);
      l[k] = l[k] * alpha[k] + sum[k];
    }
    #pragma unroll
    for (int j = 0; j < NC / 8; j++) {
      o[4 * j] *= alpha[0]; o[4 * j + 1] *= alpha[0]; o[4 * j + 2] *= alpha[1]; o[4 * j + 3] *= alpha[1];
    }
    // The probabilities as the products' A fragments: step kk takes positions 16kk.. .
    uint32_t pa[2][4];
    #pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      #pragma unroll
      for (int q = 0; q < 4; q++) pa[kk][q] = lc_pack(s[8 * kk + 2 * q], s[8 * kk + 2 * q + 1], BF16);
    }
    // Output: this warpgroup's channels, 64 at a time; the latent read N-major from the tile.
    asm volatile("wgmma.fence.sync.aligned;\n" ::);
    #pragma unroll
    for (int kk = 0; kk < 2; kk++) {
      #pragma unroll
      for (int nn = 0; nn < NC / 64; nn++) {
        const int group = (wg * NC + nn * 64) / 8;
        lc_wg_rs(o + nn * 32, pa[kk], lc_desc(sk + group * CS + 2 * kk * 64, 128, CS * 2), BF16);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::);
    // This warp is done reading the buffer.
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(lc_smem_addr(empty + st)));
  }
