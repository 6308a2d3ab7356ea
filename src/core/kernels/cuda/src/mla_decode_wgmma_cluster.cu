//! The wgmma partial pass's body, part 3 (clusters): each CLUSTER consecutive splits of a (row,
//! head group) are one thread block cluster, and combine their outputs through distributed
//! shared memory. The one-pass decode (one cluster) writes the attention's output; with
//! LC_CLUSTER_PARTIALS (several clusters) each cluster writes one split's outputs for `combine`:
//! its splits' output weighted to the cluster's running max, that max and the weighted sum.
  static_assert(CLUSTER == LC_CLUSTER_SIZE && R % (4 * CLUSTER) == 0, "the compiled cluster; whole float4 channels a block");
  cg::cluster_group cl = cg::this_cluster();
  // This block's place in its cluster, and the cluster's among the row's (one: the one pass).
  const int rank = static_cast<int>(cl.block_rank()), cluster = split / CLUSTER;
  // Every key buffer is done with (the producer's copies all landed: each was waited on), so the
  // buffers hold this split's outputs: rows of R floats padded by 8 against bank conflicts, each
  // row's running max and sum, then (this block's own) the splits' weights and the inverse sums.
  constexpr int LDR = R + 8;
  float* red_o = reinterpret_cast<float*>(sk0);
  float* red_m = red_o + M * LDR;
  float* red_l = red_m + M;
  float* red_w = red_l + M;
  float* red_i = red_w + CLUSTER * M;
  // Both computing warpgroups are past the last tile (named barrier 1: the producer is not in it).
  asm volatile("bar.sync 1, 256;\nfence.proxy.async.shared::cta;\n" ::);
  #pragma unroll
  for (int j = 0; j < NC / 8; j++) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      const int row = r0 + 8 * k, c = wg * NC + 8 * j + 2 * t;
      *reinterpret_cast<float2*>(red_o + row * LDR + c) = make_float2(o[4 * j + 2 * k], o[4 * j + 2 * k + 1]);
    }
  }
  if (wg == 0 && t == 0) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      red_m[r0 + 8 * k] = m[k];
      red_l[r0 + 8 * k] = l[k];
    }
  }
  // Every split's outputs are in its shared memory.
  cl.sync();
  // Each row's weights exp2(m_s - max) (0 for a split that saw none of its positions) and the
  // inverse of the weighted sum of the running sums, as `combine` computes them.
  if (tid < M) {
    float ms[CLUSTER], mx = LC_NEG_INF;
    #pragma unroll
    for (int s = 0; s < CLUSTER; s++) {
      ms[s] = cl.map_shared_rank(red_m, s)[tid];
      mx = fmaxf(mx, ms[s]);
    }
    float den = 0.f;
    #pragma unroll
    for (int s = 0; s < CLUSTER; s++) {
      const float w = ms[s] == LC_NEG_INF ? 0.f : exp2f(ms[s] - mx);
      red_w[s * M + tid] = w;
      den += w * cl.map_shared_rank(red_l, s)[tid];
    }
#ifdef LC_CLUSTER_PARTIALS
    // The cluster's running max and sum, written once (by its first block).
    if (rank == 0 && h0 + tid < H) {
      const int64_t at = ((static_cast<int64_t>(b) * (S / CLUSTER) + cluster) * H + h0 + tid) * 2;
      ml[at] = mx;
      ml[at + 1] = den;
    }
    red_i[tid] = 1.f;
#else
    red_i[tid] = 1.f / den;
#endif
  }
  asm volatile("bar.sync 1, 256;\n" ::);
  // This block's share of the channels, every row: the splits' outputs read from their blocks.
  constexpr int C4 = R / CLUSTER / 4;
  for (int e = tid; e < M * C4; e += 256) {
    const int row = e / C4, c = rank * (R / CLUSTER) + (e % C4) * 4, h = h0 + row;
    if (h >= H) continue;
    float4 v[CLUSTER];
    #pragma unroll
    for (int s = 0; s < CLUSTER; s++) v[s] = *reinterpret_cast<const float4*>(cl.map_shared_rank(red_o, s) + row * LDR + c);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    #pragma unroll
    for (int s = 0; s < CLUSTER; s++) {
      const float w = red_w[s * M + row];
      acc.x += w * v[s].x; acc.y += w * v[s].y; acc.z += w * v[s].z; acc.w += w * v[s].w;
    }
    const float inv = red_i[row];
#ifdef LC_CLUSTER_PARTIALS
    float* to = o_part + ((static_cast<int64_t>(b) * (S / CLUSTER) + cluster) * H + h) * R + c;
#else
    float* to = out + (static_cast<int64_t>(b) * H + h) * R + c;
#endif
    *reinterpret_cast<float4*>(to) = make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
  }
  // No block leaves while another still reads its shared memory.
  cl.sync();
