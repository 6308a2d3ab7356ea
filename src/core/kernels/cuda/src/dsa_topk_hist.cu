//! Body of the DSA top-k's first kernel: the histogram of every row's keys by their top 11 bits,
//! a block per 4096 positions of a (row, query), summed into `hist` (zeroed by MLX) by one
//! atomic add per bin the block saw.

  constexpr int THREADS = 256, U = 16, BINS = 2048;
  __shared__ unsigned int h[BINS];
  const int tid = threadIdx.x, lane = tid & 31, qi = blockIdx.y, b = blockIdx.z;
  const int T = scores_shape[2];
  const long long s2 = scores_strides[2];
  const float* row = scores + b * scores_strides[0] + qi * scores_strides[1];
  for (int i = tid; i < BINS; i += THREADS) h[i] = 0;
  __syncthreads();
  const int t0 = blockIdx.x * THREADS * U;
  unsigned int k[U];
  #pragma unroll
  for (int u = 0; u < U; u++) {
    const int t = t0 + u * THREADS + tid;
    k[u] = t < T ? lc_key(row[t * s2]) : 0u;
  }
  #pragma unroll
  for (int u = 0; u < U; u++) lc_count(h, k[u] != 0u ? k[u] >> 21 : 0xffffffffu, lane);
  __syncthreads();
  unsigned int* out = hist + (static_cast<long long>(b) * gridDim.y + qi) * BINS;
  for (int i = tid; i < BINS; i += THREADS) {
    if (h[i] != 0) atomicAdd(&out[i], h[i]);
  }
