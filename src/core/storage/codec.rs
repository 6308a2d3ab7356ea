//! Encoding and decoding a storage mode's parts over MLX arrays: appends encode the new
//! positions only, reads decode (see `model::storage_mode` for what each mode stores).
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda;
use crate::core::mlx::ops;
use crate::core::model::storage_mode::{StorageMode, AFFINE_GROUP, FP8_BLOCK, FP8_MAX, FP8_MIN_AMAX};

impl StorageMode {
    /// Encodes `x` (`[rows, tokens, width]`, any float dtype) into this mode's parts, lazily.
    pub fn encode(self, x: &Array, width: usize) -> Result<Vec<Array>> {
        match self {
            StorageMode::F32 => Ok(vec![ops::astype(x, Dtype::Float32)?]),
            StorageMode::Bf16 => Ok(vec![ops::astype(x, Dtype::Bfloat16)?]),
            StorageMode::F16 => Ok(vec![ops::astype(x, Dtype::Float16)?]),
            // Quantized from bf16, the checkpoint's precision, so scales and biases are bf16.
            StorageMode::Q8 | StorageMode::Q4 => {
                ops::quantize(&ops::astype(x, Dtype::Bfloat16)?, AFFINE_GROUP as i32, self.bits() as i32)
            }
            StorageMode::Fp8 => {
                let (rows, tokens) = leading(x);
                let blocks = width / FP8_BLOCK;
                if cuda::fp8_encode::applies(rows * tokens * blocks) {
                    return cuda::fp8_encode::encode(x, rows, tokens, width);
                }
                let x = ops::reshape(&ops::astype(x, Dtype::Float32)?, &[rows, tokens, blocks, FP8_BLOCK])?;
                let amax = ops::maximum(&ops::abs_max_last(&x)?, &ops::scalar(FP8_MIN_AMAX))?;
                let scale = ops::divide(&amax, &ops::scalar(FP8_MAX))?;
                let codes = ops::to_fp8(&ops::divide(&x, &scale)?)?;
                Ok(vec![ops::reshape(&codes, &[rows, tokens, width])?, ops::reshape(&scale, &[rows, tokens, blocks])?])
            }
        }
    }

    /// Decodes parts (`[rows, tokens, part_width]` each) into `[rows, tokens, width]` values of
    /// `read_dtype()`, lazily. Float modes return their one part as is (a view stays a view).
    pub fn decode(self, parts: &[Array], width: usize) -> Result<Array> {
        let (rows, tokens) = leading(&parts[0]);
        if !self.is_float() && rows * tokens == 0 {
            // No positions: MLX cannot dequantize empty codes.
            return ops::zeros(&[rows, tokens, width], self.read_dtype());
        }
        match self {
            StorageMode::F32 | StorageMode::Bf16 | StorageMode::F16 => Ok(parts[0].clone()),
            StorageMode::Q8 | StorageMode::Q4 => {
                let values = ops::dequantize(&parts[0], &parts[1], &parts[2], AFFINE_GROUP as i32, self.bits() as i32)?;
                ops::astype(&values, Dtype::Float32)
            }
            StorageMode::Fp8 => {
                let blocks = width / FP8_BLOCK;
                let codes = ops::reshape(&parts[0], &[rows, tokens, blocks, FP8_BLOCK])?;
                let scale = ops::reshape(&parts[1], &[rows, tokens, blocks, 1])?;
                let values = ops::multiply(&ops::from_fp8(&codes, Dtype::Float32)?, &scale)?;
                ops::reshape(&values, &[rows, tokens, width])
            }
        }
    }
}

/// The `(rows, tokens)` of a `[rows, tokens, width]` array.
fn leading(a: &Array) -> (usize, usize) {
    let shape = a.shape();
    (shape[0] as usize, shape[1] as usize)
}
