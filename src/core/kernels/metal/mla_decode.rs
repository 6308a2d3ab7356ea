//! Split-K flash decoding for absorbed MLA on MLX's Metal backend (Apple GPUs): the algorithm of
//! `decode_kernel` (each block walks its share of every row's positions with an online softmax
//! for many query heads at once; a second kernel combines the shares by log-sum-exp), written
//! for Apple's SIMD groups of 32 lanes in scalar float32 arithmetic. With GLM-5's 64 query heads
//! sharing one latent, a decode step on an Apple GPU is bound by its arithmetic rather than its
//! memory, so the kernel's aim is to do that arithmetic once per stored position and head, with
//! no scores matrix written out, where MLX's ops make four passes over `[B, H, Lq, T]`.
//!
//! **Untested on Apple hardware**: these machines have no Apple GPU or Metal compiler. The
//! kernels' sources are run by `tests/metal_emulation.rs` in a C++ emulation of Metal's SIMD
//! groups and threadgroups against a float64 reference, and on an Apple GPU by
//! `tests/decode_kernel.rs`. So that a defect costs speed and never a result, the first time a
//! process would use the kernel for a given shape it first runs it on a small problem of that
//! shape (`probe`) and compares it with a float64 computation on the host; if it fails to
//! compile, to run, or to agree, the kernel stays off for that shape and MLX's ops are used.
//!
//! - `partial`: threadgroup (split, row, group of 16 head-query rows), eight SIMD groups of two
//!   rows each. The threadgroup copies 8 positions at a time (latent and rope, as float32) into
//!   threadgroup memory; each lane holds every 32nd channel of its rows' queries, so a SIMD group
//!   computes 8 positions x 2 rows of partial dot products at once and sums them across lanes in
//!   one transposed butterfly (16 shuffles for the 16 scores, not 5 for each), then updates its
//!   online softmax and the output channels it holds.
//! - `combine`: per row, the splits' outputs weighted by `exp2(max_s - max)`.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use crate::core::error::Result;
use crate::core::kernels::cuda::mla_decode::{Shape, KERNEL};
use crate::core::kernels::launch::{Launch, Source};
use crate::core::kernels::metal;
use crate::core::kernels::metal::{apply, kernel};
use crate::core::mlx::ops;

/// Positions per tile, rows per SIMD group, SIMD groups per threadgroup (as in the sources).
const POSITIONS_PER_TILE: usize = 8;
const ROWS_PER_SIMDGROUP: usize = 2;
const SIMDGROUPS: usize = 8;
const ROWS_PER_GROUP: usize = ROWS_PER_SIMDGROUP * SIMDGROUPS;
/// Apple GPUs give a threadgroup 32 KiB; the tile takes `POSITIONS_PER_TILE` float rows.
const THREADGROUP_BYTES: usize = 28 * 1024;
/// The fewest tiles a split walks, and the threadgroups to aim for (a few per GPU core).
const MIN_TILES_PER_SPLIT: usize = 8;
const TARGET_THREADGROUPS: usize = 128;
/// The most splits (the combine keeps a weight per split in threadgroup memory).
const MAX_SPLITS: usize = 256;

const HEADER: &str = r#"
// Running maxima start here rather than at -inf, so that no comparison or exp2 depends on
// special values whatever math mode the kernel is compiled in.
constant constexpr float LC_NONE = -3.0e38f;
"#;

/// The partial kernel's body. Template arguments: `R`, `P` (latent and rope widths), `H` (rows:
/// heads x queries), `LQ` (queries), `CAUSAL` (bottom-right aligned). Inputs: `q_latent [B,
/// heads, LQ, R]`, `q_rope [B, heads, LQ, P]`, `latent [B, T, R]`, `rope [B, T, P]` (any
/// strides; float32, bfloat16 or float16), `ranges` int32 `[lo_0, hi_0, ...]` (each row's
/// valid positions), `scale` float32 `[1]`. Outputs: `o_part [B, S, H, R]` float32
/// (unnormalized) and `ml [B, S, H, 2]` (running max in log2 units, running sum).
const PARTIAL: &str = r#"
  constexpr int NB = 8, HB = 2, NSG = 8, M = HB * NSG, K = NB * HB, SPREAD = 32 / K;
  constexpr int D = R + P, RL = R / 32, PL = P / 32;
  threadgroup float kt[NB * D];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int lane = static_cast<int>(thread_index_in_simdgroup), sg = static_cast<int>(simdgroup_index_in_threadgroup);
  const int split = static_cast<int>(threadgroup_position_in_grid.x), S = static_cast<int>(threadgroups_per_grid.x);
  const int b = static_cast<int>(threadgroup_position_in_grid.y);
  const int r0 = static_cast<int>(threadgroup_position_in_grid.z) * M + sg * HB;
  // Split s takes positions [s * chunk, (s + 1) * chunk): whole tiles, S of them covering T.
  const int T = latent_shape[1], chunk = ((T + S - 1) / S + NB - 1) / NB * NB;
  const int lo = ranges[2 * b], hi = ranges[2 * b + 1];
  const int begin = max(lo, split * chunk), end = min(min(hi, T), (split + 1) * chunk);
  const float sc = scale[0] * 1.4426950408889634f;
  const int64_t q0 = q_latent_strides[0], q1 = q_latent_strides[1], q2 = q_latent_strides[2], q3 = q_latent_strides[3];
  const int64_t p0 = q_rope_strides[0], p1 = q_rope_strides[1], p2 = q_rope_strides[2], p3 = q_rope_strides[3];
  const int64_t l0 = latent_strides[0], l1 = latent_strides[1], l2 = latent_strides[2];
  const int64_t e0 = rope_strides[0], e1 = rope_strides[1], e2 = rope_strides[2];

  // This lane's channels of its SIMD group's rows' queries, scaled to log2 units: latent
  // channels lane, lane + 32, ...; then the rope's. Rows past H read row H - 1 and are not written.
  float q[HB][RL + PL];
  for (int hh = 0; hh < HB; hh++) {
    const int row = min(r0 + hh, H - 1), head = row / LQ, qi = row % LQ;
    for (int i = 0; i < RL; i++) {
      q[hh][i] = static_cast<float>(q_latent[b * q0 + head * q1 + qi * q2 + (i * 32 + lane) * q3]) * sc;
    }
    for (int i = 0; i < PL; i++) {
      q[hh][RL + i] = static_cast<float>(q_rope[b * p0 + head * p1 + qi * p2 + (i * 32 + lane) * p3]) * sc;
    }
  }
  // After the butterfly, lane l holds score (l / SPREAD): position j = (l / SPREAD) / HB of the
  // tile for row hh = (l / SPREAD) % HB of its group; it keeps that row's running max and sum.
  const int mine = (lane / SPREAD) % HB, my_row = min(r0 + mine, H - 1);
  // Causal: query i of LQ sees the row's positions up to hi - LQ + i.
  const int lim = CAUSAL ? min(end, hi - LQ + 1 + my_row % LQ) : end;
  float m_run = LC_NONE, l_run = 0.f;
  float o[HB][RL];
  for (int hh = 0; hh < HB; hh++) {
    for (int i = 0; i < RL; i++) o[hh][i] = 0.f;
  }

  for (int t0 = begin; t0 < end; t0 += NB) {
    // The previous tile is done with; the threadgroup copies this one in.
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int i = tid; i < NB * D; i += NSG * 32) {
      const int j = i / D, c = i % D, pos = t0 + j;
      float v = 0.f;
      if (pos < end) {
        v = c < R ? static_cast<float>(latent[b * l0 + pos * l1 + c * l2])
                  : static_cast<float>(rope[b * e0 + pos * e1 + (c - R) * e2]);
      }
      kt[i] = v;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);

    // Partial dot products over this lane's channels: v[j * HB + hh].
    float v[K];
    for (int j = 0; j < NB; j++) {
      for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = 0.f;
      for (int i = 0; i < RL; i++) {
        const float k = kt[j * D + i * 32 + lane];
        for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = fma(q[hh][i], k, v[j * HB + hh]);
      }
      for (int i = 0; i < PL; i++) {
        const float k = kt[j * D + R + i * 32 + lane];
        for (int hh = 0; hh < HB; hh++) v[j * HB + hh] = fma(q[hh][RL + i], k, v[j * HB + hh]);
      }
    }
    // Transposed butterfly: at each step a lane keeps half its sums and adds its partner's
    // share of that half, until each holds one complete score; the rest sum across copies.
    // (Unrolled, so that v stays in registers: its indices are then constants.)
    int ofs = 16;
    MLX_MTL_PRAGMA_UNROLL
    for (int n = K; n > 1; n >>= 1, ofs >>= 1) {
      const bool upper = (lane & ofs) != 0;
      MLX_MTL_PRAGMA_UNROLL
      for (int i = 0; i < n / 2; i++) {
        const float give = upper ? v[i] : v[i + n / 2];
        const float keep = upper ? v[i + n / 2] : v[i];
        v[i] = keep + simd_shuffle_xor(give, static_cast<ushort>(ofs));
      }
    }
    for (; ofs >= 1; ofs >>= 1) v[0] += simd_shuffle_xor(v[0], static_cast<ushort>(ofs));

    // Online softmax over the lanes holding this lane's row.
    const int pos = t0 + (lane / SPREAD) / HB;
    const float s = pos < lim ? v[0] : LC_NONE;
    float mx = s;
    for (int x = SPREAD * HB; x < 32; x <<= 1) mx = max(mx, simd_shuffle_xor(mx, static_cast<ushort>(x)));
    const float m_new = max(m_run, mx);
    const float p = s <= LC_NONE ? 0.f : exp2(s - m_new);
    float sum = p;
    for (int x = SPREAD * HB; x < 32; x <<= 1) sum += simd_shuffle_xor(sum, static_cast<ushort>(x));
    const float alpha = m_run <= LC_NONE ? 0.f : exp2(m_run - m_new);
    l_run = l_run * alpha + sum;
    m_run = m_new;

    // Output channels lane, lane + 32, ... of each row: rescale, then add the tile's weighted latent.
    for (int hh = 0; hh < HB; hh++) {
      const float a = simd_shuffle(alpha, static_cast<ushort>(hh * SPREAD));
      for (int i = 0; i < RL; i++) o[hh][i] *= a;
    }
    for (int j = 0; j < NB; j++) {
      for (int hh = 0; hh < HB; hh++) {
        const float pj = simd_shuffle(p, static_cast<ushort>((j * HB + hh) * SPREAD));
        for (int i = 0; i < RL; i++) o[hh][i] = fma(pj, kt[j * D + i * 32 + lane], o[hh][i]);
      }
    }
  }

  for (int hh = 0; hh < HB; hh++) {
    if (r0 + hh < H) {
      const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + r0 + hh) * R;
      for (int i = 0; i < RL; i++) o_part[at + i * 32 + lane] = o[hh][i];
    }
  }
  if (lane < HB * SPREAD && lane % SPREAD == 0 && r0 + mine < H) {
    const int64_t at = ((static_cast<int64_t>(b) * S + split) * H + r0 + mine) * 2;
    ml[at] = m_run;
    ml[at + 1] = l_run;
  }
"#;

/// The combine kernel's body: `out [B, H, R]` float32 (`[B, heads, LQ, R]`) from `o_part` and
/// `ml`, one threadgroup of 256 threads per row.
const COMBINE: &str = r#"
  constexpr int THREADS = 256;
  threadgroup float w[MAX_SPLITS];
  const int tid = static_cast<int>(thread_index_in_threadgroup);
  const int h = static_cast<int>(threadgroup_position_in_grid.y), b = static_cast<int>(threadgroup_position_in_grid.z);
  const int S = ml_shape[1];
  const int64_t base = static_cast<int64_t>(b) * S * H + h;
  float m = LC_NONE;
  for (int s = 0; s < S; s++) m = max(m, ml[(base + static_cast<int64_t>(s) * H) * 2]);
  for (int s = tid; s < S; s += THREADS) {
    const float ms = ml[(base + static_cast<int64_t>(s) * H) * 2];
    w[s] = ms <= LC_NONE ? 0.f : exp2(ms - m);
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float den = 0.f;
  for (int s = 0; s < S; s++) den += w[s] * ml[(base + static_cast<int64_t>(s) * H) * 2 + 1];
  const float inv = 1.f / den;
  for (int c = tid; c < R; c += THREADS) {
    float acc = 0.f;
    for (int s = 0; s < S; s++) acc = fma(w[s], o_part[(base + static_cast<int64_t>(s) * H) * R + c], acc);
    out[(static_cast<int64_t>(b) * H + h) * R + c] = acc * inv;
  }
"#;

static PARTIAL_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_partial_metal",
    inputs: &["q_latent", "q_rope", "latent", "rope", "ranges", "scale"],
    outputs: &["o_part", "ml"],
    header: HEADER,
    body: PARTIAL,
    contiguous: false,
};

static COMBINE_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_combine_metal",
    inputs: &["o_part", "ml"],
    outputs: &["out"],
    header: HEADER,
    body: COMBINE,
    contiguous: true,
};

/// The kernels' sources (header, partial body, combine body), for the emulation test.
#[doc(hidden)]
pub fn sources() -> (&'static str, &'static str, &'static str) {
    (HEADER, PARTIAL, COMBINE)
}

/// The splits `positions` are divided into for `batch` rows of `rows` (head, query) rows: about
/// `TARGET_THREADGROUPS` threadgroups, at least `MIN_TILES_PER_SPLIT` tiles each.
fn splits(batch: usize, rows: usize, positions: usize) -> usize {
    let groups = rows.div_ceil(ROWS_PER_GROUP);
    let tiles = positions.div_ceil(POSITIONS_PER_TILE);
    let most = (tiles / MIN_TILES_PER_SPLIT).clamp(1, MAX_SPLITS);
    (TARGET_THREADGROUPS / (batch * groups).max(1)).clamp(1, most)
}

/// What a probe is keyed by: the compiled kernel's template arguments and the storage dtype.
type ProbeKey = (Dtype, usize, usize, usize, usize, bool);

/// Probes run so far and whether each passed.
static PROBES: Lazy<Mutex<Vec<(ProbeKey, bool)>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// Whether the kernel computes this attention: an Apple GPU, latent and rope stored in the
/// queries' float dtype (float32, bfloat16 or float16), widths that divide among 32 lanes, the
/// tile within threadgroup memory, and the kernel having passed its probe for this shape.
pub fn applies(storage: Dtype, q_dtype: Dtype, s: &Shape, causal: bool) -> bool {
    let rows = s.heads * s.queries;
    let fits = KERNEL.enabled()
        && metal::on_metal()
        && matches!(storage, Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16)
        && q_dtype == storage
        && s.rank % 32 == 0
        && s.rope % 32 == 0
        && s.rank > 0
        && s.rope > 0
        && POSITIONS_PER_TILE * (s.rank + s.rope) * 4 <= THREADGROUP_BYTES
        && (1..=65535).contains(&rows)
        && (1..=65535).contains(&s.batch)
        && (1..=i32::MAX as usize).contains(&s.positions);
    fits && probed((storage, s.rank, s.rope, s.heads, s.queries, causal && s.queries > 1))
}

/// Whether the kernel passed its probe for `key`, probing it the first time.
fn probed(key: ProbeKey) -> bool {
    let mut probes = PROBES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&(_, passed)) = probes.iter().find(|(k, _)| *k == key) {
        return passed;
    }
    let passed = match probe(key, launch) {
        Ok(error) if error <= PROBE_TOLERANCE => true,
        outcome => {
            eprintln!(
                "latent-cache: the Metal decode kernel is off for {key:?} (its check against the host gave {outcome:?}); \
                 MLX's ops compute that attention instead"
            );
            false
        }
    };
    probes.push((key, passed));
    passed
}

/// The probe's bound on the largest difference from the float64 result, relative to the
/// largest output: the kernel computes in float32 from the stored values, so it is off by
/// rounding only; a wrong index or mask is off by far more.
const PROBE_TOLERANCE: f64 = 1e-3;

/// `launch`'s signature: the kernel, or a stand-in in tests.
type Attend = fn([&Array; 4], &[(usize, usize)], f32, bool) -> Result<Array>;

/// Runs the kernel for `key` (`run`) over a small problem (two rows, one padded and ragged, 300
/// positions in several splits) of values exact in every storage dtype, and returns its largest
/// difference from a float64 computation on the host, relative to the largest output.
fn probe((dtype, rank, rope, heads, queries, causal): ProbeKey, run: Attend) -> Result<f64> {
    let (batch, positions, ranges) = (2, 300, [(0usize, 300usize), (7, 290)]);
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut values = |n: usize| -> Vec<f32> {
        (0..n)
            .map(|_| {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                ((seed % 65) as f32 - 32.0) / 64.0
            })
            .collect()
    };
    let (ql, qr) = (values(batch * heads * queries * rank), values(batch * heads * queries * rope));
    let (lat, rop) = (values(batch * positions * rank), values(batch * positions * rope));
    let array = |data: &[f32], shape: &[usize]| ops::astype(&ops::from_host(data, shape, "probe")?, dtype);
    let arrays = [
        array(&ql, &[batch, heads, queries, rank])?,
        array(&qr, &[batch, heads, queries, rope])?,
        array(&lat, &[batch, positions, rank])?,
        array(&rop, &[batch, positions, rope])?,
    ];
    let out = run(arrays.each_ref(), &ranges, 0.125, causal)?;
    let got = ops::to_host(&out)?;
    let (mut worst, mut largest) = (0f64, 0f64);
    for (b, &(lo, hi)) in ranges.iter().enumerate() {
        for row in 0..heads * queries {
            let (q, qi) = (b * heads * queries + row, row % queries);
            let end = if causal { hi - queries + 1 + qi } else { hi };
            let dot = |t: usize| -> f64 {
                let l: f64 = (0..rank).map(|c| ql[q * rank + c] as f64 * lat[(b * positions + t) * rank + c] as f64).sum();
                let r: f64 = (0..rope).map(|c| qr[q * rope + c] as f64 * rop[(b * positions + t) * rope + c] as f64).sum();
                0.125 * (l + r)
            };
            let scores: Vec<f64> = (lo..end).map(dot).collect();
            let top = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..rank {
                let want: f64 =
                    (lo..end).zip(&weights).map(|(t, w)| w * lat[(b * positions + t) * rank + c] as f64).sum::<f64>() / total;
                worst = worst.max((want - got[q * rank + c] as f64).abs());
                largest = largest.max(want.abs());
            }
        }
    }
    Ok(worst / largest.max(1e-30))
}

/// Absorbed MLA attention, `[B, H, Lq, R]` float32, lazily, over `latent [B, T, R]` and `rope
/// [B, T, P]` stored in the queries' dtype: `ranges` each row's valid window positions, `causal`
/// the bottom-right aligned causal mask over them. Callers check `applies` first.
pub(crate) fn attend(
    q_latent: &Array,
    q_rope: &Array,
    latent: &Array,
    rope: &Array,
    ranges: &[(usize, usize)],
    scale: f32,
    causal: bool,
) -> Result<Array> {
    let out = launch([q_latent, q_rope, latent, rope], ranges, scale, causal)?;
    KERNEL.launched();
    Ok(out)
}

/// `attend` without counting the launch (the probe's), its arrays in `attend`'s order.
fn launch(arrays: [&Array; 4], ranges: &[(usize, usize)], scale: f32, causal: bool) -> Result<Array> {
    let [q_latent, q_rope, latent, rope] = arrays;
    let qs = q_latent.shape();
    let (batch, heads, queries, rank) = (qs[0] as usize, qs[1] as usize, qs[2] as usize, qs[3] as usize);
    let rope_dim = q_rope.shape()[3] as usize;
    let positions = latent.shape()[1] as usize;
    let rows = heads * queries;
    let splits = splits(batch, rows, positions);
    let groups = rows.div_ceil(ROWS_PER_GROUP);
    // Padded to 8 values: MLX passes inputs of fewer in Metal's constant address space, a kernel
    // compiled apart from the probed one (which has two rows).
    let mut bounds: Vec<i32> = ranges.iter().flat_map(|&(lo, hi)| [lo as i32, hi as i32]).collect();
    bounds.resize(bounds.len().max(8), 0);
    let bounds = ops::indices(&bounds, &[bounds.len()]);
    let scale = Array::from_slice(&[scale], &[1]);
    let (b, s, h, r) = (batch as i32, splits as i32, rows as i32, rank as i32);
    let ints = [("R", r), ("P", rope_dim as i32), ("H", h), ("LQ", queries as i32)];
    let threads = (SIMDGROUPS * 32) as i32;
    let parts = apply(
        kernel(&PARTIAL_KERNEL)?,
        &[q_latent, q_rope, latent, rope, &bounds, &scale],
        Launch {
            outputs: &[(&[b, s, h, r], Dtype::Float32), (&[b, s, h, 2], Dtype::Float32)],
            grid: [s * threads, b, groups as i32],
            block: [threads, 1, 1],
            ints: &ints,
            bools: &[("CAUSAL", causal && queries > 1)],
        },
    )?;
    let out = apply(
        kernel(&COMBINE_KERNEL)?,
        &[&parts[0], &parts[1]],
        Launch {
            outputs: &[(&[b, heads as i32, queries as i32, r], Dtype::Float32)],
            grid: [256, h, b],
            block: [256, 1, 1],
            ints: &[("R", r), ("H", h), ("MAX_SPLITS", MAX_SPLITS as i32)],
            bools: &[],
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention computed on the host in float32 from the inputs' values, with `skew` added to
    /// the first position each row's queries see (0: right).
    fn host(inputs: [&Array; 4], ranges: &[(usize, usize)], scale: f32, causal: bool, skew: usize) -> Result<Array> {
        let [q_l, q_r, lat, rope] = inputs;
        let read = |a: &Array| ops::to_host(&ops::astype(a, Dtype::Float32)?);
        let (ql, qr, l, r) = (read(q_l)?, read(q_r)?, read(lat)?, read(rope)?);
        let (s, t) = (q_l.shape(), lat.shape()[1] as usize);
        let (heads, queries, rank, width) = (s[1] as usize, s[2] as usize, s[3] as usize, q_r.shape()[3] as usize);
        let mut out = Vec::new();
        for (b, &(lo, hi)) in ranges.iter().enumerate() {
            for row in 0..heads * queries {
                let q = b * heads * queries + row;
                let end = if causal { hi - queries + 1 + row % queries } else { hi };
                let dot = |p: usize| -> f32 {
                    let a: f32 = (0..rank).map(|c| ql[q * rank + c] * l[(b * t + p) * rank + c]).sum();
                    a + (0..width).map(|c| qr[q * width + c] * r[(b * t + p) * width + c]).sum::<f32>()
                };
                let w: Vec<f32> = (lo + skew..end).map(|p| (scale * dot(p)).exp()).collect();
                let total: f32 = w.iter().sum();
                for c in 0..rank {
                    out.push((lo + skew..end).zip(&w).map(|(p, w)| w * l[(b * t + p) * rank + c]).sum::<f32>() / total);
                }
            }
        }
        ops::from_host(&out, &[ranges.len(), heads, queries, rank], "host attention")
    }

    fn right(inputs: [&Array; 4], r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, r, s, causal, 0)
    }

    fn misses_first(inputs: [&Array; 4], r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, r, s, causal, 1)
    }

    fn noncausal(inputs: [&Array; 4], r: &[(usize, usize)], s: f32, _: bool) -> Result<Array> {
        host(inputs, r, s, false, 0)
    }

    /// The probe passes an attention computed right and fails ones that miss a row's first
    /// position or ignore the causal mask, so a defective kernel is turned off, a sound one kept.
    #[test]
    fn probe_tells_right_attention_from_wrong() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            let key = (dtype, 64, 32, 3, 2, true);
            assert!(probe(key, right).unwrap() <= PROBE_TOLERANCE, "{dtype:?}: right attention passes");
            assert!(probe(key, misses_first).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: a missed position fails");
            assert!(probe(key, noncausal).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: an ignored mask fails");
        }
    }
}
