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
//!   9.0 (H100, H200) `mla_decode_wgmma`'s pass replaces it: the same outputs, with `wgmma` products
//!   and the tiles streamed in by a warpgroup of their own.
//! - `combine`: each output channel sums the splits, weighted by `exp(max_s - max)`.
//!
//! Over a few positions (a DSA step's 2048 selected ones) on Hopper GPUs the two are one
//! operation: `mla_decode_wgmma`'s one-pass decode combines its splits in a thread block cluster.
//! The host's cost per operation, not the GPU's work, bounds a whole model's sparse decode step.
//!
//! Taken by `Donor::attend` where it applies (see `applies`); the MLX-ops path is the fallback
//! and the reference it is tested against (`tests/decode_kernel.rs`, run on an H200). Its Metal
//! counterpart is `metal::mla_decode`.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, kernel};
use crate::core::kernels::cuda::mla_decode_common::{partial_prologue, two, PARTIAL_OUTPUTS};
use crate::core::kernels::cuda::mla_decode_wgmma;
use crate::core::kernels::cuda::mla_decode_wgmma::Form;
use crate::core::kernels::launch::{Launch, Source, Switch};
use crate::core::mlx::{math, ops};
use crate::core::model::storage_mode::{Packing, AFFINE_GROUP, FP8_BLOCK};

// `Shape` was this module's before the Metal decode shared it; callers still name it here.
pub use crate::core::kernels::decode::Shape;

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

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
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

const HEADER: &str = concat!(include_str!("src/mma.cuh"), include_str!("src/mla_decode.cuh"));

/// The partial kernel's body (template `H` = heads x queries, the rows of the products; `LQ` =
/// queries; `SCALE` = the scale's float32 bits; `RANGES`: whether `ranges` holds the rows'
/// ranges, else every row spans the whole window). Inputs: `q_latent [B, heads, LQ, R]`,
/// `q_rope [B, heads, LQ, P]`, `latent [B, T, R]`, `rope [B, T, P]` (views, any strides),
/// `ranges` int32 `[lo_0, hi_0, lo_1, ...]` (each row's valid window range, or with `GATHER`
/// the range of stored positions its selection may name; any array, unread, without `RANGES`), `sel` int32 `[B, 1, k]` (with `GATHER`, the stored positions that make
/// the window: `T` is `k`; any array, unread, without). Outputs: `o_part [B, S, H, R]` float32 (unnormalized) and `ml [B, S, H, 2]`
/// (running max in log2 units, running sum). Every value comes by argument (shapes, template
/// arguments) but the ranges: on MLX's CUDA backend an array made on the host costs an
/// evaluation that reads it in a kernel about 30 us (measured on an H200), more than the
/// kernel itself at short contexts.
const PARTIAL: &str =
    concat!(include_str!("src/mla_decode_partial_layout.cu"), partial_prologue!(), include_str!("src/mla_decode_partial.cu"));

/// The mma.sync pass's inputs: the partial passes' and a quantized latent's scales and biases
/// (any arrays, unread, over a 16-bit float latent).
const MMA_INPUTS: &[&str] = &["q_latent", "q_rope", "latent", "rope", "ranges", "sel", "lat_scales", "lat_biases"];

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
const COMBINE: &str = include_str!("src/mla_decode_combine.cu");

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
    /// The pass's one row serves every row of the queries (a shared prefix's piece): the rows
    /// fold into the heads (`[1, B * H, Lq, w]`), so each position is read once for all of them.
    pub shared: bool,
    /// The stored positions each row reads, `[B, 1, k]` int32 (a DSA decode step's selection),
    /// read through as the tiles are copied in: the pass's window is these `k` positions, in
    /// this order, and the latent and rope are the whole stored buffers, never a gathered copy.
    /// With it, `ranges` bound the stored positions it may name (all `(0, k)`: no bound).
    pub selected: Option<&'a Array>,
}

impl Pass<'_> {
    fn positions(&self) -> usize {
        if let Some(selected) = self.selected {
            return selected.shape()[2] as usize;
        }
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
    attend_passes(
        q_latent,
        q_rope,
        &[Pass { latent, rope, ranges: ranges.to_vec(), causal, shared: false, selected: None }],
        scale,
    )
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
    if let [pass] = passes {
        // Few positions (a DSA step's selection, a short window): one pass, its splits combined
        // in a thread block cluster, one operation fewer (Hopper GPUs, MLX without its CUDA
        // graphs; `mla_decode_wgmma`, `clusters`).
        if !pass.shared && matches!(pass.latent, Latent::Float(_)) {
            let rope_dim = q_rope.shape()[3] as usize;
            if mla_decode_wgmma::one_pass_applies(rank, rope_dim, pass.positions()) {
                let out = partial(q_latent, q_rope, pass, scale, Splits::OnePass)?;
                KERNEL.launched();
                return Ok(out.into_iter().next().expect("one output"));
            }
        }
    }
    let total: usize = passes.iter().map(Pass::positions).sum();
    let mut partials = Vec::with_capacity(passes.len());
    for pass in passes {
        let target = (TARGET_BLOCKS * pass.positions()).div_ceil(total.max(1)).max(1);
        if !pass.shared {
            partials.push(two(partial(q_latent, q_rope, pass, scale, Splits::About(target))?));
            continue;
        }
        // One row for all: `[1, S, B * H * Lq, ...]` partials laid out as the other passes'
        // `[B, S, H * Lq, ...]` (a copy of the partials, never of the positions).
        let fold = |q: &Array| ops::reshape(q, &[1, batch * heads, queries, q.shape()[3] as usize]);
        let [o, ml] = two(partial(&fold(q_latent)?, &fold(q_rope)?, pass, scale, Splits::About(target))?);
        let unfold = |x: &Array| -> Result<Array> {
            let s = x.shape();
            let per_row = ops::reshape(x, &[s[1] as usize, batch, heads * queries, s[3] as usize])?;
            ops::contiguous(&math::swapaxes(&per_row, 0, 1)?)
        };
        partials.push([unfold(&o)?, unfold(&ml)?]);
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

/// How a partial pass splits its positions.
enum Splits {
    /// In about this many blocks: each split's unnormalized output `[B, S, H * Lq, R]` and
    /// running max and sum `[B, S, H * Lq, 2]`, for `combine`.
    About(usize),
    /// The one-pass decode's cluster of splits: the attention's output, as `combine`'s.
    OnePass,
}

/// One pass's partial kernel (see `Splits`).
fn partial(q_latent: &Array, q_rope: &Array, pass: &Pass<'_>, scale: f32, splits: Splits) -> Result<Vec<Array>> {
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
    // The wgmma pass reads 16-bit floats only; the one pass is its form (the caller decided).
    let one_pass = matches!(splits, Splits::OnePass);
    let wgmma = one_pass || (packing.is_none() && mla_decode_wgmma::applies(rank, rope_dim));
    let min_tiles = if wgmma { mla_decode_wgmma::MIN_TILES_PER_SPLIT } else { MIN_TILES_PER_SPLIT };
    let (splits, form) = match splits {
        Splits::About(target) => {
            let splits = (target / (batch * groups)).clamp(1, (tiles / min_tiles).max(1));
            let chunk = positions.div_ceil(splits).div_ceil(POSITIONS_PER_TILE) * POSITIONS_PER_TILE;
            // Many splits over 16-bit floats: in clusters (every split of a cluster runs).
            let splits = positions.div_ceil(chunk).max(1);
            mla_decode_wgmma::form(wgmma, splits, rank, rope_dim)
        }
        // Every split of the cluster runs (those past the positions see none).
        Splits::OnePass => (mla_decode_wgmma::CLUSTER_SIZE, Form::OnePass),
    };
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
    // Without a selection the queries stand in for the unread `sel`.
    let inputs = [q_latent, q_rope, stored, pass.rope, &bounds, pass.selected.unwrap_or(q_latent), scales, biases];
    let combined = [batch as i32, heads as i32, queries as i32, r];
    let written = form.outputs(s);
    let outputs: &[(&[i32], Dtype)] = match form {
        Form::OnePass => &[(&combined, Dtype::Float32)],
        _ => &[(&[b, written, h, r], Dtype::Float32), (&[b, written, h, 2], Dtype::Float32)],
    };
    // With one query, causal sees the whole row: one compiled kernel serves both.
    let bools = [
        ("BF16", bf16),
        ("CAUSAL", pass.causal && queries > 1),
        ("RANGES", !whole),
        ("GATHER", pass.selected.is_some()),
        ("FP8", packing == Some(Packing::Fp8)),
    ];
    let blocks = [s, b, groups as i32];
    match wgmma {
        true => mla_decode_wgmma::partial(&inputs[..6], outputs, blocks, &ints[..5], &bools[..4], rank + rope_dim, form),
        false => apply(
            kernel(&PARTIAL_KERNEL, shared_bytes(rank + rope_dim, rank, packing))?,
            &inputs,
            Launch { outputs, grid: [s * 512, b, groups as i32], block: [512, 1, 1], ints: &ints, bools: &bools },
        ),
    }
}
