//! The wgmma partial pass's body, part 1: tile sizes and shared memory.

  constexpr int M = 64, N = 32, D = R + P, KS = D / 16, NC = R / 2, THREADS = 384;
  // Core matrices (8 rows x 8 channels, 128 bytes): a tile of `rows` rows keeps core matrix
  // (row group, channel group) at (channel group * rows / 8 + row group) * 64 halves.
  extern __shared__ __align__(128) unsigned char lc_smem[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(lc_smem);
  // Key tiles: core-matrix columns (one channel group, every position) CS halves apart.
  constexpr int CS = (N / 8) * 64, KT = (D / 8) * CS;
  uint16_t* sk0 = sq + M * D;
  // Per key buffer: `full` (its tile has landed) and `empty` (both warpgroups are done with it).
  uint64_t* full = reinterpret_cast<uint64_t*>(sk0 + STAGES * KT);
  uint64_t* empty = full + STAGES;

