//! Header of the DSA top-k kernels: scores as unsigned keys in the same order, the radix
//! digits the selection goes by, and the search for the bin holding the k-th largest key.

// MLX writes the kernel's signature; the launch bound (at most 512 threads a block, hence at
// most 128 registers a thread, or a 512-thread launch asks more than a multiprocessor has) is
// given this way, for this module's kernels alone.
#undef __global__
#define __global__ __location__(global) __launch_bounds__(512)

// Radix digits from the top: 11, 11 and 10 bits.
__device__ __forceinline__ int lc_digit_shift(int level) { return level == 0 ? 21 : level == 1 ? 10 : 0; }
__device__ __forceinline__ int lc_digit_bits(int level) { return level == 2 ? 10 : 11; }

// A score as an unsigned key in the same order (negative floats' bits reversed, positive ones'
// sign set), so that -inf (a position the query does not see) is below every finite score. Key
// 0 marks "no position" (past the row): the one score it would be (NaN with every bit set, which
// a caller's scores may hold) takes key 1, so every position of a row counts and the k-th
// largest key is always found.
__device__ __forceinline__ unsigned int lc_key(float s) {
  // -0 is +0 (as float comparison has them): ties at zero stay ties.
  const unsigned int u = __float_as_uint(s) == 0x80000000u ? 0u : __float_as_uint(s);
  const unsigned int k = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return k | (k == 0u);
}

// Warp 0 of a block finds, in `hist` (2048 bins), the bin where the count from the top reaches
// `need`: `*bin` is that bin, `*left` the keys still needed within it, `*count` its keys.
// Lane l holds bins [64 l, 64 l + 64); `above` counts the keys in the lanes above it.
__device__ __forceinline__ void lc_find_bin(const unsigned int* hist, unsigned int need, int lane, unsigned int* bin,
                                            unsigned int* left, unsigned int* count) {
  constexpr int PER = 2048 / 32;
  unsigned int sum = 0;
  for (int j = 0; j < PER; j++) sum += hist[lane * PER + j];
  unsigned int from_here = sum;
  #pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const unsigned int v = __shfl_down_sync(0xffffffffu, from_here, off);
    if (lane + off < 32) from_here += v;
  }
  unsigned int above = from_here - sum;
  if (above < need && need <= from_here) {
    for (int j = PER - 1; j >= 0; j--) {
      const unsigned int c = hist[lane * PER + j];
      if (above + c >= need) {
        *bin = lane * PER + j;
        *left = need - above;
        *count = c;
        break;
      }
      above += c;
    }
  }
}

// Adds `bin` (0xffffffff: none) to the block's histogram once per group of a warp's lanes that
// share it, with their count: scores cluster in few bins (one exponent holds most of a row).
__device__ __forceinline__ void lc_count(unsigned int* hist, unsigned int bin, int lane) {
  const unsigned int peers = __match_any_sync(0xffffffffu, bin);
  if (bin != 0xffffffffu && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], __popc(peers));
}
