//! Donor rows and the absorbed MLA attention over them, against an independent float64
//! computation on the values the reference model says each row holds: every storage mode, both
//! row layouts, padded rows, the three mask modes; and a donor stays valid after its cache
//! moves on. (The affine-quantized families are read by MLX's quantized matmul, which computes
//! in float32 from their bfloat16 scales and codes: those modes are held to bfloat16 precision.)
use crate::common::attention_ref::{attention, visible};
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::{Model, Rng};
use latent_cache::core::attention::MaskMode;

use latent_cache::core::mlx::ops;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::Array;

const WIDTHS: [usize; 3] = [128, 64, 0];

fn normal(rng: &mut Rng, n: usize) -> Vec<f32> {
    (0..n).map(|_| ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0).collect()
}

/// A cache and its model with rows of different lengths (a padded first append, then appends).
fn filled(rng: &mut Rng, modes: [StorageMode; 3], layout: LayoutKind, pads: &[usize]) -> (LatentCache, Model) {
    let mut cache = LatentCache::new(geometry_in(WIDTHS, modes, layout)).unwrap();
    let mut model = Model::with_modes(WIDTHS, modes);
    model.ragged = layout == LayoutKind::Ragged;
    let (batch, tokens) = (pads.len(), 9);
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| normal(rng, batch * tokens * WIDTHS[f]));
    cache.append_host_padded(batch, tokens, pads, &data[0], &data[1], None).unwrap();
    model.append_padded(batch, tokens, pads, &data);
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| normal(rng, batch * 3 * WIDTHS[f]));
    cache.append_host(batch, 3, &data[0], &data[1], None).unwrap();
    model.append(batch, 3, &data);
    (cache, model)
}

/// The attention of query `i` of `lq` (heads `h`) for row `b`, float64, over the row's values.
#[allow(clippy::too_many_arguments)]
fn reference(
    model: &Model,
    b: usize,
    q_latent: &[f32],
    q_rope: &[f32],
    scale: f64,
    causal: bool,
    lq: usize,
    i: usize,
    extra: impl Fn(usize) -> f64,
) -> Vec<f64> {
    let row = &model.rows[b];
    attention(&row.families[0], &row.families[1], q_latent, q_rope, scale, &visible(model.len(b), lq, i, causal), extra)
}

fn check(cache: &LatentCache, model: &Model, rng: &mut Rng, mode: MaskMode, what: &str, tolerance: f64) {
    check_in(cache, model, rng, mode, what, tolerance, mlx_rs::Dtype::Float32)
}

/// `check` with the queries given in `dtype` (the reference keeps their float32 values).
fn check_in(cache: &LatentCache, model: &Model, rng: &mut Rng, mode: MaskMode, what: &str, tolerance: f64, dtype: mlx_rs::Dtype) {
    let (batch, lq, t) = (model.rows.len(), 2, cache.offset());
    let extra_mask = normal(rng, batch * lq * t);
    check_queries(cache, model, rng, (mode, lq, &extra_mask), what, tolerance, dtype)
}

/// Attention of `lq` queries per row in `mode`, against the reference; `extra_mask` is the
/// additive mask array of the `Array` mode, `[B, 1, lq, T]` by window position.
fn check_queries(
    cache: &LatentCache,
    model: &Model,
    rng: &mut Rng,
    (mode, lq, extra_mask): (MaskMode, usize, &[f32]),
    what: &str,
    tolerance: f64,
    dtype: mlx_rs::Dtype,
) {
    let donor = cache.capture_donor_rows().unwrap();
    let (batch, heads, t) = (model.rows.len(), 2, donor.offset());
    let q_latent = normal(rng, batch * heads * lq * WIDTHS[0]);
    let q_rope = normal(rng, batch * heads * lq * WIDTHS[1]);
    let arr = |v: &[f32], shape: &[i32]| ops::astype(&Array::from_slice(v, shape), dtype).unwrap();
    let (b_, h_, q_) = (batch as i32, heads as i32, lq as i32);
    let mask_array = match mode {
        MaskMode::Array => Array::from_slice(extra_mask, &[b_, 1, q_, t as i32]),
        _ => Array::from_slice(&[0f32], &[1]),
    };
    let scale = 0.09;
    let out = donor
        .attend(
            &arr(&q_latent, &[b_, h_, q_, WIDTHS[0] as i32]),
            &arr(&q_rope, &[b_, h_, q_, WIDTHS[1] as i32]),
            scale,
            mode,
            (mode == MaskMode::Array).then_some(&mask_array),
        )
        .unwrap();
    assert_eq!(out.shape(), &[b_, h_, q_, WIDTHS[0] as i32]);
    let got = ops::to_host(&out).unwrap();
    let pads = model.left_pad();
    for b in 0..batch {
        for h in 0..heads {
            for i in 0..lq {
                let at = (b * heads + h) * lq + i;
                let ql = &q_latent[at * WIDTHS[0]..(at + 1) * WIDTHS[0]];
                let qr = &q_rope[at * WIDTHS[1]..(at + 1) * WIDTHS[1]];
                // The additive mask is indexed by window position: row position j sits at pads[b] + j.
                let extra = |j: usize| match mode {
                    MaskMode::Array => extra_mask[(b * lq + i) * t + pads[b] + j] as f64,
                    _ => 0.0,
                };
                let want = reference(model, b, ql, qr, scale as f64, mode == MaskMode::Causal, lq, i, extra);
                let got = &got[at * WIDTHS[0]..(at + 1) * WIDTHS[0]];
                for (c, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert!(
                        (*g as f64 - w).abs() <= tolerance * (1.0 + w.abs()),
                        "{what}: row {b} head {h} query {i} channel {c}: {g} vs {w}"
                    );
                }
            }
        }
    }
}

#[test]
fn attention_over_donor_rows_matches_a_float64_reference() {
    use StorageMode::*;
    let mut rng = Rng::new(77);
    // MLX's CUDA backend runs float32 matmuls at TF32 precision (10-bit mantissas): on a GPU
    // every mode is held to that.
    let gpu = matches!(mlx_rs::Device::default().get_type().unwrap(), mlx_rs::DeviceType::Gpu);
    for (modes, tolerance) in [
        ([F32, F32, F32], 1e-5),
        ([Bf16, Bf16, F32], 1e-5),
        ([F16, F16, F32], 1e-5),
        ([Q8, Bf16, F32], 1e-2),
        ([Q4, Bf16, F32], 1e-2),
        ([Fp8, Bf16, F32], 1e-5),
    ] {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            let (cache, model) = filled(&mut rng, modes, layout, &[0, 4, 2]);
            for mode in [MaskMode::None, MaskMode::Causal, MaskMode::Array] {
                let tolerance = if gpu { f64::max(tolerance, 1e-2) } else { tolerance };
                check(&cache, &model, &mut rng, mode, &format!("{modes:?} {layout:?} {mode:?}"), tolerance);
            }
        }
    }
}

#[test]
fn causal_prefill_over_left_padded_rows_gives_zeros_for_the_padding_queries() {
    use StorageMode::*;
    let mut rng = Rng::new(31);
    // Prompts of 9, 5, 2 and 7 positions prefilled in one padded append, then attended with one
    // query per window position, as an engine's batched prefill does: each row's first
    // queries are its padding and see nothing.
    let (pads, tokens) = ([0usize, 4, 7, 2], 9);
    let batch = pads.len();
    for (modes, tolerance) in [([F32, F32, F32], 1e-5), ([Bf16, Bf16, F32], 1e-5)] {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            let mut cache = LatentCache::new(geometry_in(WIDTHS, modes, layout)).unwrap();
            let mut model = Model::with_modes(WIDTHS, modes);
            model.ragged = layout == LayoutKind::Ragged;
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| normal(&mut rng, batch * tokens * WIDTHS[f]));
            cache.append_host_padded(batch, tokens, &pads, &data[0], &data[1], None).unwrap();
            model.append_padded(batch, tokens, &pads, &data);
            let what = format!("{modes:?} {layout:?}");
            let gpu = matches!(mlx_rs::Device::default().get_type().unwrap(), mlx_rs::DeviceType::Gpu);
            let tolerance = if gpu { f64::max(tolerance, 1e-2) } else { tolerance };
            check_queries(
                &cache,
                &model,
                &mut rng,
                (MaskMode::Causal, tokens, &[]),
                &format!("{what} causal"),
                tolerance,
                mlx_rs::Dtype::Float32,
            );
            // The same band as the engine's own mask array (0 where a query sees a position,
            // -inf elsewhere): the padding queries' rows are all -inf, and give zeros too.
            let band: Vec<f32> = (0..batch * tokens * tokens)
                .map(|n| {
                    let (b, i, t) = (n / (tokens * tokens), n / tokens % tokens, n % tokens);
                    if t >= pads[b] && t <= i {
                        0.0
                    } else {
                        f32::NEG_INFINITY
                    }
                })
                .collect();
            check_queries(
                &cache,
                &model,
                &mut rng,
                (MaskMode::Array, tokens, &band),
                &format!("{what} band as an array"),
                tolerance,
                mlx_rs::Dtype::Float32,
            );
        }
    }
}

#[test]
fn a_donor_outlives_its_cache_and_refuses_bad_queries() {
    let mut rng = Rng::new(78);
    let (mut cache, model) = filled(&mut rng, [StorageMode::F32; 3], LayoutKind::Ragged, &[0, 5]);
    let donor = cache.capture_donor_rows().unwrap();
    let keep = donor.row_ends().to_vec();
    // The cache moves on (appends, trims) and is dropped: the donor still shows the old rows.
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| normal(&mut rng, 2 * 4 * WIDTHS[f]));
    cache.append_host(2, 4, &data[0], &data[1], None).unwrap();
    cache.trim(6, false).unwrap();
    drop(cache);
    assert_eq!(donor.row_ends(), keep.as_slice());
    let q = |w: usize| Array::from_slice(&normal(&mut Rng::new(1), 2 * w), &[2, 1, 1, w as i32]);
    let out = donor.attend(&q(WIDTHS[0]), &q(WIDTHS[1]), 0.1, MaskMode::None, None).unwrap();
    let got = ops::to_host(&out).unwrap();
    let (ql, qr) = (ops::to_host(&q(WIDTHS[0])).unwrap(), ops::to_host(&q(WIDTHS[1])).unwrap());
    for b in 0..2 {
        let want = reference(&model, b, &ql[b * 128..][..128], &qr[b * 64..][..64], 0.1, false, 1, 0, |_| 0.0);
        for (g, w) in got[b * 128..][..128].iter().zip(&want) {
            assert!((*g as f64 - w).abs() <= 1e-5 * (1.0 + w.abs()));
        }
    }
    // Refusals: wrong widths, a batch mismatch, masks with the wrong mode.
    let bad = Array::from_slice(&[0f32; 2 * 100], &[2, 1, 1, 100]);
    assert_eq!(donor.attend(&bad, &q(64), 0.1, MaskMode::None, None).unwrap_err().kind, latent_cache::ErrorKind::Shape);
    assert_eq!(
        donor.attend(&q(128), &q(64), 0.1, MaskMode::Array, None).unwrap_err().kind,
        latent_cache::ErrorKind::InvalidArgument
    );
    // More causal queries than a row holds is a prefill over padding, not an error: the
    // queries before the row give zeros (checked against the reference in
    // `causal_prefill_over_left_padded_rows_gives_zeros_for_the_padding_queries`), never NaN.
    let many = |w: usize| Array::from_slice(&vec![0.5f32; 2 * 20 * w], &[2, 1, 20, w as i32]);
    let out = ops::to_host(&donor.attend(&many(128), &many(64), 0.1, MaskMode::Causal, None).unwrap()).unwrap();
    assert!(out.iter().all(|v| v.is_finite()));
    assert!(out[..128].iter().all(|&v| v == 0.0), "the first query precedes every row");
}

/// GLM-5.2's 64 heads at batch 8 over 16K positions: the head-broadcast form of this product
/// (`[8, 64, 1, 512] x [8, 1, 512, 16384]`) crashes MLX 0.32's CPU matmul; attention folds the
/// heads into query rows instead. Constant rows make the exact answer the stored latent value.
#[test]
fn sixty_four_heads_at_batch_8_over_16k_positions() {
    let g = Geometry { kv_lora_rank: 512, rope_head_dim: 64, ..Geometry::default() };
    let mut cache = LatentCache::new(g).unwrap();
    let (batch, chunk) = (8usize, 4096usize);
    for _ in 0..4 {
        cache.append_host(batch, chunk, &vec![0.25f32; batch * chunk * 512], &vec![0.5f32; batch * chunk * 64], None).unwrap();
    }
    let donor = cache.capture_donor_rows().unwrap();
    let q = |width: usize| Array::from_slice(&vec![0.125f32; batch * 64 * width], &[batch as i32, 64, 1, width as i32]);
    let out = donor.attend(&q(512), &q(64), 0.0625, MaskMode::None, None).unwrap();
    assert_eq!(out.shape(), &[8, 64, 1, 512]);
    let got = ops::to_host(&out).unwrap();
    assert!(got.iter().all(|&v| (v - 0.25).abs() < 1e-6), "every output channel is the stored value");
}

/// Queries in the storage's own narrow dtype (as an engine computing in bfloat16 passes them):
/// the products run in that dtype over the stored values as they are; held to its precision.
#[test]
fn narrow_queries_over_narrow_storage_compute_in_that_dtype() {
    use StorageMode::*;
    let mut rng = Rng::new(78);
    for (modes, dtype) in [([Bf16, Bf16, F32], mlx_rs::Dtype::Bfloat16), ([F16, F16, F32], mlx_rs::Dtype::Float16)] {
        let (cache, model) = filled(&mut rng, modes, LayoutKind::RightJustified, &[0, 4, 2]);
        check_in(&cache, &model, &mut rng, MaskMode::None, &format!("{modes:?} {dtype:?} queries"), 3e-2, dtype);
    }
}

/// One row (a single request's decode), where attention runs as one fused product with the rope
/// scores as its mask: every mask mode, float32 and bfloat16.
#[test]
fn a_single_row_matches_the_reference_in_every_mask_mode() {
    use StorageMode::*;
    let mut rng = Rng::new(79);
    let gpu = matches!(mlx_rs::Device::default().get_type().unwrap(), mlx_rs::DeviceType::Gpu);
    for (modes, dtype, tolerance) in
        [([F32, F32, F32], mlx_rs::Dtype::Float32, 1e-5), ([Bf16, Bf16, F32], mlx_rs::Dtype::Bfloat16, 3e-2)]
    {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            let (cache, model) = filled(&mut rng, modes, layout, &[0]);
            for mode in [MaskMode::None, MaskMode::Causal, MaskMode::Array] {
                let tolerance = if gpu { f64::max(tolerance, 1e-2) } else { tolerance };
                check_in(&cache, &model, &mut rng, mode, &format!("{modes:?} {layout:?} {mode:?} one row"), tolerance, dtype);
            }
        }
    }
}

/// A composed cache (Q4 latent and bfloat16 rope below the boundary, float32 hot positions):
/// attention over its donor matches the float64 reference over the values each row reads, and
/// reads hot positions from their exact values: with every position holding one vector whose
/// 4-bit code is off by a known amount, attention masked to the hot positions returns the exact
/// vector, masked to the compact ones the 4-bit one.
#[test]
fn attention_over_composed_rows_reads_hot_positions_exactly() {
    use StorageMode::*;
    let g = Geometry { hot_window: 10, ..geometry_in(WIDTHS, [Q4, Bf16, F32], LayoutKind::RightJustified) };
    let gpu = matches!(mlx_rs::Device::default().get_type().unwrap(), mlx_rs::DeviceType::Gpu);
    let mut rng = Rng::new(79);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let mut cache = LatentCache::new(Geometry { layout, ..g }).unwrap();
        let (batch, tokens, pads) = (2, 200, [0usize, 50]);
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| normal(&mut rng, batch * tokens * WIDTHS[f]));
        cache.append_host_padded(batch, tokens, &pads, &data[0], &data[1], None).unwrap();
        assert_eq!(cache.converted_positions(), vec![128, 128]);
        // The reference model holds what each row reads (composition checked in tests/storage/composed.rs).
        let mut model = Model::new(WIDTHS);
        model.ragged = layout == LayoutKind::Ragged;
        model.rows = (0..batch)
            .map(|b| crate::common::model::Row {
                families: [cache.read_row(Family::Latent, b).unwrap(), cache.read_row(Family::Rope, b).unwrap(), Vec::new()],
            })
            .collect();
        model.pads = pads.to_vec();
        for mode in [MaskMode::None, MaskMode::Causal, MaskMode::Array] {
            let tolerance = if gpu { 2e-2 } else { 1e-2 };
            check(&cache, &model, &mut rng, mode, &format!("composed {layout:?} {mode:?}"), tolerance);
        }
    }

    // One vector at every position: channels 0 and 1 of each group set the 4-bit scale (0 and
    // 1), the others 0.5, which 4 bits read as 7/15 or 8/15.
    let v: Vec<f32> = (0..WIDTHS[0]).map(|c| [0.0f32, 1.0, 0.5][(c % 64).min(2)]).collect();
    let mut cache = LatentCache::new(g).unwrap();
    let tokens = 200;
    let latent: Vec<f32> = (0..tokens).flat_map(|_| v.clone()).collect();
    cache.append_host(1, tokens, &latent, &vec![0.0; tokens * WIDTHS[1]], None).unwrap();
    let compact = cache.read_row(Family::Latent, 0).unwrap()[..WIDTHS[0]].to_vec();
    assert!(compact.iter().zip(&v).any(|(a, b)| (a - b).abs() > 0.03), "4 bits must misread 0.5");
    let donor = cache.capture_donor_rows().unwrap();
    let boundary = cache.converted_positions()[0];
    let q = |w: usize| Array::from_slice(&vec![0.1f32; w], &[1, 1, 1, w as i32]);
    for (hot, want) in [(true, &v), (false, &compact)] {
        let mask: Vec<f32> = (0..tokens).map(|p| if (p >= boundary) == hot { 0.0 } else { f32::NEG_INFINITY }).collect();
        let mask = Array::from_slice(&mask, &[1, 1, 1, tokens as i32]);
        let out = donor.attend(&q(WIDTHS[0]), &q(WIDTHS[1]), 0.1, MaskMode::Array, Some(&mask)).unwrap();
        let got = ops::to_host(&out).unwrap();
        for (c, (g, w)) in got.iter().zip(want.iter()).enumerate() {
            assert!((g - w).abs() <= 8e-3, "hot {hot} channel {c}: {g} vs {w}");
        }
    }
}
