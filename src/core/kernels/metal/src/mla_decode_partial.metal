//! Body of the Metal split-K decode's partial kernel.

  constexpr int NB = 8, HB = 2, NSG = 8, M = HB * NSG, K = NB * HB, SPREAD = 32 / K;
  constexpr int D = R + P, RL = R / 32, PL = P / 32;
  threadgroup float kt[NB * D];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int lane = static_cast<int>(thread_index_in_simdgroup), sg = static_cast<int>(simdgroup_index_in_threadgroup);
  const int split = static_cast<int>(threadgroup_position_in_grid.x), S = static_cast<int>(threadgroups_per_grid.x);
  const int b = static_cast<int>(threadgroup_position_in_grid.y);
  const int r0 = static_cast<int>(threadgroup_position_in_grid.z) * M + sg * HB;
  // Split s takes positions [s * chunk, (s + 1) * chunk): whole tiles, S of them covering T.
  // GATHER: the window is a row's selected positions, `sel [B, 1, k]` naming stored positions
  // (DSA's top-k), read through it as each tile is copied in (a position outside the stored
  // buffers is read clamped into them); otherwise the stored positions themselves.
  const int T = GATHER ? sel_shape[2] : latent_shape[1], chunk = ((T + S - 1) / S + NB - 1) / NB * NB;
  const int stored = min(latent_shape[1], rope_shape[1]);
  // `ranges` bounds a row's window positions; with GATHER the window is the row's whole
  // selection and `ranges` bounds the stored positions it may name: a selected position outside
  // them is masked (a prefill chunk's causal mask, each query a row of its own).
  const int lo = GATHER ? 0 : ranges[2 * b], hi = GATHER ? T : ranges[2 * b + 1];
  const int seen_lo = ranges[2 * b], seen_hi = ranges[2 * b + 1];
  // Without GATHER `sel` is any array (the caller's stand-in, perhaps one-dimensional): its
  // strides are not read.
  const int64_t s0 = GATHER ? sel_strides[0] : 0, s2 = GATHER ? sel_strides[2] : 0;
  const int begin = max(lo, split * chunk), end = min(min(hi, T), (split + 1) * chunk);
  const float sc = scale[0] * 1.4426950408889634f;
  const int64_t q0 = q_latent_strides[0], q1 = q_latent_strides[1], q2 = q_latent_strides[2], q3 = q_latent_strides[3];
  const int64_t p0 = q_rope_strides[0], p1 = q_rope_strides[1], p2 = q_rope_strides[2], p3 = q_rope_strides[3];
  const int64_t l0 = latent_strides[0], l1 = latent_strides[1], l2 = latent_strides[2];
  const int64_t e0 = rope_strides[0], e1 = rope_strides[1], e2 = rope_strides[2];

  // This lane's channels of its SIMD group's rows' queries, scaled to log2 units: latent
  // channels lane, lane + 32, ...; then the rope's. Rows past H read row H - 1 and are not written.
  float q[HB][RL + PL];
  for (int hh = 0; hh < HB; hh++) {
    const int row = min(r0 + hh, H - 1), head = row / LQ, qi = row % LQ;
    for (int i = 0; i < RL; i++) {
      q[hh][i] = static_cast<float>(q_latent[b * q0 + head * q1 + qi * q2 + (i * 32 + lane) * q3]) * sc;
    }
    for (int i = 0; i < PL; i++) {
      q[hh][RL + i] = static_cast<float>(q_rope[b * p0 + head * p1 + qi * p2 + (i * 32 + lane) * p3]) * sc;
    }
  }
  // After the butterfly, lane l holds score (l / SPREAD): position j = (l / SPREAD) / HB of the
  // tile for row hh = (l / SPREAD) % HB of its group; it keeps that row's running max and sum.
  const int mine = (lane / SPREAD) % HB, my_row = min(r0 + mine, H - 1);
  // Causal: query i of LQ sees the row's positions up to hi - LQ + i.
  const int lim = CAUSAL ? min(end, hi - LQ + 1 + my_row % LQ) : end;
  float m_run = LC_NONE, l_run = 0.f;
  float o[HB][RL];
  for (int hh = 0; hh < HB; hh++) {
    for (int i = 0; i < RL; i++) o[hh][i] = 0.f;
  }

  for (int t0 = begin; t0 < end; t0 += NB) {
    // The previous tile is done with; the threadgroup copies this one in.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = tid; i < NB * D; i += NSG * 32) {
      const int j = i / D, c = i % D, pos = t0 + j;
      float v = 0.f;
      if (pos < end) {
        const int64_t at = GATHER ? clamp(sel[b * s0 + pos * s2], 0, stored - 1) : pos;
        v = c < R ? static_cast<float>(latent[b * l0 + at * l1 + c * l2])
                  : static_cast<float>(rope[b * e0 + at * e1 + (c - R) * e2]);
      }
      kt[i] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // Partial dot products over this lane's channels: v[j * HB + hh].
    float v[K];
    for (int j = 0; j < NB; j++) {
      for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = 0.f;
      for (int i = 0; i < RL; i++) {
        const float k = kt[j * D + i * 32 + lane];
        for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = fma(q[hh][i], k, v[j * HB + hh]);
      }
      for (int i = 0; i < PL; i++) {
        const float k = kt[j * D + R + i * 32 + lane];
        for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = fma(q[hh][RL + i], k, v[j * HB + hh]);
      }
    }
    // Transposed butterfly: at each step a lane keeps half its sums and adds its partner's
    // share of that half, until each holds one complete score; the rest sum across copies.
    // (Unrolled, so that v stays in registers: its indices are then constants.)
    int ofs = 16;
    MLX_MTL_PRAGMA_UNROLL
    for (int n = K; n > 1; n >>= 1, ofs >>= 1) {
      const bool upper = (lane & ofs) != 0;
      MLX_MTL_PRAGMA_UNROLL
      for (int i = 0; i < n / 2; i++) {
        const float give = upper ? v[i] : v[i + n / 2];
        const float keep = upper ? v[i + n / 2] : v[i];
        v[i] = keep + simd_shuffle_xor(give, static_cast<ushort>(ofs));
      }
    }
    for (; ofs >= 1; ofs >>= 1) v[0] += simd_shuffle_xor(v[0], static_cast<ushort>(ofs));

    // Online softmax over the lanes holding this lane's row.
    const int pos = t0 + (lane / SPREAD) / HB;
    bool seen = pos < lim;
    if (GATHER && seen) {
      const int at = clamp(sel[b * s0 + pos * s2], 0, stored - 1);
      seen = at >= seen_lo && at < seen_hi;
    }
    const float s = seen ? v[0] : LC_NONE;
    float mx = s;
    for (int x = SPREAD * HB; x < 32; x <<= 1) mx = max(mx, simd_shuffle_xor(mx, static_cast<ushort>(x)));
    const float m_new = max(m_run, mx);
    const float p = s <= LC_NONE ? 0.f : exp2(s - m_new);
    float sum = p;
    for (int x = SPREAD * HB; x < 32; x <<= 1) sum += simd_shuffle_xor(sum, static_cast<ushort>(x));
    const float alpha = m_run <= LC_NONE ? 0.f : exp2(m_run - m_new);
    l_run = l_run * alpha + sum;
    m_run = m_new;

    // Output channels lane, lane + 32, ... of each row: rescale, then add the tile's weighted latent.
    for (int hh = 0; hh < HB; hh++) {
      const float a = simd_shuffle(alpha, static_cast<ushort>(hh * SPREAD));
      for (int i = 0; i < RL; i++) o[hh][i] *= a;
    }
    for (int j = 0; j < NB; j++) {
      for (int hh = 0; hh < HB; hh++) {
        const float pj = simd_shuffle(p, static_cast<ushort>((j * HB + hh) * SPREAD));
        for (int i = 0; i < RL; i++) o[hh][i] = fma(pj, kt[j * D + i * 32 + lane], o[hh][i]);
      }
    }
  }

  for (int hh = 0; hh < HB; hh++) {
    if (r0 + hh < H) {
      const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + r0 + hh) * R;
      for (int i = 0; i < RL; i++) o_part[at + i * 32 + lane] = o[hh][i];
    }
  }
  if (lane < HB * SPREAD && lane % SPREAD == 0 && r0 + mine < H) {
    const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + r0 + mine) * 2;
    ml[at] = m_run;
    ml[at + 1] = l_run;
  }
