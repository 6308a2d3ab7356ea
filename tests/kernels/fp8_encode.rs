//! FP8 storage reads back exactly what the documented encoding gives (scale = max(|x|, 1e-10) /
//! 448 per block of 128, codes E4M3 of x / scale, nearest even, saturating), computed in plain
//! Rust (`codec_ref`): Gaussian, heavy-tailed, all-zero, tiny and huge blocks, float32 and
//! bfloat16 inputs, one position and many per append. On MLX's CUDA backend this is the FP8
//! encoding kernel's test (each append checks that the kernel ran); elsewhere the same cases check
//! the MLX-ops encoding.
use crate::common::codec_ref;
use crate::common::model::Rng;

use latent_cache::core::kernels::cuda;
use latent_cache::core::kernels::cuda::launch;
use latent_cache::core::mlx::ops;
use latent_cache::{Family, Geometry, LatentCache, StorageMode};
use mlx_rs::{Array, Dtype};

const R: usize = 512;
const P: usize = 64;
const K: usize = 128;

/// `n` values of one kind: Gaussian-like, heavy-tailed (outlier channels), zeros, tiny or huge.
fn values(rng: &mut Rng, n: usize, kind: usize) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let u = ((rng.next() >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0;
            match kind {
                0 => u,
                1 => u * if i % 37 == 0 { 300.0 } else { 1.0 },
                2 => 0.0,
                3 => u * 1e-12,
                _ => u * 1e6,
            }
        })
        .collect()
}

#[test]
fn fp8_appends_read_back_the_documented_encoding_bit_for_bit() {
    let _counting = crate::COUNTING.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let mut rng = Rng::new(17);
    let g = Geometry {
        kv_lora_rank: R,
        rope_head_dim: P,
        index_head_dim: K,
        latent_storage: StorageMode::Fp8,
        rope_storage: StorageMode::Bf16,
        index_storage: StorageMode::Fp8,
        ..Geometry::default()
    };
    for input in [Dtype::Float32, Dtype::Bfloat16] {
        let mut cache = LatentCache::new(g).unwrap();
        let (batch, mut written) = (2, [vec![Vec::new(); 2], vec![Vec::new(); 2]]);
        for (step, tokens) in [(0, 5), (1, 1), (2, 3), (3, 1), (4, 2)] {
            let kind = step % 5;
            // The appended values as the cache sees them (bf16 inputs are rounded first).
            let mut make = |w: usize| {
                let v = values(&mut rng, batch * tokens * w, kind);
                match input {
                    Dtype::Bfloat16 => v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect(),
                    _ => v,
                }
            };
            let (latent, rope, keys) = (make(R), make(P), make(K));
            let arr = |v: &[f32], w: usize| {
                ops::astype(&Array::from_slice(v, &[batch as i32, tokens as i32, w as i32]), input).unwrap()
            };
            let before = cuda::fp8_encode::KERNEL.launches();
            cache.append(&arr(&latent, R), &arr(&rope, P), Some(&arr(&keys, K))).unwrap();
            let expected = cuda::fp8_encode::applies(1) as usize * 2;
            if launch::cuda_device() && launch::shared_memory_limit() >= 227 * 1024 {
                // A Hopper-class GPU: the kernel must be the encoding tested here.
                assert_eq!(expected, 2, "the FP8 kernel applies on this GPU");
            }
            assert_eq!(
                cuda::fp8_encode::KERNEL.launches() - before,
                expected,
                "where the kernel applies, both FP8 families use it"
            );
            for b in 0..batch {
                written[0][b].extend_from_slice(&latent[b * tokens * R..(b + 1) * tokens * R]);
                written[1][b].extend_from_slice(&keys[b * tokens * K..(b + 1) * tokens * K]);
            }
        }
        for (f, family, width) in [(0, Family::Latent, R), (1, Family::IndexKeys, K)] {
            for (b, appended) in written[f].iter().enumerate() {
                let got = cache.read_row(family, b).unwrap();
                let want = codec_ref::stored(StorageMode::Fp8, width, appended);
                assert_eq!(got.len(), want.len());
                for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(g.to_bits(), w.to_bits(), "{input:?} {family:?} row {b} value {i}: {g} vs {w}");
                }
            }
        }
    }
}
