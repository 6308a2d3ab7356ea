//! What each storage mode must read back, computed without the library: bfloat16 / float16
//! round-to-nearest-even (the `half` crate), E4M3 with a float32 scale per block of 128 in plain
//! Rust, and for the affine modes MLX's own `dequantize(quantize(bf16(x)))` applied to the
//! appended values alone (the documented definition; the library stores, moves and decodes
//! them). `error_bound` gives each mode's documented worst case against the float32 input.
#![allow(dead_code)]

use latent_cache::core::mlx::ops;
use latent_cache::StorageMode;
use mlx_rs::{Array, Dtype};

/// The values `mode` reads back for `values` (positions of `width` values each).
pub fn stored(mode: StorageMode, width: usize, values: &[f32]) -> Vec<f32> {
    match mode {
        StorageMode::F32 => values.to_vec(),
        StorageMode::Bf16 => values.iter().map(|&v| half::bf16::from_f32(v).to_f32()).collect(),
        StorageMode::F16 => values.iter().map(|&v| half::f16::from_f32(v).to_f32()).collect(),
        StorageMode::Fp8 => values.chunks(128).flat_map(fp8_block).collect(),
        StorageMode::Q8 | StorageMode::Q4 => mlx_affine(values, width, if mode == StorageMode::Q8 { 8 } else { 4 }),
    }
}

/// One block of 128: scale = max(|x|, 1e-10) / 448, code = E4M3(x / scale), value = code * scale.
fn fp8_block(block: &[f32]) -> Vec<f32> {
    let amax = block.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-10);
    let scale = amax / 448.0;
    block.iter().map(|&v| e4m3(v / scale) * scale).collect()
}

/// The E4M3 (fn) value nearest `x`, ties to even, saturating at +-448.
pub fn e4m3(x: f32) -> f32 {
    let a = x.abs();
    if a >= 464.0 {
        return 448f32.copysign(x);
    }
    // Spacing of representable values: 2^-9 below 2^-6 (subnormals), else 2^(exponent - 3).
    let exponent = ((a.to_bits() >> 23) as i32 - 127).max(-6);
    let step = 2f32.powi(exponent - 3);
    let q = a / step; // exact: a power-of-two scaling
    (q.round_ties_even() * step).copysign(x)
}

/// MLX's affine round trip of `[n, width]` values in bf16, groups of 64, read back as f32.
fn mlx_affine(values: &[f32], width: usize, bits: i32) -> Vec<f32> {
    if values.is_empty() {
        return Vec::new();
    }
    // Built on the library's stream and evaluated by the library: tests run on several threads,
    // and the library evaluates on a thread of its own, which cannot see a test thread's stream.
    let x = Array::from_slice(values, &[(values.len() / width) as i32, width as i32]);
    let x = ops::astype(&x, Dtype::Bfloat16).unwrap();
    let parts = ops::quantize(&x, 64, bits).unwrap();
    let back = ops::dequantize(&parts[0], &parts[1], &parts[2], 64, bits).unwrap();
    ops::to_host(&ops::astype(&back, Dtype::Float32).unwrap()).unwrap()
}

/// The largest error `mode` may make on any value of `values` (one position's group or block
/// `group`), as `latent_cache_storage` documents it.
pub fn error_bound(mode: StorageMode, group: &[f32]) -> f32 {
    let amax = group.iter().fold(0f32, |m, v| m.max(v.abs()));
    let (lo, hi) = group.iter().fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
    match mode {
        StorageMode::F32 => 0.0,
        StorageMode::Bf16 => amax * 2f32.powi(-8),
        StorageMode::F16 => amax * 2f32.powi(-11),
        // One step (MLX shifts the grid so the group's edge of largest magnitude is exact,
        // which can cost up to a whole step elsewhere), plus bf16 rounding of the input, of the
        // scale (times up to 2^bits - 1 codes) and of the bias.
        StorageMode::Q8 => (hi - lo) / 255.0 + amax * 2f32.powi(-8) * 4.0 + (hi - lo) * 2f32.powi(-8),
        StorageMode::Q4 => (hi - lo) / 15.0 + amax * 2f32.powi(-8) * 4.0 + (hi - lo) * 2f32.powi(-8),
        // 3 mantissa bits: half a unit in the last place relative, or half the subnormal step.
        StorageMode::Fp8 => amax * 2f32.powi(-4) + amax / 448.0 * 2f32.powi(-10),
    }
}
