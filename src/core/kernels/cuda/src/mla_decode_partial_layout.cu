//! The mma.sync partial pass's body, part 1: tile sizes and shared memory.

  constexpr int M = 64, N = 32, D = R + P, LD = D + 8, LDS = N + 1, LDP = N + 8;
  // Sixteen warps: warp w holds heads (w % 4) * 16.. and group w / 4 of four (a quarter of the
  // output channels; for the scores, a quarter of the dot products' steps), so each thread
  // keeps R / 8 float32 accumulators (64 at R = 512), well inside its registers.
  constexpr int THREADS = 512, CG = 4;
  constexpr int NT = R / (8 * CG);  // n8 tiles of the output per warp
  extern __shared__ __align__(16) unsigned char lc_smem[];
  uint16_t* sq = reinterpret_cast<uint16_t*>(lc_smem);
  uint16_t* sk0 = sq + M * LD;  // two key tiles: one computed on while the next arrives
  float* ss = reinterpret_cast<float*>(sk0 + 2 * N * LD);
  uint16_t* sp = reinterpret_cast<uint16_t*>(ss + 4 * M * LDS);
  float* sm = reinterpret_cast<float*>(sp + M * LDP);
  float* sl = sm + M;
  float* sa = sl + M;
  // A packed latent (codes of BITS 8 or 4): a tile's codes (CW words a position) and its scale
  // words (SW a position: affine, G bfloat16 scales then G biases, one each per 64 values; FP8,
  // a float32 scale per 128) as stored, decoded into the key tile when it is its turn.
  constexpr int PF = 32 / (BITS ? BITS : 32), CW = BITS ? R / PF : 0, G = R / 64;
  constexpr int SW = BITS == 0 ? 0 : FP8 ? R / 128 : G;
  uint32_t* rc = reinterpret_cast<uint32_t*>(sa + M);
  uint32_t* rw = rc + N * CW;

