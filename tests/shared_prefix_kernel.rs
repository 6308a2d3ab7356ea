//! Attention over a shared prefix through our CUDA kernel (`kernel_shared`: a pass over each
//! piece with every row's queries folded into one, a pass over the rows' own windows, one
//! combine), at GLM-5.2's widths and head count in bfloat16, with rows of different own lengths
//! (padded and ragged), a prefix of two pieces and lengths that do not fill a tile: against the
//! same attention through MLX's operations (the kernel switched off) and over the rows copied
//! into one window. On MLX's CUDA backend each case checks that the kernel ran; elsewhere the
//! same cases check the MLX-ops path against the copy. (Its own binary: it counts process-wide
//! kernel launches and flips the process-wide kernel switch.)
mod common;

use common::mlx_helpers::host;
use common::model::Rng;
use latent_cache::core::attention::MaskMode;
use latent_cache::core::kernels::cuda;
use latent_cache::core::kernels::cuda::launch;
use latent_cache::core::mlx::ops;
use latent_cache::{Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::{Array, Dtype};

const RANK: usize = 512;
const ROPE: usize = 64;
const INDEX: usize = 128;
const INDEX_HEADS: usize = 32;
const HEADS: usize = 64;
/// As `decode_kernel`'s: the kernel sums in float32 and rounds the probabilities to bfloat16.
const TOLERANCE: f32 = 2e-2;

fn values(rng: &mut Rng, shape: &[usize], amplitude: f32) -> Array {
    let v = rng.uniform(shape.iter().product(), amplitude);
    ops::astype(&Array::from_slice(&v, &shape.iter().map(|&d| d as i32).collect::<Vec<_>>()), Dtype::Bfloat16).unwrap()
}

fn append(cache: &mut LatentCache, rng: &mut Rng, tokens: usize) {
    let rows = cache.batch_size().max(1);
    let keys = values(rng, &[rows, tokens, INDEX], 1.0);
    cache.append(&values(rng, &[rows, tokens, RANK], 1.0), &values(rng, &[rows, tokens, ROPE], 1.0), Some(&keys)).unwrap();
    cache.eval().unwrap();
}

fn close(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}");
    let worst = got.iter().zip(want).map(|(g, w)| (g - w).abs() / (1.0 + w.abs())).fold(0.0f32, f32::max);
    assert!(worst <= TOLERANCE, "{what}: off by {worst}");
}

#[test]
fn the_kernel_reads_the_prefix_and_the_rows_as_one_window() {
    let mut rng = Rng::new(31);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let g = Geometry {
            kv_lora_rank: RANK,
            rope_head_dim: ROPE,
            latent_storage: StorageMode::Bf16,
            rope_storage: StorageMode::Bf16,
            index_head_dim: INDEX,
            index_storage: StorageMode::Bf16,
            layout,
            ..Geometry::default()
        };
        let mut cache = LatentCache::new(g).unwrap();
        append(&mut cache, &mut rng, 301);
        cache.fork_row(0, 2).unwrap();
        append(&mut cache, &mut rng, 45);
        // Row 1's 346 positions become a two-piece prefix below three rows.
        cache.fork_row(1, 3).unwrap();
        append(&mut cache, &mut rng, 7);
        cache.spec_round_begin().unwrap();
        append(&mut cache, &mut rng, 3);
        cache.spec_round_rollback(&[3, 0, 1]).unwrap();
        let copy = cache.materialized().unwrap().unwrap();
        let (shared, copied) = (cache.capture_donor_rows().unwrap(), copy.capture_donor_rows().unwrap());
        for (lq, mode) in [(1, MaskMode::None), (1, MaskMode::Causal), (3, MaskMode::Causal)] {
            let what = format!("{layout:?} Lq {lq} {mode:?}");
            let ql = values(&mut rng, &[3, HEADS, lq, RANK], 1.0);
            let qr = values(&mut rng, &[3, HEADS, lq, ROPE], 1.0);
            let scale = 1.0 / ((RANK + ROPE) as f32).sqrt();
            let before = cuda::mla_decode::KERNEL.launches();
            let got = host(&shared.attend(&ql, &qr, scale, mode, None).unwrap());
            if launch::on_cuda() {
                assert!(cuda::mla_decode::KERNEL.launches() > before, "{what}: the kernel ran");
            }
            cuda::mla_decode::KERNEL.set_enabled(false);
            let ops_path = host(&shared.attend(&ql, &qr, scale, mode, None).unwrap());
            let copied_ops = host(&copied.attend(&ql, &qr, scale, mode, None).unwrap());
            cuda::mla_decode::KERNEL.set_enabled(true);
            close(&got, &ops_path, &format!("{what}: kernel against MLX's operations"));
            close(&got, &copied_ops, &format!("{what}: against the rows copied"));
            // DSA: index scores through the kernel per part against the copy's, then the
            // selected attention (a decode step: through the kernel over the gathered positions).
            let qi = values(&mut rng, &[3, INDEX_HEADS, lq, INDEX], 1.0);
            let w = values(&mut rng, &[3, lq, INDEX_HEADS], 0.2);
            let before = cuda::dsa_scores::KERNEL.launches();
            let scores = shared.index_scores(&qi, &w, mode).unwrap();
            let got_scores = host(&scores);
            if launch::on_cuda() && lq == 1 {
                assert!(cuda::dsa_scores::KERNEL.launches() > before, "{what}: the scores kernel ran");
            }
            let want_scores = host(&copied.index_scores(&qi, &w, mode).unwrap());
            let finite = |v: &[f32]| v.iter().map(|x| if x.is_finite() { *x } else { -1e30 }).collect::<Vec<_>>();
            close(&finite(&got_scores), &finite(&want_scores), &format!("{what}: index scores"));
            let k = 64;
            let indices = copied.select(&copied.index_scores(&qi, &w, mode).unwrap(), k).unwrap().unwrap();
            let before = cuda::mla_decode::KERNEL.launches();
            let got = host(&shared.attend_selected(&ql, &qr, scale, mode, &indices).unwrap());
            if launch::on_cuda() && lq == 1 {
                assert!(cuda::mla_decode::KERNEL.launches() > before, "{what}: the kernel ran over the selection");
            }
            cuda::mla_decode::KERNEL.set_enabled(false);
            let want = host(&copied.attend_selected(&ql, &qr, scale, mode, &indices).unwrap());
            cuda::mla_decode::KERNEL.set_enabled(true);
            close(&got, &want, &format!("{what}: selected attention"));
        }
    }
}
