//! The decode kernel's partial pass for Hopper GPUs (compute capability 9.0): the same split-K
//! flash decoding as `decode_kernel`'s `partial`, with the products in warpgroup `wgmma`
//! instructions that read their operands straight from shared memory, and the tiles streamed in
//! by warps of their own. The `mma.sync` kernel reads every query and key fragment into
//! registers, four warps to each stored value, and its threads both copy and compute, so the
//! copies wait on the products and the products on the copies.
//!
//! A block is three warpgroups over 64 (head, query) rows. The producer warpgroup copies tiles of
//! 32 positions (16-byte `cp.async`) into four key buffers, each buffer's `full` barrier
//! completing when its copies land, and waits on its `empty` barrier before reusing it. Each of
//! the two computing warpgroups takes every tile in turn: all 64 x 32 scores (`wgmma` over the
//! `R + P` channels), the online softmax in registers, and the probabilities (bfloat16 or
//! float16, from registers) times its half of the latent channels into float32 accumulators in
//! registers; then it releases the buffer. Operands sit in shared memory as 8 x 8 core matrices
//! of 128 contiguous bytes (wgmma's layout without swizzling). The outputs are the `partial`
//! kernel's, for the same `combine`.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::mla_decode::{partial_prologue, PARTIAL_INPUTS, PARTIAL_OUTPUTS};
use crate::core::kernels::launch;
use crate::core::kernels::launch::{apply, kernel, Launch, Source, Switch};

/// Rows per block and positions per tile, as in `decode_kernel`; threads per block (three
/// warpgroups).
const ROWS: usize = 64;
const THREADS: i32 = 384;
const POSITIONS_PER_TILE: usize = 32;
/// The fewest tiles a split of this pass walks where there are few positions: its blocks cost
/// more to start than the `mma.sync` pass's (three warpgroups, barriers, the register handover),
/// so at batch 1 it takes fewer, longer splits (H200, 16K positions, the partial pass alone: 36
/// us at 64 splits of 8 tiles, 47 at 128 of 4; the mma.sync pass 47 at 128 splits).
pub(crate) const MIN_TILES_PER_SPLIT: usize = 8;
/// Key buffers in shared memory: up to three tiles stream in while one is computed on (on an
/// H200, three buffers and four measured alike).
const STAGES: usize = 4;

/// Shared memory for widths `d = r + p`: the queries, the key buffers and their two barriers.
pub(crate) fn shared_bytes(d: usize) -> usize {
    ROWS * d * 2 + STAGES * POSITIONS_PER_TILE * d * 2 + 2 * STAGES * 8
}

/// Whether this kernel takes widths `rank` and `rope`: each warpgroup's half of the latent
/// channels tiles by 64, and the copies take 32 channels of 8 positions at a time.
pub(crate) fn fits(rank: usize, rope: usize) -> bool {
    rank % 128 == 0 && rope % 32 == 0
}

const HEADER: &str = r#"
#define LC_NEG_INF __int_as_float(0xff800000)
// Three warpgroups a block: two compute (216 registers a thread, for the 128 float32 output
// accumulators), one streams the tiles in (64; see `setmaxnreg` below).
#undef __global__
#define __global__ __location__(global) __launch_bounds__(384, 1)
#define LC_D16(d) "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
#define LC_D32(d) LC_D16(d), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), \
  "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), \
  "+f"(d[30]), "+f"(d[31])
// d[64 x 32] += a[64 x 16] b[32 x 16]^T, both from shared memory, K-major.
#define LC_WG_SS(T) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n32k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16, %17, p, 1, 1, 0, 0;\n}\n" \
  : LC_D16(d) : "l"(a), "l"(b), "r"(1))
// d[64 x 64] += a[64 x 16] (registers) b[16 x 64] (shared memory, N-major).
#define LC_WG_RS(T) asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
  "wgmma.mma_async.sync.aligned.m64n64k16.f32." T "." T " {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15," \
  "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, {%32,%33,%34,%35}, %36, p, 1, 1, 1;\n}\n" \
  : LC_D32(d) : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(1))
__device__ __forceinline__ void lc_wg_ss(float* d, uint64_t a, uint64_t b, bool bf16) {
  if (bf16) LC_WG_SS("bf16"); else LC_WG_SS("f16");
}
__device__ __forceinline__ void lc_wg_rs(float* d, const uint32_t* a, uint64_t b, bool bf16) {
  if (bf16) LC_WG_RS("bf16"); else LC_WG_RS("f16");
}
// A shared-memory matrix descriptor without swizzling: start address and the byte distances
// between neighbouring core matrices along K (leading) and along M or N (strided), for K-major
// and N-major operands alike (checked on an H200 against the mma.sync kernel's results).
__device__ __forceinline__ uint64_t lc_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  uint64_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return ((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16) | (static_cast<uint64_t>(sbo >> 4) << 32);
}
__device__ __forceinline__ void lc_cp_async16(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 16 : 0));
}
__device__ __forceinline__ uint32_t lc_smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
// Waits until the barrier's phase of this parity has completed.
__device__ __forceinline__ void lc_wait(uint64_t* bar, int parity) {
  asm volatile("{\n.reg .pred done;\nLC_WAIT:\n"
               "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
               "@!done bra LC_WAIT;\n}\n" :: "r"(lc_smem_addr(bar)), "r"(parity));
}
__device__ __forceinline__ uint32_t lc_pack(float lo, float hi, bool bf16) {
  uint16_t l, h;
  if (bf16) {
    __nv_bfloat16 a = __float2bfloat16(lo), b = __float2bfloat16(hi);
    l = *reinterpret_cast<uint16_t*>(&a); h = *reinterpret_cast<uint16_t*>(&b);
  } else {
    __half a = __float2half(lo), b = __float2half(hi);
    l = *reinterpret_cast<uint16_t*>(&a); h = *reinterpret_cast<uint16_t*>(&b);
  }
  return static_cast<uint32_t>(l) | (static_cast<uint32_t>(h) << 16);
}
"#;

/// The partial pass (template arguments and inputs as `decode_kernel`'s `PARTIAL`).
const PARTIAL: &str = concat!(
    r#"
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

"#,
    partial_prologue!(),
    r#"  const int wg = tid >> 7, r0 = (warp & 3) * 16 + g;
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
          const uint16_t* src = !in ? lat : c < R ? lat + b * l0 + pos * l1 + c : rop + b * r0s + pos * r1s + (c - R);
          lc_cp_async16(sk + kcore(r, c), src, in);
        }
        asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" :: "r"(lc_smem_addr(full + st)));
      } else {
        for (int e = tid - 256; e < N * D; e += 128) {
          const int r = e / D, c = e % D, pos = tile + r;
          uint16_t v = 0;
          if (pos < end) v = c < R ? lat[b * l0 + pos * l1 + c * l2] : rop[b * r0s + pos * r1s + (c - R) * r2s];
          sk[kcore(r, c)] = v;
        }
        asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(lc_smem_addr(full + st)));
      }
    }
    asm volatile("cp.async.wait_all;\n" ::);
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
        const float v = tile + 8 * j + 2 * t + (e & 1) < lim[k] ? s[4 * j + e] * sc : LC_NEG_INF;
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
        const int cg = (wg * NC + nn * 64) / 8;
        lc_wg_rs(o + nn * 32, pa[kk], lc_desc(sk + cg * CS + 2 * kk * 64, 128, CS * 2), BF16);
      }
    }
    asm volatile("wgmma.commit_group.sync.aligned;\nwgmma.wait_group.sync.aligned 0;\n" ::);
    // This warp is done reading the buffer.
    __syncwarp();
    if (lane == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" :: "r"(lc_smem_addr(empty + st)));
  }

  #pragma unroll
  for (int j = 0; j < NC / 8; j++) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      const int h = h0 + r0 + 8 * k, c = wg * NC + 8 * j + 2 * t;
      if (h < H) {
        *reinterpret_cast<float2*>(o_part + ((static_cast<int64_t>(b) * S + split) * H + h) * R + c) =
            make_float2(o[4 * j + 2 * k], o[4 * j + 2 * k + 1]);
      }
    }
  }
  if (wg == 0 && t == 0) {
    #pragma unroll
    for (int k = 0; k < 2; k++) {
      const int h = h0 + r0 + 8 * k;
      if (h < H) {
        const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + h) * 2;
        ml[at] = m[k];
        ml[at + 1] = l[k];
      }
    }
  }
"#
);

static PARTIAL_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_partial_wgmma",
    inputs: PARTIAL_INPUTS,
    outputs: PARTIAL_OUTPUTS,
    header: HEADER,
    body: PARTIAL,
    contiguous: false,
};

/// This kernel's switch and launch count (on by default where it applies; tests and benchmarks
/// turn it off to run the `mma.sync` kernel on the same GPU).
pub static KERNEL: Switch = Switch::new();

/// Whether the partial pass runs here for widths `rank` and `rope`: a compute capability 9.0
/// GPU (the `wgmma` instructions are particular to it), widths that tile, and shared memory.
#[doc(hidden)]
pub fn applies(rank: usize, rope: usize) -> bool {
    KERNEL.enabled()
        && launch::compute_capability() == Some((9, 0))
        && fits(rank, rope)
        && shared_bytes(rank + rope) <= launch::shared_memory_limit()
}

/// Applies the partial pass over `splits` x `batch` x `groups` blocks, with `decode_kernel`'s
/// inputs, outputs and template arguments.
pub(crate) fn partial(
    inputs: &[&Array],
    outputs: &[(&[i32], Dtype)],
    blocks: [i32; 3],
    ints: &[(&str, i32)],
    bools: &[(&str, bool)],
    width: usize,
) -> Result<Vec<Array>> {
    let k = kernel(&PARTIAL_KERNEL, shared_bytes(width))?;
    let ints: Vec<(&str, i32)> = ints.iter().copied().chain([("STAGES", STAGES as i32)]).collect();
    let [splits, batch, groups] = blocks;
    let launch = Launch { outputs, grid: [splits * THREADS, batch, groups], block: [THREADS, 1, 1], ints: &ints, bools };
    let out = apply(k, inputs, launch)?;
    KERNEL.launched();
    Ok(out)
}
