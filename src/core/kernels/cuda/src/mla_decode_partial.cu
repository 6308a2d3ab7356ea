//! The mma.sync partial pass's body, part 2: tiles in, scores, softmax, output.

  // Codes as 32-bit words: FP8's are bytes (strides in bytes), read four to a word.
  const uint32_t* cod = reinterpret_cast<const uint32_t*>(latent);
  const uint8_t* cbytes = reinterpret_cast<const uint8_t*>(latent);
  const int64_t w0 = FP8 ? l0 / 4 : l0, w1 = FP8 ? l1 / 4 : l1;
  const uint16_t* scl = reinterpret_cast<const uint16_t*>(lat_scales);
  const uint16_t* bia = reinterpret_cast<const uint16_t*>(lat_biases);
  const int64_t s0 = lat_scales_strides[0], s1 = lat_scales_strides[1], s2 = lat_scales_strides[2];
  const int64_t z0 = lat_biases_strides[0], z1 = lat_biases_strides[1], z2 = lat_biases_strides[2];
  // Scale words arrive in 4-byte copies (affine: two groups' scales, or biases, each) where they can.
  const bool tvec = vec && (!FP8 || (l0 % 16 == 0 && l1 % 16 == 0)) && (BITS == 0 || (FP8 && s2 == 1) ||
                            (s2 == 1 && z2 == 1 && s0 % 2 == 0 && s1 % 2 == 0 && z0 % 2 == 0 && z1 % 2 == 0 &&
                             (reinterpret_cast<unsigned long long>(scl) & 3) == 0 &&
                             (reinterpret_cast<unsigned long long>(bia) & 3) == 0));
  // Query rows h0.. (row h is head h / LQ's query h % LQ; rows past H are zero).
  if (qvec) {
    for (int i = tid; i < M * (D / 8); i += THREADS) {
      int r = i / (D / 8), c = (i % (D / 8)) * 8, h = h0 + r;
      const uint16_t* src = h >= H ? qlat
                            : c < R ? qlat + b * q0 + (h / LQ) * q1 + (h % LQ) * q2 + c
                                    : qrop + b * p0 + (h / LQ) * p1 + (h % LQ) * p2 + (c - R);
      lc_cp_async16(sq + r * LD + c, src, h < H);
    }
    asm volatile("cp.async.commit_group;\n" ::);
  } else {
    for (int i = tid; i < M * D; i += THREADS) {
      int r = i / D, c = i % D, h = h0 + r;
      uint16_t v = 0;
      if (h < H) {
        v = c < R ? qlat[b * q0 + (h / LQ) * q1 + (h % LQ) * q2 + c * q3]
                  : qrop[b * p0 + (h / LQ) * p1 + (h % LQ) * p2 + (c - R) * p3];
      }
      sq[r * LD + c] = v;
    }
  }
  // With element copies for the tiles no later wait covers the queries' cp.async group.
  if (qvec && !tvec) asm volatile("cp.async.wait_group 0;\n" ::);
  if (tid < M) { sm[tid] = LC_NEG_INF; sl[tid] = 0.f; }

  // Starts copying the tile at `tile` (positions, latent then rope, as rows of D halves; zeros
  // past the range) into key buffer `buf`, as one cp.async group (an empty one past the end).
  // A quantized latent goes to the raw buffer instead, the rope alone to the key buffer.
  auto load = [&](int tile, int buf) {
    uint16_t* sk = sk0 + buf * N * LD;
    constexpr int C0 = BITS ? R / 8 : 0, CR = D / 8 - C0;
    if (tvec) {
      if (tile < end) {
        for (int i = tid; i < N * CR; i += THREADS) {
          int r = i / CR, c = (C0 + i % CR) * 8, pos = tile + r;
          const bool in = pos < end;
          const uint16_t* src = !in ? lat : c < R ? lat + b * l0 + at(pos) * l1 + c : rop + b * r0s + at(pos) * r1s + (c - R);
          lc_cp_async16(sk + r * LD + c, src, in);
        }
        for (int i = tid; i < N * CW / 4; i += THREADS) {
          int r = i / (CW / 4), c = i % (CW / 4) * 4, pos = tile + r;
          const bool in = pos < end;
          lc_cp_async16(rc + r * CW + c, in ? cod + b * w0 + at(pos) * w1 + c : cod, in);
        }
        for (int i = tid; i < N * SW; i += THREADS) {
          const int r = i / SW, j = i % SW, pos = tile + r;
          const bool in = pos < end, scale = FP8 || j < G / 2;
          const int e = FP8 ? 2 * j : 2 * (scale ? j : j - G / 2);  // in 16-bit units
          const uint16_t* src = !in ? scl : scale ? scl + (b * s0 + at(pos) * s1) * (FP8 ? 2 : 1) + e : bia + b * z0 + at(pos) * z1 + e;
          lc_cp_async4(rw + i, src, in);
        }
      }
      asm volatile("cp.async.commit_group;\n" ::);
    } else if (tile < end) {
      for (int i = tid; i < N * D; i += THREADS) {
        int r = i / D, c = i % D, pos = tile + r;
        if (c < C0 * 8) continue;
        uint16_t v = 0;
        if (pos < end) v = c < R ? lat[b * l0 + at(pos) * l1 + c * l2] : rop[b * r0s + at(pos) * r1s + (c - R) * r2s];
        sk[r * LD + c] = v;
      }
      for (int i = tid; i < N * CW; i += THREADS) {
        int r = i / CW, c = i % CW, pos = tile + r;
        uint32_t w = 0;
        if (pos < end && FP8) {
          #pragma unroll
          for (int k = 0; k < 4; k++) w |= static_cast<uint32_t>(cbytes[b * l0 + at(pos) * l1 + (4 * c + k) * l2]) << (8 * k);
        } else if (pos < end) {
          w = cod[b * l0 + at(pos) * l1 + c * l2];
        }
        rc[i] = w;
      }
      for (int i = tid; i < N * SW; i += THREADS) {
        const int r = i / SW, j = i % SW, pos = tile + r;
        uint32_t w = 0;
        if (pos < end && FP8) {
          w = reinterpret_cast<const uint32_t*>(scl)[b * s0 + at(pos) * s1 + j * s2];
        } else if (pos < end) {
          const bool scale = j < G / 2;
          const int e = 2 * (scale ? j : j - G / 2);
          const uint16_t* row = scale ? scl + b * s0 + at(pos) * s1 : bia + b * z0 + at(pos) * z1;
          const int64_t step = scale ? s2 : z2;
          w = row[e * step] | static_cast<uint32_t>(row[(e + 1) * step]) << 16;
        }
        rw[i] = w;
      }
    }
  };

  // Decodes the raw tile into key buffer `buf`'s latent columns: affine, `code * scale + bias`
  // in bfloat16 as MLX's `dequantize` computes it; FP8, the code times its block's scale in
  // float32 (as the MLX-ops decoding), rounded to bfloat16.
  auto decode = [&](int buf) {
    uint16_t* sk = sk0 + buf * N * LD;
    for (int i = tid; i < N * CW; i += THREADS) {
      const int r = i / CW, k = i % CW, grp = k * PF / 64;
      const uint32_t c = rc[i];
      uint32_t* dst = reinterpret_cast<uint32_t*>(sk + r * LD + k * PF);
      if (FP8) {
        const float sv = __uint_as_float(rw[r * SW + k * PF / 128]);
        #pragma unroll
        for (int j = 0; j < 2; j++) {
          __nv_fp8_e4m3 lo, hi;
          lo.__x = static_cast<__nv_fp8_storage_t>((c >> (16 * j)) & 255);
          hi.__x = static_cast<__nv_fp8_storage_t>((c >> (16 * j + 8)) & 255);
          const __nv_bfloat162 v = __floats2bfloat162_rn(static_cast<float>(lo) * sv, static_cast<float>(hi) * sv);
          dst[j] = *reinterpret_cast<const uint32_t*>(&v);
        }
        continue;
      }
      const uint16_t* words = reinterpret_cast<const uint16_t*>(rw + r * SW);
      const __nv_bfloat16 sv = *reinterpret_cast<const __nv_bfloat16*>(words + grp);
      const __nv_bfloat16 zv = *reinterpret_cast<const __nv_bfloat16*>(words + G + grp);
      const __nv_bfloat162 s2v = __halves2bfloat162(sv, sv), z2v = __halves2bfloat162(zv, zv);
      #pragma unroll
      for (int j = 0; j < PF / 2; j++) {
        constexpr uint32_t MASK = (1u << (BITS ? BITS : 1)) - 1;
        const __nv_bfloat162 q = __floats2bfloat162_rn(static_cast<float>((c >> (2 * j * BITS)) & MASK),
                                                       static_cast<float>((c >> ((2 * j + 1) * BITS)) & MASK));
        const __nv_bfloat162 v = __hadd2(__hmul2(q, s2v), z2v);
        dst[j] = *reinterpret_cast<const uint32_t*>(&v);
      }
    }
  };

  const int mt = warp & 3, cg = warp >> 2;
  float o[NT][4];
  #pragma unroll
  for (int j = 0; j < NT; j++) { o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.f; }

  load(begin, 0);
  int buf = 0;
  for (int tile = begin; tile < end; tile += N, buf ^= 1) {
    // This tile has landed, and every warp is done with the previous one, whose buffer the
    // next tile now streams into while this one is computed on. (A third buffer, streaming two
    // tiles ahead, measured no faster on an H200: the copies are not what waits.)
    if (tvec) asm volatile("cp.async.wait_group 0;\n" ::);
    __syncthreads();
    if (BITS) {
      // The raw buffer is free again once decoded: the next tile streams into it.
      decode(buf);
      __syncthreads();
    }
    load(tile + N, buf ^ 1);
    const uint16_t* sk = sk0 + buf * N * LD;

    // Scores: warp (mt, kq) computes heads mt*16.. by all N positions over every fourth
    // 16-wide step of the D-wide dot products (steps kq, kq + 4, ...): each query fragment it
    // loads serves N / 8 products, which keeps shared-memory traffic down. The four partial
    // sums go to their own buffers; the softmax adds them.
    {
      float acc[N / 8][4];
      #pragma unroll
      for (int j = 0; j < N / 8; j++) { acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f; }
      const uint16_t* qa = sq + (mt * 16 + g) * LD + 2 * t;
      #pragma unroll 3
      for (int ks = cg; ks < D / 16; ks += 4) {
        const int k0 = ks * 16;
        uint32_t a0 = *reinterpret_cast<const uint32_t*>(qa + k0);
        uint32_t a1 = *reinterpret_cast<const uint32_t*>(qa + 8 * LD + k0);
        uint32_t a2 = *reinterpret_cast<const uint32_t*>(qa + k0 + 8);
        uint32_t a3 = *reinterpret_cast<const uint32_t*>(qa + 8 * LD + k0 + 8);
        #pragma unroll
        for (int j = 0; j < N / 8; j++) {
          const uint16_t* kb = sk + (j * 8 + g) * LD + k0 + 2 * t;
          lc_mma(acc[j], a0, a1, a2, a3, *reinterpret_cast<const uint32_t*>(kb),
                 *reinterpret_cast<const uint32_t*>(kb + 8), BF16);
        }
      }
      float* part = ss + cg * M * LDS;
      #pragma unroll
      for (int j = 0; j < N / 8; j++) {
        #pragma unroll
        for (int e = 0; e < 4; e++) {
          part[(mt * 16 + g + (e >= 2 ? 8 : 0)) * LDS + j * 8 + 2 * t + (e & 1)] = acc[j][e];
        }
      }
    }
    __syncthreads();

    // Online softmax: eight threads per head (neighbouring lanes), N/8 positions each; the
    // scores are the four partial sums, scaled, with positions past the range masked.
    {
      constexpr int C = N / 8;
      const int r = tid >> 3, q = tid & 7;
      // Causal: query i of LQ sees the row's positions up to hi - LQ + i (bottom-right aligned).
      const int lim = CAUSAL ? min(end, hi - LQ + 1 + (h0 + r) % LQ) : end;
      float sv[C];
      float mx = LC_NEG_INF;
      #pragma unroll
      for (int c = 0; c < C; c++) {
        const int at = r * LDS + q * C + c;
        const float v = (ss[at] + ss[M * LDS + at] + ss[2 * M * LDS + at] + ss[3 * M * LDS + at]) * sc;
        sv[c] = tile + q * C + c < lim && seen(tile + q * C + c) ? v : LC_NEG_INF;
        mx = fmaxf(mx, sv[c]);
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 2));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffff, mx, 4));
      const float m_old = sm[r], m_new = fmaxf(m_old, mx);
      float sum = 0.f;
      #pragma unroll
      for (int c = 0; c < C; c++) {
        float p = m_new == LC_NEG_INF ? 0.f : exp2f(sv[c] - m_new);
        sum += p;
        if (BF16) {
          __nv_bfloat16 v = __float2bfloat16(p);
          sp[r * LDP + q * C + c] = *reinterpret_cast<uint16_t*>(&v);
        } else {
          __half v = __float2half(p);
          sp[r * LDP + q * C + c] = *reinterpret_cast<uint16_t*>(&v);
        }
      }
      sum += __shfl_xor_sync(0xffffffff, sum, 1);
      sum += __shfl_xor_sync(0xffffffff, sum, 2);
      sum += __shfl_xor_sync(0xffffffff, sum, 4);
      __syncwarp();
      if (q == 0) {
        const float alpha = m_new == LC_NEG_INF ? 1.f : exp2f(m_old - m_new);
        sa[r] = alpha;
        sl[r] = sl[r] * alpha + sum;
        sm[r] = m_new;
      }
    }
    __syncthreads();

    // Output: warp (mt, cg) accumulates heads mt*16.. by channels cg*R/CG.. .
    {
      const float al0 = sa[mt * 16 + g], al1 = sa[mt * 16 + g + 8];
      #pragma unroll
      for (int j = 0; j < NT; j++) { o[j][0] *= al0; o[j][1] *= al0; o[j][2] *= al1; o[j][3] *= al1; }
      const uint16_t* pa = sp + (mt * 16 + g) * LDP + 2 * t;
      #pragma unroll
      for (int k0 = 0; k0 < N; k0 += 16) {
        uint32_t a0 = *reinterpret_cast<const uint32_t*>(pa + k0);
        uint32_t a1 = *reinterpret_cast<const uint32_t*>(pa + 8 * LDP + k0);
        uint32_t a2 = *reinterpret_cast<const uint32_t*>(pa + k0 + 8);
        uint32_t a3 = *reinterpret_cast<const uint32_t*>(pa + 8 * LDP + k0 + 8);
        #pragma unroll
        for (int j = 0; j < NT; j += 2) {
          uint32_t bb[4];
          lc_ldmatrix_x4_trans(bb, sk + (k0 + (lane & 15)) * LD + cg * (R / CG) + j * 8 + (lane >> 4) * 8);
          lc_mma(o[j], a0, a1, a2, a3, bb[0], bb[1], BF16);
          lc_mma(o[j + 1], a0, a1, a2, a3, bb[2], bb[3], BF16);
        }
      }
    }
  }
  if (tvec) asm volatile("cp.async.wait_group 0;\n" ::);
  __syncthreads();

  #pragma unroll
  for (int j = 0; j < NT; j++) {
    #pragma unroll
    for (int e = 0; e < 4; e++) {
      int h = h0 + mt * 16 + g + (e >= 2 ? 8 : 0), c = cg * (R / CG) + j * 8 + 2 * t + (e & 1);
      if (h < H) o_part[((static_cast<int64_t>(b) * S + split) * H + h) * R + c] = o[j][e];
    }
  }
  if (tid < M && h0 + tid < H) {
    int64_t at = ((static_cast<int64_t>(b) * S + split) * H + h0 + tid) * 2;
    ml[at] = sm[tid];
    ml[at + 1] = sl[tid];
  }
