//! Body of the DSA index scores kernel.

  static_assert(KT >= 0 && QT >= 0 && WT >= 0, "dtype tags");
  constexpr int THREADS = 128, C = 32;  // positions per block; channels per staged chunk
  __shared__ float sq[HI * W];
  __shared__ float sw[HI];
  __shared__ float sk[THREADS * (C + 1)];  // a chunk of the block's keys, rows padded by one
  const int tid = threadIdx.x, qi = blockIdx.y, b = blockIdx.z;
  const int T = keys_shape[1];
  const int t0 = blockIdx.x * THREADS, t = t0 + tid;
  for (int i = tid; i < HI * W; i += THREADS) {
    const int h = i / W, c = i % W;
    sq[i] = static_cast<float>(q_index[b * q_index_strides[0] + h * q_index_strides[1] + qi * q_index_strides[2] +
                                       c * q_index_strides[3]]);
  }
  if (tid < HI) sw[tid] = static_cast<float>(weights[b * weights_strides[0] + qi * weights_strides[1] + tid * weights_strides[2]]);
  const int* rp = reinterpret_cast<const int*>(ranges);
  const int lo = RANGES ? rp[2 * b] : 0;
  const int hi = (RANGES ? rp[2 * b + 1] : T) - (CAUSAL ? LQ - 1 - qi : 0);
  float acc[HI];
  #pragma unroll
  for (int h = 0; h < HI; h++) acc[h] = 0.f;
  const long long base = b * keys_strides[0];
  // 16-byte reads of the keys where rows are contiguous and aligned (the stored buffers are).
  const bool vec = keys_strides[2] == 1 && W % 8 == 0 && keys_strides[0] % 8 == 0 && keys_strides[1] % 8 == 0 &&
                   (reinterpret_cast<unsigned long long>(keys) & 15) == 0;
  for (int c0 = 0; c0 < W; c0 += C) {
    // The block's keys, C channels at a time, read along the channels (neighbouring threads,
    // neighbouring values of one stored row).
    __syncthreads();
    if (vec) {
      // Eight channels a 16-byte read: a thread's reads for the chunk are four, issued together,
      // where one read per value made each thread wait on thirty-two in a row.
      for (int i = tid; i < THREADS * (C / 8); i += THREADS) {
        const int p = i / (C / 8), c = i % (C / 8) * 8, pos = t0 + p;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (pos < T && c0 + c < W) raw = *reinterpret_cast<const uint4*>(keys + base + pos * keys_strides[1] + c0 + c);
        const auto e = reinterpret_cast<decltype(keys)>(&raw);
        #pragma unroll
        for (int j = 0; j < 8; j++) sk[p * (C + 1) + c + j] = static_cast<float>(e[j]);
      }
    } else {
      for (int i = tid; i < THREADS * C; i += THREADS) {
        const int p = i / C, c = i % C, pos = t0 + p;
        sk[p * (C + 1) + c] = pos < T && c0 + c < W ? static_cast<float>(keys[base + pos * keys_strides[1] + (c0 + c) * keys_strides[2]]) : 0.f;
      }
    }
    __syncthreads();
    #pragma unroll 4
    for (int c = 0; c < C; c++) {
      const float k = sk[tid * (C + 1) + c];
      if (c0 + c < W) {
        #pragma unroll
        for (int h = 0; h < HI; h++) acc[h] += sq[h * W + c0 + c] * k;
      }
    }
  }
  if (t >= T) return;
  float* row = scores + (static_cast<long long>(b) * LQ + qi) * T;
  if (t < lo || t >= hi) {
    row[t] = __int_as_float(0xff800000);
    return;
  }
  float s = 0.f;
  #pragma unroll
  for (int h = 0; h < HI; h++) s += sw[h] * fmaxf(acc[h], 0.f);
  row[t] = s;
