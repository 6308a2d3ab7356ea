//! DSA's attention over selected positions against dense attention over the same positions:
//! `attend_selected` over `k` of a row's `T` positions must equal `attend` with an additive
//! mask array that hides the other `T - k`, for every storage mode and for composed storage,
//! and both must match the float64 reference over the values the cache stores.
//!
//! "The values the cache stores" are computed here without the library's decode: float modes
//! and FP8 by `codec_ref` from the appended float32 values; the affine modes (Q8, Q4) as
//! `code * scale + bias` in float64 from the cache's stored codes, scales and biases (the codes
//! unpacked by MLX's `dequantize` with scale 1 and bias 0, which is exact); composed storage's
//! hot positions (from each row's boundary on) in the hot mode, by `codec_ref`.
//!
//! The queries are float32, so that every path computes in float32 on every device (the
//! library's CUDA kernels take 16-bit queries only; MLX's fused attention is taken for one row
//! only, these caches hold two).
use crate::common::attention_ref::attention;
use crate::common::codec_ref;
use crate::common::mlx_helpers::{geometry_in, host};
use crate::common::model::Rng;
use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::{math, ops};
use latent_cache::{Family, Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::{Array, Dtype};

const WIDTHS: [usize; 3] = [128, 64, 0];
const BATCH: usize = 2;
const TOKENS: usize = 300;
const HEADS: usize = 2;
const QUERIES: usize = 2;

/// The values `cache` stores for `family` (`x`: what was appended, `[BATCH, TOKENS, width]`),
/// row-major `[BATCH, TOKENS, width]`, as described in the module doc.
fn stored_values(cache: &LatentCache, g: &Geometry, family: Family, x: &[f32]) -> Vec<f32> {
    let width = g.width(family).unwrap();
    let mode = g.storage(family);
    let mut values = match mode {
        StorageMode::Q8 | StorageMode::Q4 => {
            let parts = cache.stored_parts(family).unwrap();
            let bits = if mode == StorageMode::Q8 { 8 } else { 4 };
            let groups = parts[1].shape().iter().map(|&d| d as usize).collect::<Vec<_>>();
            let ones = math::add(&ops::zeros(&groups, Dtype::Float32).unwrap(), &ops::scalar(1.0)).unwrap();
            let zeros = ops::zeros(&groups, Dtype::Float32).unwrap();
            let codes = host(&ops::dequantize(&parts[0], &ones, &zeros, 64, bits).unwrap());
            let (scales, biases) = (host(&parts[1]), host(&parts[2]));
            assert_eq!(codes.len(), x.len());
            assert!(codes.iter().all(|&c| c == c.round() && (0.0..(1 << bits) as f32).contains(&c)), "codes are integers");
            codes
                .iter()
                .enumerate()
                .map(|(i, &c)| {
                    let group = i / 64;
                    (c as f64 * scales[group] as f64 + biases[group] as f64) as f32
                })
                .collect()
        }
        _ => codec_ref::stored(mode, width, x),
    };
    if g.is_composed(family) {
        let hot = codec_ref::stored(g.hot_storage, width, x);
        for (b, &boundary) in cache.converted_positions().iter().enumerate() {
            let from = (b * TOKENS + boundary) * width;
            let to = (b + 1) * TOKENS * width;
            values[from..to].copy_from_slice(&hot[from..to]);
        }
    }
    values
}

/// For each of the caches below and `k` in {T - 1, 37}: random `k` positions per query, the
/// selected attention, the dense attention with the others masked by an array, and the float64
/// reference over the stored values of those positions.
///
/// Tolerances, on `|got - want| <= tol * (1 + |want|)`: on the CPU 1e-5 between the two paths
/// and against float64, as both compute in float32 over the same float32 values (rounding of
/// sums of a few hundred terms; the bfloat16 rounding of a decode would be 2^-9 of a value,
/// which moved outputs by 1e-4 to 3e-3). On a GPU MLX's CUDA backend runs float32 matmuls in
/// TF32 (10-bit mantissas): 1e-2 against float64, as the other attention tests; between the
/// paths 1e-3 (TF32 rounds each product's inputs alike in both; sums in another order).
#[test]
fn selected_attention_equals_dense_attention_masked_to_the_same_positions() {
    use StorageMode::*;
    let gpu = matches!(mlx_rs::Device::default().get_type().unwrap(), mlx_rs::DeviceType::Gpu);
    let (agree, exact) = if gpu { (1e-3, 1e-2) } else { (1e-5, 1e-5) };
    let plain = |latent: StorageMode, rope: StorageMode| geometry_in(WIDTHS, [latent, rope, F32], LayoutKind::RightJustified);
    let composed = |latent, rope, hot| Geometry { hot_window: 100, hot_storage: hot, ..plain(latent, rope) };
    let geometries = [
        plain(F32, F32),
        plain(Bf16, Bf16),
        plain(F16, F16),
        plain(Q8, Bf16),
        plain(Q4, Bf16),
        plain(Fp8, Bf16),
        plain(Q8, F32),
        composed(Q4, Bf16, F32),
        composed(Q8, Bf16, Bf16),
        composed(Fp8, Bf16, F32),
    ];
    let mut rng = Rng::new(2101);
    for g in geometries {
        let what = g.describe();
        let mut cache = LatentCache::new(g).unwrap();
        let x: [Vec<f32>; 2] = std::array::from_fn(|f| rng.uniform(BATCH * TOKENS * WIDTHS[f], 1.0));
        cache.append_host(BATCH, TOKENS, &x[0], &x[1], None).unwrap();
        if g.hot_window > 0 {
            assert_eq!(cache.converted_positions(), vec![192; BATCH], "{what}: the boundary of 300 positions");
        }
        let latent = stored_values(&cache, &g, Family::Latent, &x[0]);
        let rope = stored_values(&cache, &g, Family::Rope, &x[1]);
        let donor = cache.capture_donor_rows().unwrap();
        for k in [TOKENS - 1, 37] {
            // Each query's k positions: the first k of a random order of the window.
            let selected: Vec<Vec<usize>> = (0..BATCH * QUERIES)
                .map(|_| {
                    let mut order: Vec<usize> = (0..TOKENS).collect();
                    for i in (1..TOKENS).rev() {
                        order.swap(i, rng.next() as usize % (i + 1));
                    }
                    order.truncate(k);
                    order
                })
                .collect();
            let indices: Vec<i32> = selected.iter().flatten().map(|&p| p as i32).collect();
            let indices = Array::from_slice(&indices, &[BATCH as i32, QUERIES as i32, k as i32]);
            let mut mask = vec![f32::NEG_INFINITY; BATCH * QUERIES * TOKENS];
            for (bq, positions) in selected.iter().enumerate() {
                positions.iter().for_each(|&p| mask[bq * TOKENS + p] = 0.0);
            }
            let mask = Array::from_slice(&mask, &[BATCH as i32, 1, QUERIES as i32, TOKENS as i32]);
            let q_latent = rng.uniform(BATCH * HEADS * QUERIES * WIDTHS[0], 1.0);
            let q_rope = rng.uniform(BATCH * HEADS * QUERIES * WIDTHS[1], 1.0);
            let shape = |w: usize| [BATCH as i32, HEADS as i32, QUERIES as i32, w as i32];
            let (ql, qr) = (Array::from_slice(&q_latent, &shape(WIDTHS[0])), Array::from_slice(&q_rope, &shape(WIDTHS[1])));
            let scale = 0.25;
            let sparse = host(&donor.attend_selected(&ql, &qr, scale, MaskMode::None, &indices).unwrap());
            let dense = host(&donor.attend(&ql, &qr, scale, MaskMode::Array, Some(&mask)).unwrap());
            let (mut worst_paths, mut worst_ref) = (0f64, 0f64);
            for b in 0..BATCH {
                let rows = |v: &[f32], w: usize| v[b * TOKENS * w..(b + 1) * TOKENS * w].to_vec();
                let (row_latent, row_rope) = (rows(&latent, WIDTHS[0]), rows(&rope, WIDTHS[1]));
                for h in 0..HEADS {
                    for i in 0..QUERIES {
                        let at = (b * HEADS + h) * QUERIES + i;
                        let ql = &q_latent[at * WIDTHS[0]..(at + 1) * WIDTHS[0]];
                        let qr = &q_rope[at * WIDTHS[1]..(at + 1) * WIDTHS[1]];
                        let want = attention(&row_latent, &row_rope, ql, qr, scale as f64, &selected[b * QUERIES + i], |_| 0.0);
                        let out = at * WIDTHS[0]..(at + 1) * WIDTHS[0];
                        for (c, ((&s, &d), &w)) in sparse[out.clone()].iter().zip(&dense[out]).zip(&want).enumerate() {
                            let (s, d) = (s as f64, d as f64);
                            let scaled = |e: f64, at: f64| e / (1.0 + at.abs());
                            worst_paths = worst_paths.max(scaled((s - d).abs(), d));
                            worst_ref = worst_ref.max(scaled((s - w).abs(), w)).max(scaled((d - w).abs(), w));
                            let place = format!("{what} k {k}: row {b} head {h} query {i} channel {c}");
                            assert!((s - d).abs() <= agree * (1.0 + d.abs()), "{place}: selected {s} vs dense {d}");
                            assert!((s - w).abs() <= exact * (1.0 + w.abs()), "{place}: selected {s} vs float64 {w}");
                            assert!((d - w).abs() <= exact * (1.0 + w.abs()), "{place}: dense {d} vs float64 {w}");
                        }
                    }
                }
            }
            eprintln!("{what} k {k}: selected vs dense {worst_paths:.2e}, vs float64 {worst_ref:.2e}");
        }
    }
}
