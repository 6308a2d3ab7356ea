//! `latent_cache_storage`: how a family's positions are stored, chosen per family in the config,
//! and its checked conversion from the integer C passes.
use super::error::{Failure, FfiResult};
use super::status::latent_cache_status;
use crate::core::StorageMode;

/// How a family's positions are stored (the config's `latent_storage`, `rope_storage` and
/// `index_storage`, passed as `uint32_t`). Bytes per position of a `w`-wide family in brackets.
///
/// - Appends accept float32, bfloat16 and float16 arrays in every mode and convert only the new
///   positions; host appends take float32. Host reads always return float32.
/// - `state` and an append's outputs return the stored dtype for the float modes (views, free);
///   for `Q8`, `Q4` and `FP8` they return a float32 decode of the whole window, which costs
///   O(stored positions) each time it is evaluated. `latent_cache_packed_state` returns the
///   stored parts themselves, for MLX's quantized matmul.
/// - A mode whose groups do not tile a family's width is refused by `latent_cache_new`
///   (`INVALID_ARGUMENT`): `Q8`/`Q4` need widths divisible by 64, `FP8` by 128.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum latent_cache_storage {
    /// float32, exact [4w].
    F32 = 0,
    /// bfloat16, rounded to nearest even on the write [2w].
    Bf16 = 1,
    /// float16, rounded to nearest even on the write [2w].
    F16 = 2,
    /// MLX's affine 8-bit quantization along the width (`mx.quantize(x.astype(bfloat16),
    /// group_size=64, bits=8)`, mlx-lm's `QuantizedKVCache` layout): uint32-packed codes, a
    /// bfloat16 scale and bias per group of 64 [w + w/16]. Error: at most one step
    /// ((max - min) / 255 of the group: MLX moves the grid so the group's value of largest
    /// magnitude is exact) plus bfloat16 rounding of the input, scale and bias.
    Q8 = 3,
    /// As `Q8` with 4-bit codes [w/2 + w/16]; steps of (max - min) / 15 of the group.
    Q4 = 4,
    /// E4M3 codes (MLX's `to_fp8`, one byte each) with a float32 scale per position and block of
    /// 128 values, scale = max(|x| of the block) / 448, as DeepSeek's FlashMLA and SGLang store
    /// MLA state [w + w/32]. Relative error at most 2^-4 per value (3 mantissa bits); values
    /// below 2^-6 x scale round to multiples of 2^-9 x scale (E4M3's subnormals).
    Fp8 = 5,
}

impl latent_cache_storage {
    pub(crate) fn of(mode: StorageMode) -> Self {
        match mode {
            StorageMode::F32 => latent_cache_storage::F32,
            StorageMode::Bf16 => latent_cache_storage::Bf16,
            StorageMode::F16 => latent_cache_storage::F16,
            StorageMode::Q8 => latent_cache_storage::Q8,
            StorageMode::Q4 => latent_cache_storage::Q4,
            StorageMode::Fp8 => latent_cache_storage::Fp8,
        }
    }
}

/// Converts a `latent_cache_storage` value received as an integer (an out-of-range C enum value
/// must not become a Rust enum).
pub(crate) fn storage_mode(value: u32, name: &str) -> FfiResult<StorageMode> {
    StorageMode::ALL.into_iter().find(|&mode| latent_cache_storage::of(mode) as u32 == value).ok_or_else(|| {
        Failure::new(latent_cache_status::InvalidArgument, format!("{name} {value} is not a latent_cache_storage"))
    })
}
