//! Body of the split-K decode's combine kernel: the splits summed by weight.

  constexpr int THREADS = 512, C4 = R / 4, CW = C4 < THREADS ? C4 : THREADS, G = THREADS / CW;
  __shared__ float w[MAX_SPLITS];
  __shared__ float red[THREADS / 32];
  __shared__ float4 part[THREADS];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, h = blockIdx.y, b = blockIdx.z;
  const int S = ml_shape[1];
  const int64_t base = static_cast<int64_t>(b) * S * H + h;
  const float ms = tid < S ? ml[(base + static_cast<int64_t>(tid) * H) * 2] : LC_NEG_INF;
  // The largest running max over the splits.
  float m = ms;
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffff, m, off));
  if (lane == 0) red[warp] = m;
  __syncthreads();
  m = red[0];
  #pragma unroll
  for (int i = 1; i < THREADS / 32; i++) m = fmaxf(m, red[i]);
  __syncthreads();
  // Each split's weight, and the weighted sum of the running sums (the denominator).
  const float ws = ms == LC_NEG_INF ? 0.f : exp2f(ms - m);
  if (tid < S) w[tid] = ws;
  float den = tid < S ? ws * ml[(base + static_cast<int64_t>(tid) * H) * 2 + 1] : 0.f;
  #pragma unroll
  for (int off = 16; off > 0; off >>= 1) den += __shfl_xor_sync(0xffffffff, den, off);
  if (lane == 0) red[warp] = den;
  __syncthreads();
  den = 0.f;
  #pragma unroll
  for (int i = 0; i < THREADS / 32; i++) den += red[i];
  const float inv = 1.f / den;
  // Channels four at a time: group tid / CW sums splits tid / CW, + G, ...
  const float4* op = reinterpret_cast<const float4*>(o_part);
  const int grp = tid / CW, col = tid % CW;
  for (int c0 = 0; c0 < C4; c0 += CW) {
    const int c4 = c0 + col;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c4 < C4) {
      #pragma unroll 4
      for (int s = grp; s < S; s += G) {
        const float ww = w[s];
        const float4 v = op[(base + static_cast<int64_t>(s) * H) * C4 + c4];
        acc.x += ww * v.x; acc.y += ww * v.y; acc.z += ww * v.z; acc.w += ww * v.w;
      }
    }
    part[tid] = acc;
    __syncthreads();
    if (grp == 0 && c4 < C4) {
      float4 sum = part[col];
      for (int gi = 1; gi < G; gi++) {
        const float4 v = part[gi * CW + col];
        sum.x += v.x; sum.y += v.y; sum.z += v.z; sum.w += v.w;
      }
      float* o = out + (static_cast<int64_t>(b) * H + h) * R + 4 * c4;
      o[0] = sum.x * inv; o[1] = sum.y * inv; o[2] = sum.z * inv; o[3] = sum.w * inv;
    }
    __syncthreads();
  }
