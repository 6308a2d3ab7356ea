//! Attention over float storage, and over a Q8, Q4 or FP8 latent with bfloat16 rope, in the
//! decode step's shape (one query per row) and a speculative verify's (a few queries per row,
//! causal or not): against an independent float64 computation over the values the reference
//! model says each row holds (for a packed latent, its decoded values), at GLM-5.2's widths and
//! head count, with padded and ragged rows, lengths that do not fill a tile, and head-query
//! pairs past one 64-row block. On MLX's CUDA backend this is the split-K
//! kernel's test (each case checks that the kernel ran, and on a compute capability 9.0 GPU runs
//! with the one-pass decode and the clustered pass where they apply, with the wgmma partial pass
//! and with the mma.sync one; the forms in clusters run only where MLX runs without its CUDA
//! graphs, so on such a GPU run it with `MLX_USE_CUDA_GRAPHS=0` too); on an Apple GPU it is the Metal kernel's test for float storage that is not composed (`metal::mla_decode`; each such case checks
//! that it ran); elsewhere the same cases check the MLX-ops path, which the kernels fall back to.
//! (Its own test binary: it counts process-wide kernel launches, flips the process-wide wgmma
//! switch, and counts the scales compiled into the process's kernels.)
mod common;

use common::attention_ref::{attention, visible};
use common::mlx_helpers::geometry_in;
use common::model::{Model, Rng};
use latent_cache::core::attention::MaskMode;

use latent_cache::core::kernels::cuda;
use latent_cache::core::kernels::cuda::launch;
use latent_cache::core::kernels::metal;
use latent_cache::core::mlx::math;
use latent_cache::core::mlx::ops;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::{Array, Dtype};
use std::panic::{catch_unwind, AssertUnwindSafe};

/// Bounds on |got - want| / (1 + |want|). The kernel sums in float32 and rounds only the
/// probabilities to the storage's 16-bit dtype (2^-9 relative for bfloat16), so its error is at
/// most 2^-9 of the largest value (4 here): under 1e-2. (An FP8 latent's decoded values are rounded
/// to bfloat16 for the products too: errors of 2^-9 relative that average out over the
/// positions and the width.) MLX's fallback also rounds its scores to that dtype, which at these score sizes costs about 2%.
const KERNEL_TOLERANCE: f64 = 1e-2;
const FALLBACK_TOLERANCE: f64 = 3e-2;

/// A case: storage mode (the latent's; the rope's too, or bfloat16 under a quantized latent), widths, heads, queries per row, layout, each row's
/// padding in the first append, and how many positions the two appends hold.
struct Case {
    mode: StorageMode,
    rank: usize,
    rope: usize,
    heads: usize,
    queries: usize,
    layout: LayoutKind,
    pads: Vec<usize>,
    first: usize,
    more: usize,
    /// The attention's scale, as a multiple of 1 / sqrt(rank + rope).
    scale_by: f32,
    /// Composed storage's hot window (bfloat16 hot positions over the compact ones); 0: none.
    hot_window: usize,
    /// Rows leave and join in the batch's slots before the attention (see `churn`).
    churn: bool,
}

/// `v` rounded to the dtype the queries are given in (round to nearest even), as MLX's cast does.
fn narrowed(v: &[f32], dtype: Dtype) -> Vec<f32> {
    let a = ops::astype(&Array::from_slice(v, &[v.len() as i32]), dtype).unwrap();
    ops::to_host(&ops::astype(&a, Dtype::Float32).unwrap()).unwrap()
}

/// Rows leave and join in the batch's slots, so attention reads views of buffers with more
/// slots than rows and, where padding was dropped, from a moved first position: a request of
/// `first - 1` positions joins a reserved slot; row 0 and (right-justified) every other unpadded
/// row leave with the order kept, so row 0's slot moves on (the rows left drop their common
/// padding); then
/// every row appends two positions (ragged rows ending apart: one scatter over every slot).
fn churn(cache: &mut LatentCache, model: &mut Model, case: &Case, rng: &mut Rng) {
    let batch = case.pads.len();
    let mut joiner = LatentCache::new(*cache.geometry()).unwrap();
    let mut joiner_model = model.empty_like();
    let n = case.first.max(2) - 1;
    let data = [rng.uniform(n * case.rank, 1.0), rng.uniform(n * case.rope, 1.0), vec![]];
    joiner.append_host(1, n, &data[0], &data[1], None).unwrap();
    joiner_model.append(1, n, &data);
    cache.reserve_rows(batch + 1).unwrap();
    cache.merge_rows(&[&joiner]).unwrap();
    *model = Model::merge(&[model, &joiner_model]);
    let stays = |b: usize| case.pads[b] > 0 || case.layout == LayoutKind::Ragged;
    let keep: Vec<usize> = (1..batch).filter(|&b| stays(b)).chain(std::iter::once(batch)).collect();
    cache.filter_rows(&keep).unwrap();
    model.filter(&keep);
    let rows = keep.len();
    let data = [rng.uniform(rows * 2 * case.rank, 1.0), rng.uniform(rows * 2 * case.rope, 1.0), vec![]];
    cache.append_host(rows, 2, &data[0], &data[1], None).unwrap();
    model.append(rows, 2, &data);
}

/// Runs `case` and says whether the kernel computed it.
fn run(case: &Case, rng: &mut Rng) -> bool {
    let dtype = match case.mode {
        StorageMode::F16 => Dtype::Float16,
        StorageMode::F32 => Dtype::Float32,
        _ => Dtype::Bfloat16,
    };
    let packing = case.mode.packing();
    let rope_mode = if packing.is_some() { StorageMode::Bf16 } else { case.mode };
    let widths = [case.rank, case.rope, 0];
    let modes = [case.mode, rope_mode, StorageMode::F32];
    let g = Geometry { hot_window: case.hot_window, hot_storage: StorageMode::Bf16, ..geometry_in(widths, modes, case.layout) };
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = Model::with_modes(widths, modes);
    model.ragged = case.layout == LayoutKind::Ragged;
    let batch = case.pads.len();
    let mut data = [rng.uniform(batch * case.first * case.rank, 1.0), rng.uniform(batch * case.first * case.rope, 1.0), vec![]];
    // Markers a misplaced boundary cannot hide: each row's first valid position holds -4 in every
    // latent channel, its last +4 (a query that must not see it, or misses it, is far off).
    for (b, &pad) in case.pads.iter().enumerate() {
        let at = (b * case.first + pad) * case.rank;
        data[0][at..at + case.rank].fill(-4.0);
    }
    let last = |data: &mut [Vec<f32>; 3], tokens: usize| {
        for b in 0..batch {
            let at = (b * tokens + tokens - 1) * case.rank;
            data[0][at..at + case.rank].fill(4.0);
        }
    };
    if case.more == 0 {
        last(&mut data, case.first);
    }
    cache.append_host_padded(batch, case.first, &case.pads, &data[0], &data[1], None).unwrap();
    model.append_padded(batch, case.first, &case.pads, &data);
    if case.more > 0 {
        let mut data = [rng.uniform(batch * case.more * case.rank, 1.0), rng.uniform(batch * case.more * case.rope, 1.0), vec![]];
        last(&mut data, case.more);
        cache.append_host(batch, case.more, &data[0], &data[1], None).unwrap();
        model.append(batch, case.more, &data);
    }
    if case.churn {
        churn(&mut cache, &mut model, case, rng);
    }
    if case.hot_window > 0 {
        // Composed: each row reads what the cache holds, compact below its boundary and hot from
        // it on (that composition is checked against its own reference in tests/storage/composed.rs).
        for (b, row) in model.rows.iter_mut().enumerate() {
            row.families[0] = cache.read_row(Family::Latent, b).unwrap();
            row.families[1] = cache.read_row(Family::Rope, b).unwrap();
        }
    }

    let donor = cache.capture_donor_rows().unwrap();
    let (h, lq) = (case.heads, case.queries);
    // Queries large enough that the softmax is far from uniform (scores of standard deviation
    // about 1 over unit-scale values).
    let q_latent = narrowed(&rng.uniform(batch * h * lq * case.rank, 3.0), dtype);
    let q_rope = narrowed(&rng.uniform(batch * h * lq * case.rope, 3.0), dtype);
    let shape = |w: usize| [batch as i32, h as i32, lq as i32, w as i32];
    // With several queries per row, the queries are a strided view (their channels lq apart, as
    // a transposed projection gives), so the kernel's element-wise query copy is tested too.
    let arr = |v: &[f32], w: usize| {
        let a = match lq {
            1 => Array::from_slice(v, &shape(w)),
            _ => {
                let mut t = vec![0f32; v.len()];
                for (at, &x) in v.iter().enumerate() {
                    let (row, i, c) = (at / (lq * w), at / w % lq, at % w);
                    t[(row * w + c) * lq + i] = x;
                }
                let dims = [batch as i32, h as i32, w as i32, lq as i32];
                math::swapaxes(&Array::from_slice(&t, &dims), 2, 3).unwrap()
            }
        };
        ops::astype(&a, dtype).unwrap()
    };
    let scale = case.scale_by / ((case.rank + case.rope) as f32).sqrt();
    let sizes = cuda::mla_decode::Shape {
        batch,
        heads: h,
        queries: lq,
        positions: donor.offset(),
        rank: case.rank,
        rope: case.rope,
        scale,
    };
    let on_cuda = match packing {
        None => cuda::mla_decode::applies(dtype, dtype, &sizes),
        Some(packing) => cuda::mla_decode::applies_packed(packing, dtype, &sizes),
    };
    if let Some(capability) = launch::compute_capability() {
        assert_ne!(capability, (0, 0), "MLX's device info gives the GPU's compute capability");
    }
    if hopper() && case.scale_by == 1.0 && case.mode != StorageMode::F32 {
        // Every case here but float32 storage fits a Hopper-class GPU: there the kernel must be
        // the one tested.
        assert!(on_cuda, "the kernel applies to {sizes:?} on this GPU");
    }
    // On an Apple GPU: the Metal kernel, over float storage that is not composed.
    let metal = |mode: MaskMode| {
        packing.is_none()
            && case.hot_window == 0
            && metal::mla_decode::applies(dtype, dtype, &sizes, mode == MaskMode::Causal, false)
    };
    if metal::on_metal() && packing.is_none() && case.hot_window == 0 && case.rank % 32 == 0 && case.rope % 32 == 0 {
        // There the Metal kernel must be the one tested: a failed check at its first use turns it
        // off (see stderr), which must fail here rather than pass through MLX's ops.
        assert!(metal(MaskMode::None) && metal(MaskMode::Causal), "the Metal kernel applies to {sizes:?}");
    }
    // On a compute capability 9.0 GPU the partial pass is the wgmma one where its widths fit (16-bit
    // float storage only: with a packed latent, composed storage's hot pass).
    let wgmma = on_cuda
        && (packing.is_none() || case.hot_window > 0)
        && cuda::mla_decode_wgmma::KERNEL.enabled()
        && launch::compute_capability() == Some((9, 0))
        && case.rank % 128 == 0
        && case.rope % 32 == 0;
    // Few positions over 16-bit float storage that is not composed: the one-pass decode there
    // (where MLX runs without its CUDA graphs).
    let one_pass =
        wgmma && case.hot_window == 0 && cuda::mla_decode_wgmma::one_pass_applies(case.rank, case.rope, sizes.positions);
    for mode in [MaskMode::None, MaskMode::Causal] {
        let kernel = on_cuda || metal(mode);
        let tolerance = if kernel { KERNEL_TOLERANCE } else { FALLBACK_TOLERANCE };
        let (before, before_metal) = (cuda::mla_decode::KERNEL.launches(), metal::mla_decode::KERNEL.launches());
        let before_wgmma = cuda::mla_decode_wgmma::KERNEL.launches();
        let before_one_pass = cuda::mla_decode_wgmma::ONE_PASS.launches();
        let out = donor.attend(&arr(&q_latent, case.rank), &arr(&q_rope, case.rope), scale, mode, None).unwrap();
        let got = ops::to_host(&out).unwrap();
        let what = format!(
            "{:?} {}+{} {h} heads x {lq} queries {:?} pads {:?} hot window {} (converted {:?}) {mode:?}",
            case.mode,
            case.rank,
            case.rope,
            case.layout,
            case.pads,
            case.hot_window,
            cache.converted_positions()
        );
        // Each backend counts its own kernel's launches: the one that applies ran, the other did not.
        assert_eq!(
            cuda::mla_decode::KERNEL.launches() - before,
            on_cuda as usize,
            "{what}: where the CUDA kernel applies it runs"
        );
        let metal_ran = metal::mla_decode::KERNEL.launches() - before_metal;
        assert_eq!(metal_ran, metal(mode) as usize, "{what}: where the Metal kernel applies it runs");
        assert_eq!(
            cuda::mla_decode_wgmma::KERNEL.launches() - before_wgmma,
            wgmma as usize,
            "{what}: the wgmma pass where it applies"
        );
        if case.hot_window == 0 {
            let ran = cuda::mla_decode_wgmma::ONE_PASS.launches() - before_one_pass;
            assert_eq!(ran, one_pass as usize, "{what}: the one-pass decode where it applies");
        }
        assert_eq!(out.shape(), &shape(case.rank));
        for b in 0..batch {
            let row = &model.rows[b];
            let len = model.len(b);
            for head in 0..h {
                for i in 0..lq {
                    // Causal: query i of lq is the row's position len - lq + i.
                    let positions = visible(len, lq, i, mode == MaskMode::Causal);
                    let at = (b * h + head) * lq + i;
                    let ql = &q_latent[at * case.rank..(at + 1) * case.rank];
                    let qr = &q_rope[at * case.rope..(at + 1) * case.rope];
                    let want = attention(&row.families[0], &row.families[1], ql, qr, scale as f64, &positions, |_| 0.0);
                    for (c, &want) in want.iter().enumerate() {
                        let got = got[at * case.rank + c] as f64;
                        assert!(
                            (got - want).abs() <= tolerance * (1.0 + want.abs()),
                            "{what}: row {b} head {head} query {i} channel {c}: {got} vs {want}"
                        );
                    }
                }
            }
        }
    }
    on_cuda
}

#[test]
fn decode_and_verify_queries_match_a_float64_reference() {
    use LayoutKind::*;
    use StorageMode::*;
    let mut rng = Rng::new(91);
    let case = |mode, rank, rope, (heads, queries), layout, pads: &[usize], first, more| Case {
        mode,
        rank,
        rope,
        heads,
        queries,
        layout,
        pads: pads.to_vec(),
        first,
        more,
        scale_by: 1.0,
        hot_window: 0,
        churn: false,
    };
    let composed = |hot_window, c: Case| Case { hot_window, ..c };
    let churned = |c: Case| Case { churn: true, ..c };
    let cases = [
        // GLM-5.2's layer: a length past many tiles that does not fill the last one.
        case(Bf16, 512, 64, (64, 1), RightJustified, &[0], 2900, 3),
        // Long enough for the wgmma pass's splits to form clusters (four of eight splits, and
        // two with padded rows, verify queries or ragged rows).
        case(Bf16, 512, 64, (64, 1), RightJustified, &[0], 9000, 3),
        case(Bf16, 512, 64, (64, 3), RightJustified, &[0, 300], 6000, 3),
        case(F16, 512, 64, (64, 1), Ragged, &[5, 0], 4500, 2),
        case(F16, 512, 64, (64, 1), RightJustified, &[0], 700, 1),
        // Float32 storage (the Metal kernel's; MLX's ops on CUDA).
        case(F32, 512, 64, (64, 1), RightJustified, &[0, 37], 700, 2),
        case(F32, 128, 64, (40, 2), Ragged, &[2, 0], 90, 2),
        // Padded rows of different lengths, in both layouts.
        case(Bf16, 512, 64, (64, 1), RightJustified, &[0, 37, 200], 1100, 2),
        case(Bf16, 512, 64, (64, 1), Ragged, &[5, 0], 300, 9),
        // Heads past one block (the second one partly filled), narrower widths.
        case(Bf16, 128, 64, (96, 1), RightJustified, &[3, 0], 130, 1),
        case(F16, 64, 16, (8, 1), Ragged, &[0, 2], 40, 1),
        // A few positions only.
        case(Bf16, 512, 64, (64, 1), RightJustified, &[0, 3], 5, 0),
        // Speculative verifies: a few queries per row, padded, rows past one block.
        case(Bf16, 512, 64, (64, 3), RightJustified, &[0, 21], 600, 3),
        case(F16, 128, 64, (40, 2), Ragged, &[2, 0, 9], 90, 2),
        case(Bf16, 64, 16, (4, 4), RightJustified, &[0], 4, 0),
        // Whole rows (no range array) at batch 3, with verify queries.
        case(Bf16, 512, 64, (64, 2), RightJustified, &[0, 0, 0], 333, 0),
        // A packed latent (bfloat16 rope): GLM-5.2's layer, padded and ragged rows, heads past
        // one block at the narrowest width it takes, verify queries, whole rows.
        case(Q8, 512, 64, (64, 1), RightJustified, &[0], 2900, 3),
        case(Q4, 512, 64, (64, 1), Ragged, &[5, 0], 300, 9),
        case(Q8, 128, 64, (96, 1), RightJustified, &[3, 0], 130, 1),
        case(Q8, 512, 64, (64, 3), RightJustified, &[0, 21], 600, 3),
        case(Q4, 512, 64, (64, 2), RightJustified, &[0, 0, 0], 333, 0),
        case(Fp8, 512, 64, (64, 1), RightJustified, &[0], 2900, 3),
        case(Fp8, 512, 64, (64, 1), Ragged, &[5, 0], 300, 9),
        case(Fp8, 128, 64, (96, 1), RightJustified, &[3, 0], 130, 1),
        case(Fp8, 512, 64, (64, 3), RightJustified, &[0, 21], 600, 3),
        // Composed (a packed latent below each row's boundary, bfloat16 above): one pass over
        // each side, combined. Rows whose hot rows start apart (padded), ragged rows, verify
        // queries, and rows read hot alone.
        composed(256, case(Q8, 512, 64, (64, 1), RightJustified, &[0], 2900, 3)),
        composed(64, case(Fp8, 512, 64, (64, 1), Ragged, &[5, 0], 300, 9)),
        composed(128, case(Q4, 512, 64, (64, 3), RightJustified, &[3, 0, 40], 600, 3)),
        composed(200, case(Q8, 128, 64, (96, 1), RightJustified, &[0, 30], 100, 1)),
        // Rows that left and joined in the batch's slots (see `churn`): rows from a later slot
        // and a moved first position, verify queries, a packed latent, ragged rows ending apart.
        churned(case(Bf16, 512, 64, (64, 1), RightJustified, &[0, 37, 200], 1100, 2)),
        churned(case(Bf16, 512, 64, (64, 3), RightJustified, &[0, 21], 600, 3)),
        churned(case(Q8, 512, 64, (64, 1), RightJustified, &[0, 21], 600, 3)),
        churned(case(Bf16, 512, 64, (64, 1), Ragged, &[0, 0], 300, 9)),
        churned(composed(64, case(Fp8, 512, 64, (64, 1), RightJustified, &[0, 9], 300, 9))),
    ];
    // On a compute capability 9.0 GPU, every case with the same values three times: with the
    // one-pass decode and the wgmma partial pass in clusters (where they apply and MLX runs
    // without its CUDA graphs), with the wgmma
    // pass split by split and the combine, then with the mma.sync pass and the combine. (This
    // file's only test: the process-wide switches are not shared with another test.)
    let passes: &[(bool, bool)] = if launch::compute_capability() == Some((9, 0)) {
        &[(true, true), (true, false), (false, false)]
    } else {
        &[(true, true)]
    };
    let started = std::time::Instant::now();
    // Every case runs in every pass, and the test fails at the end naming each case that failed
    // (its message is on stderr): one run on a GPU shows every failure, not the first alone.
    let mut failed = Vec::new();
    for &(wgmma, one_pass) in passes {
        cuda::mla_decode_wgmma::KERNEL.set_enabled(wgmma);
        cuda::mla_decode_wgmma::ONE_PASS.set_enabled(one_pass);
        cuda::mla_decode_wgmma::CLUSTERED.set_enabled(one_pass);
        let clustered = cuda::mla_decode_wgmma::CLUSTERED.launches();
        rng = Rng::new(91);
        for (i, c) in cases.iter().enumerate() {
            if catch_unwind(AssertUnwindSafe(|| run(c, &mut rng))).is_err() {
                failed.push(format!("wgmma {wgmma} one pass {one_pass}: case {i}"));
            }
            // Progress, for a run on a GPU whose kernels compile as they are first used.
            eprintln!("wgmma {wgmma} one pass {one_pass}: case {i} done at {:.1} s", started.elapsed().as_secs_f64());
        }
        // The long cases ran in clusters where the clustered form was on (each case checked).
        let hopper_clusters =
            launch::compute_capability() == Some((9, 0)) && wgmma && one_pass && cuda::mla_decode_wgmma::clusters_allowed();
        assert_eq!(cuda::mla_decode_wgmma::CLUSTERED.launches() > clustered, hopper_clusters, "the clustered form ran");
    }
    assert!(failed.is_empty(), "failed: {failed:?}");
    cuda::mla_decode_wgmma::KERNEL.set_enabled(true);
    cuda::mla_decode_wgmma::ONE_PASS.set_enabled(true);
    cuda::mla_decode_wgmma::CLUSTERED.set_enabled(false);
    // The scale is compiled into the kernel, for a few scales per process: attentions with
    // further scales run MLX's ops, as exactly as the fallback does.
    let mut scales: Vec<usize> = cases.iter().map(|c| c.rank + c.rope).collect();
    scales.sort();
    scales.dedup();
    let mut ran = 0;
    for k in 1..=10 {
        let c = Case { scale_by: 1.0 + k as f32 / 16.0, ..case(Bf16, 64, 16, (8, 1), RightJustified, &[0, 1], 50, 1) };
        ran += run(&c, &mut rng) as usize;
    }
    assert_eq!(ran, if hopper() { cuda::mla_decode::scale_limit() - scales.len() } else { 0 }, "kernels past the set of scales");
}

/// Whether this is a Hopper-class GPU, where every case here fits the kernel's tiles.
fn hopper() -> bool {
    launch::cuda_device() && launch::shared_memory_limit() >= 227 * 1024
}
