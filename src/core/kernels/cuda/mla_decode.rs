//! Split-K flash decoding for absorbed MLA on MLX's CUDA backend: a decode step's query (or a
//! speculative verify's few, causally masked) per row over the stored latent and rope (bfloat16
//! or float16; or a Q8, Q4 or FP8 latent, read packed and decoded a tile at a time, with bfloat16
//! rope), every head of a row sharing each position as it is read. MLX's own fused
//! attention treats the one latent "key head" as broadcast to every query head and runs far
//! below the GPU's memory bandwidth; this kernel reads each stored position once per 64
//! (head, query) rows, in tensor-core products, with the positions split over the GPU's
//! multiprocessors and the splits combined by their log-sum-exp (the FlashDecoding scheme).
//!
//! Two kernels, compiled by MLX at first use (NVRTC) through its custom-kernel API:
//! - `partial`: block (split, row, group of 64 head-query pairs) walks its positions in tiles
//!   of 32, each copied in (cp.async) while the previous one is computed on: scores for 64 rows
//!   by 32 positions (`mma.sync` m16n8k16, float32 accumulators), an online softmax, and the
//!   probabilities times the tile's latent into float32 accumulators that stay in registers; it
//!   writes its unnormalized output and each row's running max and sum. On compute capability
//!   9.0 (H100, H200) `decode_wgmma`'s pass replaces it: the same outputs, with `wgmma` products
//!   and the tiles streamed in by a warpgroup of their own.
//! - `combine`: each output channel sums the splits, weighted by `exp(max_s - max)`.
//!
//! Taken by `Donor::attend` where it applies (see `applies`); the MLX-ops path is the fallback
//! and the reference it is tested against (`tests/decode_kernel.rs`, run on an H200). Its Metal
//! counterpart is `decode_metal`.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use crate::core::kernels::launch::{apply, kernel, Launch, Source, Switch};
use crate::core::model::storage_mode::{Packing, AFFINE_GROUP, FP8_BLOCK};

use crate::core::error::Result;
use crate::core::kernels::cuda;
use crate::core::kernels::launch;
use crate::core::mlx::math;

/// Heads per block and positions per tile (the kernel's fixed tile sizes).
const HEADS_PER_BLOCK: usize = 64;
const POSITIONS_PER_TILE: usize = 32;
/// The fewest tiles a split walks where there are few positions: each split writes 64 rows of
/// float32 partial outputs for the combine to read back, which at one tile per split costs more
/// than the tile (H200, batch 1, 4K positions, GPU time: 60 us at one tile per split, 27 at
/// four, 25 at sixteen, whose single steps were slower).
const MIN_TILES_PER_SPLIT: usize = 4;
/// Blocks to aim for: about one per multiprocessor of an H100/H200 (132), so one wave runs.
const TARGET_BLOCKS: usize = 132;

/// The most splits a row's positions are divided into (the combine kernel keeps a weight per
/// split in shared memory); `TARGET_BLOCKS` keeps them far below.
const MAX_SPLITS: usize = 256;

/// This kernel's switch and launch count (see `launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Shared memory of the partial kernel for widths `d = r + p`: the queries and two key tiles
/// (rows padded by 8 halves against bank conflicts), four partial scores, the probabilities and
/// three per-head vectors; over a packed latent, a tile of its codes and scale words as they
/// are stored.
fn shared_bytes(d: usize, r: usize, packing: Option<Packing>) -> usize {
    let (m, n) = (HEADS_PER_BLOCK, POSITIONS_PER_TILE);
    let raw = match packing {
        None => 0,
        Some(Packing::Affine(bits)) => n * (r * bits / 8 + r / AFFINE_GROUP * 4),
        Some(Packing::Fp8) => n * (r + r / FP8_BLOCK * 4),
    };
    (m + 2 * n) * (d + 8) * 2 + 4 * m * (n + 1) * 4 + m * (n + 8) * 2 + 3 * m * 4 + raw
}

/// An attention's sizes and scale, as `applies` judges them.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub queries: usize,
    /// Window positions (the stored offset).
    pub positions: usize,
    pub rank: usize,
    pub rope: usize,
    /// The scores' scale: compiled into the kernel (see `SCALES`).
    pub scale: f32,
}

/// How many distinct scales the kernel is compiled for (the scale is a template argument, so
/// that no array made on the host feeds the kernel): a model uses one; attentions with further
/// scales run MLX's ops rather than compile a kernel each (NVRTC takes about a second).
const SCALES: usize = 8;

/// `SCALES`, for tests.
#[doc(hidden)]
pub fn scale_limit() -> usize {
    SCALES
}

/// The scales the kernel has been applied with, in order.
static SCALES_SEEN: Lazy<Mutex<Vec<u32>>> = Lazy::new(|| Mutex::new(Vec::new()));

fn scales_seen() -> std::sync::MutexGuard<'static, Vec<u32>> {
    SCALES_SEEN.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Whether the kernel takes `scale`: one it was applied with, or a place left for a new one.
fn scale_fits(scale: f32) -> bool {
    let seen = scales_seen();
    seen.contains(&scale.to_bits()) || seen.len() < SCALES
}

fn remember_scale(scale: f32) {
    let mut seen = scales_seen();
    if !seen.contains(&scale.to_bits()) {
        seen.push(scale.to_bits());
    }
}

/// CUDA's limit on a launch's second and third grid dimensions (rows of (head, query) pairs and
/// the batch land there).
const GRID_YZ_LIMIT: usize = 65535;

/// Whether the kernel computes this attention: a CUDA GPU the kernels run on, latent and rope
/// stored in the queries' 16-bit float dtype, a latent width that tiles by 64 and a rope width
/// by 16, the tiles fitting the GPU's shared memory, sizes within CUDA's grid limits, and a
/// scale it is (or may be) compiled for.
pub fn applies(storage: Dtype, q_dtype: Dtype, s: &Shape) -> bool {
    matches!(storage, Dtype::Bfloat16 | Dtype::Float16) && q_dtype == storage && fits(s, None)
}

/// Whether the kernel computes this attention over a packed latent (see `Packing`) and the rope
/// in bfloat16: bfloat16 queries, a latent width that tiles by 128, and the rest as `applies`.
/// The kernel decodes each tile as it arrives (affine as MLX's `dequantize` does, `code * scale
/// + bias` in bfloat16), so it reads the packed history, never a decoded copy of it.
pub fn applies_packed(packing: Packing, q_dtype: Dtype, s: &Shape) -> bool {
    let known = matches!(packing, Packing::Affine(4 | 8) | Packing::Fp8);
    known && q_dtype == Dtype::Bfloat16 && s.rank % 128 == 0 && fits(s, Some(packing))
}

/// `applies`' checks common to every storage (`packing` `None` for 16-bit floats).
fn fits(s: &Shape, packing: Option<Packing>) -> bool {
    let rows = s.heads * s.queries;
    KERNEL.enabled()
        && launch::on_cuda()
        && s.rank % 64 == 0
        && s.rope % 16 == 0
        && shared_bytes(s.rank + s.rope, s.rank, packing) <= launch::shared_memory_limit()
        && (1..=GRID_YZ_LIMIT).contains(&rows)
        && (1..=GRID_YZ_LIMIT).contains(&s.batch)
        && s.positions >= 1
        && s.positions <= i32::MAX as usize
        && scale_fits(s.scale)
}

const HEADER: &str = r#"
#include <cuda_fp8.h>
#define LC_NEG_INF __int_as_float(0xff800000)
// MLX writes the kernel's signature; this module holds only our kernels, so their launch bound
// (at most 512 threads a block, hence at most 128 registers a thread) is given this way.
#undef __global__
#define __global__ __location__(global) __launch_bounds__(512)
__device__ __forceinline__ void lc_mma(float* c, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1, bool bf16) {
  if (bf16) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
  }
}
__device__ __forceinline__ void lc_cp_async16(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 16 : 0));
}
__device__ __forceinline__ void lc_cp_async4(void* dst, const void* src, bool copy) {
  uint32_t d = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" :: "r"(d), "l"(src), "r"(copy ? 4 : 0));
}
__device__ __forceinline__ void lc_ldmatrix_x4_trans(uint32_t* r, const void* p) {
  uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
}
"#;

/// The partial passes' shared start (this module's and `decode_wgmma`'s): thread indices, the
/// split's positions, the inputs' pointers and strides, and whether 16-byte copies apply.
macro_rules! partial_prologue {
    () => {
        r#"  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
  const int split = blockIdx.x, S = gridDim.x, b = blockIdx.y, h0 = blockIdx.z * M;
  // Split s takes positions [s * chunk, (s + 1) * chunk): whole tiles, S of them covering T.
  const int T = latent_shape[1], chunk = ((T + S - 1) / S + N - 1) / N * N;
  const int* rp = reinterpret_cast<const int*>(ranges);
  const int lo = RANGES ? rp[2 * b] : 0, hi = RANGES ? rp[2 * b + 1] : T;
  const int begin = max(lo, split * chunk), end = min(hi, (split + 1) * chunk);
  const float sc = __int_as_float(SCALE) * 1.4426950408889634f;

  const uint16_t* qlat = reinterpret_cast<const uint16_t*>(q_latent);
  const uint16_t* qrop = reinterpret_cast<const uint16_t*>(q_rope);
  const int64_t q0 = q_latent_strides[0], q1 = q_latent_strides[1], q2 = q_latent_strides[2], q3 = q_latent_strides[3];
  const int64_t p0 = q_rope_strides[0], p1 = q_rope_strides[1], p2 = q_rope_strides[2], p3 = q_rope_strides[3];
  const uint16_t* lat = reinterpret_cast<const uint16_t*>(latent);
  const uint16_t* rop = reinterpret_cast<const uint16_t*>(rope);
  const int64_t l0 = latent_strides[0], l1 = latent_strides[1], l2 = latent_strides[2];
  const int64_t r0s = rope_strides[0], r1s = rope_strides[1], r2s = rope_strides[2];
  // 16-byte copies where rows are contiguous and aligned (the stored buffers and engines' queries
  // are); element copies otherwise.
  auto aligned = [](const void* p) { return (reinterpret_cast<unsigned long long>(p) & 15) == 0; };
  const bool qvec = q3 == 1 && p3 == 1 && q0 % 8 == 0 && q1 % 8 == 0 && q2 % 8 == 0 && p0 % 8 == 0 &&
                    p1 % 8 == 0 && p2 % 8 == 0 && aligned(qlat) && aligned(qrop);
  const bool vec = l2 == 1 && r2s == 1 && l0 % 8 == 0 && l1 % 8 == 0 && r0s % 8 == 0 && r1s % 8 == 0 && aligned(lat) && aligned(rop);
"#
    };
}
pub(crate) use partial_prologue;

/// The partial kernel's body (template `H` = heads x queries, the rows of the products; `LQ` =
/// queries; `SCALE` = the scale's float32 bits; `RANGES`: whether `ranges` holds the rows'
/// ranges, else every row spans the whole window). Inputs: `q_latent [B, heads, LQ, R]`,
/// `q_rope [B, heads, LQ, P]`, `latent [B, T, R]`, `rope [B, T, P]` (views, any strides),
/// `ranges` int32 `[lo_0, hi_0, lo_1, ...]` (each row's valid window range; any array, unread,
/// without `RANGES`). Outputs: `o_part [B, S, H, R]` float32 (unnormalized) and `ml [B, S, H, 2]`
/// (running max in log2 units, running sum). Every value comes by argument (shapes, template
/// arguments) but the ranges: on MLX's CUDA backend an array made on the host costs an
/// evaluation that reads it in a kernel about 30 us (measured on an H200), more than the
/// kernel itself at short contexts.
const PARTIAL: &str = concat!(
    r#"
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

"#,
    partial_prologue!(),
    r#"
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
          const uint16_t* src = !in ? lat : c < R ? lat + b * l0 + pos * l1 + c : rop + b * r0s + pos * r1s + (c - R);
          lc_cp_async16(sk + r * LD + c, src, in);
        }
        for (int i = tid; i < N * CW / 4; i += THREADS) {
          int r = i / (CW / 4), c = i % (CW / 4) * 4, pos = tile + r;
          const bool in = pos < end;
          lc_cp_async16(rc + r * CW + c, in ? cod + b * w0 + pos * w1 + c : cod, in);
        }
        for (int i = tid; i < N * SW; i += THREADS) {
          const int r = i / SW, j = i % SW, pos = tile + r;
          const bool in = pos < end, scale = FP8 || j < G / 2;
          const int e = FP8 ? 2 * j : 2 * (scale ? j : j - G / 2);  // in 16-bit units
          const uint16_t* src = !in ? scl : scale ? scl + (b * s0 + pos * s1) * (FP8 ? 2 : 1) + e : bia + b * z0 + pos * z1 + e;
          lc_cp_async4(rw + i, src, in);
        }
      }
      asm volatile("cp.async.commit_group;\n" ::);
    } else if (tile < end) {
      for (int i = tid; i < N * D; i += THREADS) {
        int r = i / D, c = i % D, pos = tile + r;
        if (c < C0 * 8) continue;
        uint16_t v = 0;
        if (pos < end) v = c < R ? lat[b * l0 + pos * l1 + c * l2] : rop[b * r0s + pos * r1s + (c - R) * r2s];
        sk[r * LD + c] = v;
      }
      for (int i = tid; i < N * CW; i += THREADS) {
        int r = i / CW, c = i % CW, pos = tile + r;
        uint32_t w = 0;
        if (pos < end && FP8) {
          #pragma unroll
          for (int k = 0; k < 4; k++) w |= static_cast<uint32_t>(cbytes[b * l0 + pos * l1 + (4 * c + k) * l2]) << (8 * k);
        } else if (pos < end) {
          w = cod[b * l0 + pos * l1 + c * l2];
        }
        rc[i] = w;
      }
      for (int i = tid; i < N * SW; i += THREADS) {
        const int r = i / SW, j = i % SW, pos = tile + r;
        uint32_t w = 0;
        if (pos < end && FP8) {
          w = reinterpret_cast<const uint32_t*>(scl)[b * s0 + pos * s1 + j * s2];
        } else if (pos < end) {
          const bool scale = j < G / 2;
          const int e = 2 * (scale ? j : j - G / 2);
          const uint16_t* row = scale ? scl + b * s0 + pos * s1 : bia + b * z0 + pos * z1;
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
        sv[c] = tile + q * C + c < lim ? v : LC_NEG_INF;
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
"#
);

/// The partial passes' inputs and outputs (this module's and `decode_wgmma`'s), by the names
/// their bodies give them.
pub(crate) const PARTIAL_INPUTS: &[&str] = &["q_latent", "q_rope", "latent", "rope", "ranges"];
pub(crate) const PARTIAL_OUTPUTS: &[&str] = &["o_part", "ml"];

/// The mma.sync pass's inputs: the partial passes' and a quantized latent's scales and biases
/// (any arrays, unread, over a 16-bit float latent).
const MMA_INPUTS: &[&str] = &["q_latent", "q_rope", "latent", "rope", "ranges", "lat_scales", "lat_biases"];

static PARTIAL_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_partial",
    inputs: MMA_INPUTS,
    outputs: PARTIAL_OUTPUTS,
    header: HEADER,
    body: PARTIAL,
    contiguous: false,
};

static COMBINE_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_combine",
    inputs: &["o_part", "ml"],
    outputs: &["out"],
    header: HEADER,
    body: COMBINE,
    contiguous: false,
};

/// The combine kernel's body: `out [B, H, R]` float32 (`[B, heads, LQ, R]`) from `o_part` and
/// `ml`, one block of 512 threads per row: the splits' weights `exp2(max_s - max)` once, in
/// shared memory, then groups of threads sum a share of the splits for every channel (four at a
/// time) and add their sums, so no thread walks all the splits alone.
const COMBINE: &str = r#"
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
"#;

/// The stored latent as the kernel reads it.
pub(crate) enum Latent<'a> {
    /// `[B, T, R]` in the queries' 16-bit dtype.
    Float(&'a Array),
    /// The storage mode's parts (`codes [B, T, ...]` then its scales, and biases for the affine
    /// modes), as `codec` lays them out.
    Packed { parts: &'a [Array], packing: Packing },
}

/// One partial pass: a latent (see `Latent`) and the rope `[B, T, P]` at the same positions, in
/// the queries' dtype, each row's positions to read, and whether the bottom-right aligned
/// causal mask applies (the row's end being its range's end).
pub(crate) struct Pass<'a> {
    pub latent: Latent<'a>,
    pub rope: &'a Array,
    pub ranges: Vec<(usize, usize)>,
    pub causal: bool,
}

impl Pass<'_> {
    fn positions(&self) -> usize {
        match &self.latent {
            Latent::Float(values) => values.shape()[1] as usize,
            Latent::Packed { parts, .. } => parts[0].shape()[1] as usize,
        }
    }
}

/// Absorbed MLA attention, `[B, H, Lq, R]` float32, lazily: `latent` (see `Latent`) and `rope
/// [B, T, P]` in the queries' dtype, `ranges` each row's valid window positions, `causal` the
/// bottom-right aligned causal mask over them (else every query sees the whole row). Callers
/// check `applies` (or `applies_packed`) first.
pub(crate) fn attend(
    q_latent: &Array,
    q_rope: &Array,
    latent: Latent<'_>,
    rope: &Array,
    ranges: &[(usize, usize)],
    scale: f32,
    causal: bool,
) -> Result<Array> {
    attend_passes(q_latent, q_rope, &[Pass { latent, rope, ranges: ranges.to_vec(), causal }], scale)
}

/// `attend` over positions held in several places (composed storage: each row's compact
/// positions and its hot ones): one partial pass over each, the blocks shared out by their
/// positions, and one combine over every pass's splits, so each row's softmax spans them all.
/// Every row must have a position in some pass; callers check `applies` (or `applies_packed`)
/// for each pass's shape.
pub(crate) fn attend_passes(q_latent: &Array, q_rope: &Array, passes: &[Pass<'_>], scale: f32) -> Result<Array> {
    let qs = q_latent.shape();
    let (batch, heads, queries, rank) = (qs[0] as usize, qs[1] as usize, qs[2] as usize, qs[3] as usize);
    remember_scale(scale);
    let total: usize = passes.iter().map(Pass::positions).sum();
    let mut partials = Vec::with_capacity(passes.len());
    for pass in passes {
        let target = (TARGET_BLOCKS * pass.positions()).div_ceil(total.max(1)).max(1);
        partials.push(partial(q_latent, q_rope, pass, scale, target)?);
    }
    // One pass: its splits as they are; several: side by side along the splits' axis.
    let [o, ml] = match partials.len() {
        1 => partials.pop().expect("one pass"),
        _ => {
            let joined = |i: usize| math::concatenate(&partials.iter().map(|p| &p[i]).collect::<Vec<_>>(), 1);
            [joined(0)?, joined(1)?]
        }
    };
    debug_assert!(ml.shape()[1] as usize <= MAX_SPLITS);
    let rows = (heads * queries) as i32;
    let out = apply(
        kernel(&COMBINE_KERNEL, 0)?,
        &[&o, &ml],
        Launch {
            outputs: &[(&[batch as i32, heads as i32, queries as i32, rank as i32], Dtype::Float32)],
            grid: [512, rows, batch as i32],
            block: [512, 1, 1],
            ints: &[("R", rank as i32), ("H", rows), ("MAX_SPLITS", MAX_SPLITS as i32)],
            bools: &[],
        },
    )?;
    KERNEL.launched();
    Ok(out.into_iter().next().expect("one output"))
}

/// One pass's partial kernel, in about `target` blocks: each split's unnormalized output `[B,
/// S, H * Lq, R]` and running max and sum `[B, S, H * Lq, 2]`.
fn partial(q_latent: &Array, q_rope: &Array, pass: &Pass<'_>, scale: f32, target: usize) -> Result<[Array; 2]> {
    let qs = q_latent.shape();
    let (batch, heads, queries, rank) = (qs[0] as usize, qs[1] as usize, qs[2] as usize, qs[3] as usize);
    let rope_dim = q_rope.shape()[3] as usize;
    let (stored, scales, biases, packing) = match &pass.latent {
        Latent::Float(values) => (*values, q_latent, q_latent, None),
        Latent::Packed { parts, packing } => (&parts[0], &parts[1], parts.get(2).unwrap_or(q_latent), Some(*packing)),
    };
    let bits = match packing {
        None => 0,
        Some(Packing::Affine(bits)) => bits,
        Some(Packing::Fp8) => 8,
    };
    let positions = pass.positions();
    // Every (head, query) pair is a row of the products; blocks take 64 rows each.
    let rows = heads * queries;
    let groups = rows.div_ceil(HEADS_PER_BLOCK);
    // Splits: about `target` blocks (one per multiprocessor for a single pass), at least
    // `MIN_TILES_PER_SPLIT` tiles of positions each (the wgmma pass's own minimum where it
    // runs; the kernel derives each split's share from their count and the window).
    let tiles = positions.div_ceil(POSITIONS_PER_TILE).max(1);
    // The wgmma pass reads 16-bit floats only.
    let wgmma = packing.is_none() && cuda::mla_decode_wgmma::applies(rank, rope_dim);
    let min_tiles = if wgmma { cuda::mla_decode_wgmma::MIN_TILES_PER_SPLIT } else { MIN_TILES_PER_SPLIT };
    let splits = (target / (batch * groups)).clamp(1, (tiles / min_tiles).max(1));
    let chunk = positions.div_ceil(splits).div_ceil(POSITIONS_PER_TILE) * POSITIONS_PER_TILE;
    let splits = positions.div_ceil(chunk).max(1);
    // Without a ranges array (rows spanning the window) the queries stand in for the unread input.
    let bounds = launch::ranges_array(&pass.ranges, positions);
    let whole = bounds.is_none();
    let bounds = bounds.unwrap_or_else(|| q_latent.clone());
    let bf16 = q_latent.dtype() == Dtype::Bfloat16;
    let ints = [
        ("R", rank as i32),
        ("P", rope_dim as i32),
        ("H", rows as i32),
        ("LQ", queries as i32),
        ("SCALE", scale.to_bits() as i32),
        ("BITS", bits as i32),
    ];
    let (b, s, h, r) = (batch as i32, splits as i32, rows as i32, rank as i32);
    let inputs = [q_latent, q_rope, stored, pass.rope, &bounds, scales, biases];
    let outputs: [(&[i32], Dtype); 2] = [(&[b, s, h, r], Dtype::Float32), (&[b, s, h, 2], Dtype::Float32)];
    // With one query, causal sees the whole row: one compiled kernel serves both.
    let bools =
        [("BF16", bf16), ("CAUSAL", pass.causal && queries > 1), ("RANGES", !whole), ("FP8", packing == Some(Packing::Fp8))];
    let out = match wgmma {
        true => cuda::mla_decode_wgmma::partial(
            &inputs[..5],
            &outputs,
            [s, b, groups as i32],
            &ints[..5],
            &bools[..3],
            rank + rope_dim,
        )?,
        false => apply(
            kernel(&PARTIAL_KERNEL, shared_bytes(rank + rope_dim, rank, packing))?,
            &inputs,
            Launch { outputs: &outputs, grid: [s * 512, b, groups as i32], block: [512, 1, 1], ints: &ints, bools: &bools },
        )?,
    };
    let mut out = out.into_iter();
    Ok([out.next().expect("two outputs"), out.next().expect("two outputs")])
}
