//! Split-K flash decoding for absorbed MLA on MLX's Metal backend (Apple GPUs): the algorithm of
//! `cuda::mla_decode` (each block walks its share of every row's positions with an online softmax
//! for many query heads at once; a second kernel combines the shares by log-sum-exp), written
//! for Apple's SIMD groups of 32 lanes in scalar float32 arithmetic. With GLM-5's 64 query heads
//! sharing one latent, a decode step on an Apple GPU is bound by its arithmetic rather than its
//! memory, so the kernel's aim is to do that arithmetic once per stored position and head, with
//! no scores matrix written out, where MLX's ops make four passes over `[B, H, Lq, T]`.
//!
//! **Untested on Apple hardware**: these machines have no Apple GPU or Metal compiler. The
//! kernels' sources are run by `tests/attention/metal_emulation.rs` in a C++ emulation of Metal's SIMD
//! groups and threadgroups against a float64 reference, and on an Apple GPU by
//! `tests/decode_kernel.rs`. So that a defect costs speed and never a result, the first time a
//! process would use the kernel for a given shape it first runs it on a small problem of that
//! shape (`mla_decode_probe`) and compares it with a float64 computation on the host; if it
//! fails to compile, to run, or to agree, the kernel stays off for that shape and MLX's ops are
//! used.
//!
//! - `partial`: threadgroup (split, row, group of 16 head-query rows), eight SIMD groups of two
//!   rows each. The threadgroup copies 8 positions at a time (latent and rope, as float32) into
//!   threadgroup memory; each lane holds every 32nd channel of its rows' queries, so a SIMD group
//!   computes 8 positions x 2 rows of partial dot products at once and sums them across lanes in
//!   one transposed butterfly (16 shuffles for the 16 scores, not 5 for each), then updates its
//!   online softmax and the output channels it holds.
//! - `combine`: per row, the splits' outputs weighted by `exp2(max_s - max)`.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::decode::Shape;
use crate::core::kernels::launch::{Launch, Source, Switch};
use crate::core::kernels::metal::launch::{apply, kernel, on_metal};
use crate::core::kernels::metal::mla_decode_probe::probed;
use crate::core::mlx::ops;

/// This kernel's switch and launch count (see `kernels::launch::Switch`): its own, so that a
/// launch here never counts as the CUDA kernel's.
pub static KERNEL: Switch = Switch::new();

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

const HEADER: &str = include_str!("src/mla_decode.h.metal");

/// The partial kernel's body. Template arguments: `R`, `P` (latent and rope widths), `H` (rows:
/// heads x queries), `LQ` (queries), `CAUSAL` (bottom-right aligned). Inputs: `q_latent [B,
/// heads, LQ, R]`, `q_rope [B, heads, LQ, P]`, `latent [B, T, R]`, `rope [B, T, P]` (any
/// strides; float32, bfloat16 or float16), `ranges` int32 `[lo_0, hi_0, ...]` (each row's
/// valid positions; with `GATHER` the stored positions its selection may name), `scale` float32 `[1]`, `sel` int32 `[B, 1, k]` (with `GATHER`, the stored
/// positions that make the window: `T` is `k`; any int32 array, unread, without). Outputs: `o_part [B, S, H, R]` float32
/// (unnormalized) and `ml [B, S, H, 2]` (running max in log2 units, running sum).
const PARTIAL: &str = include_str!("src/mla_decode_partial.metal");

/// The combine kernel's body: `out [B, H, R]` float32 (`[B, heads, LQ, R]`) from `o_part` and
/// `ml`, one threadgroup of 256 threads per row.
const COMBINE: &str = include_str!("src/mla_decode_combine.metal");

static PARTIAL_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_partial_metal",
    inputs: &["q_latent", "q_rope", "latent", "rope", "ranges", "scale", "sel"],
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

/// The splits `positions` are divided into for `batch` rows of `rows` (head, query) rows: about
/// `TARGET_THREADGROUPS` threadgroups, at least `MIN_TILES_PER_SPLIT` tiles each.
fn splits(batch: usize, rows: usize, positions: usize) -> usize {
    let groups = rows.div_ceil(ROWS_PER_GROUP);
    let tiles = positions.div_ceil(POSITIONS_PER_TILE);
    let most = (tiles / MIN_TILES_PER_SPLIT).clamp(1, MAX_SPLITS);
    (TARGET_THREADGROUPS / (batch * groups).max(1)).clamp(1, most)
}

/// Whether the kernel computes this attention: an Apple GPU, latent and rope stored in the
/// queries' float dtype (float32, bfloat16 or float16), widths that divide among 32 lanes, the
/// tile within threadgroup memory, and the kernel having passed its probe for this shape
/// (`gather`: reading a selection through its indices, `attend_selected`).
pub fn applies(storage: Dtype, q_dtype: Dtype, s: &Shape, causal: bool, gather: bool) -> bool {
    let rows = s.heads * s.queries;
    let fits = KERNEL.enabled()
        && on_metal()
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
    fits && probed((storage, s.rank, s.rope, s.heads, s.queries, causal && s.queries > 1, gather), launch)
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
    let out = launch([q_latent, q_rope, latent, rope], None, ranges, scale, causal)?;
    KERNEL.launched();
    Ok(out)
}

/// `attend` of one query a row over the row's selected positions, `selected [B, 1, k]` int32
/// stored positions read through as the tiles are copied in (no gathered copy): those within
/// the row's `seen` stored positions are visible, the others masked (a decode step sees every
/// stored position; a prefill chunk's query, a row of its own, those before its own). Callers
/// check `applies` with `gather` first, and that `B * k` is at least 8 (MLX passes smaller
/// inputs in another address space: a kernel compiled apart from the probed one).
pub(crate) fn attend_selected(
    q_latent: &Array,
    q_rope: &Array,
    latent: &Array,
    rope: &Array,
    selected: &Array,
    seen: &[(usize, usize)],
    scale: f32,
) -> Result<Array> {
    let out = launch([q_latent, q_rope, latent, rope], Some(selected), seen, scale, false)?;
    KERNEL.launched();
    Ok(out)
}

/// `attend` without counting the launch (the probe's), its arrays in `attend`'s order.
pub(super) fn launch(
    arrays: [&Array; 4],
    selected: Option<&Array>,
    ranges: &[(usize, usize)],
    scale: f32,
    causal: bool,
) -> Result<Array> {
    let [q_latent, q_rope, latent, rope] = arrays;
    let qs = q_latent.shape();
    let (batch, heads, queries, rank) = (qs[0] as usize, qs[1] as usize, qs[2] as usize, qs[3] as usize);
    let rope_dim = q_rope.shape()[3] as usize;
    let positions = selected.map_or(latent.shape()[1], |s| s.shape()[2]) as usize;
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
        // Without a selection the ranges stand in for the unread `sel`.
        &[q_latent, q_rope, latent, rope, &bounds, &scale, selected.unwrap_or(&bounds)],
        Launch {
            outputs: &[(&[b, s, h, r], Dtype::Float32), (&[b, s, h, 2], Dtype::Float32)],
            grid: [s * threads, b, groups as i32],
            block: [threads, 1, 1],
            ints: &ints,
            bools: &[("CAUSAL", causal && queries > 1), ("GATHER", selected.is_some())],
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
