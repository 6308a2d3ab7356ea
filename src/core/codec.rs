//! Storage modes: how one family's positions are held. A mode turns the values of some
//! positions `[rows, tokens, width]` into one or more *parts* that share the position axis
//! (`[rows, tokens, part_width]` each), and back. Because every part is indexed by position,
//! moving, trimming or copying positions never re-encodes anything: storage treats parts
//! alike, and only appends encode (the new positions only) and reads decode.
use mlx_rs::{Array, Dtype};

use super::error::{fail, Result};
use super::fp8_kernel;
use super::mlx_ops;

/// Values per group of the affine modes (MLX's quantization along the width, as mlx-lm's
/// `QuantizedKVCache` stores keys and values).
pub(crate) const AFFINE_GROUP: usize = 64;

/// Values per block sharing one float32 scale in FP8 mode (DeepSeek's FlashMLA and SGLang).
pub(crate) const FP8_BLOCK: usize = 128;

/// E4M3's largest finite value: a block's largest magnitude maps to it.
const FP8_MAX: f32 = 448.0;

/// Floor on a block's largest magnitude, so an all-zero block gets a finite scale.
const FP8_MIN_AMAX: f32 = 1e-10;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StorageMode {
    /// float32: exact.
    #[default]
    F32,
    /// bfloat16, rounded to nearest even on the write.
    Bf16,
    /// float16, rounded to nearest even on the write.
    F16,
    /// 8-bit affine: uint32-packed codes, bf16 scale and bias per group of 64.
    Q8,
    /// 4-bit affine: as `Q8` with 4-bit codes.
    Q4,
    /// E4M3 codes (uint8) with a float32 scale per block of 128 values.
    Fp8,
}

/// One part of a stored family: its width per position and element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub width: usize,
    pub dtype: Dtype,
}

impl Part {
    /// Bytes of one element.
    pub fn bytes(&self) -> usize {
        match self.dtype {
            Dtype::Float32 | Dtype::Uint32 => 4,
            Dtype::Bfloat16 | Dtype::Float16 => 2,
            _ => 1,
        }
    }
}

impl StorageMode {
    pub const ALL: [StorageMode; 6] =
        [StorageMode::F32, StorageMode::Bf16, StorageMode::F16, StorageMode::Q8, StorageMode::Q4, StorageMode::Fp8];

    pub fn name(self) -> &'static str {
        match self {
            StorageMode::F32 => "f32",
            StorageMode::Bf16 => "bf16",
            StorageMode::F16 => "f16",
            StorageMode::Q8 => "q8",
            StorageMode::Q4 => "q4",
            StorageMode::Fp8 => "fp8",
        }
    }

    /// Bits per stored code: 32 and 16 for the float modes.
    pub fn bits(self) -> usize {
        match self {
            StorageMode::F32 => 32,
            StorageMode::Bf16 | StorageMode::F16 => 16,
            StorageMode::Q8 | StorageMode::Fp8 => 8,
            StorageMode::Q4 => 4,
        }
    }

    /// Values sharing one scale: 0 for the float modes.
    pub fn group_size(self) -> usize {
        match self {
            StorageMode::F32 | StorageMode::Bf16 | StorageMode::F16 => 0,
            StorageMode::Q8 | StorageMode::Q4 => AFFINE_GROUP,
            StorageMode::Fp8 => FP8_BLOCK,
        }
    }

    /// Whether reading this mode's values needs a decode (not a plain view).
    pub fn is_packed(self) -> bool {
        self.group_size() != 0
    }

    /// Refuses a width this mode cannot hold (groups must tile the width).
    pub fn check_width(self, name: &str, width: usize) -> Result<()> {
        let group = self.group_size();
        if group != 0 && width % group != 0 {
            return fail!(InvalidArgument, "{name} storage {} needs a width divisible by {group}, got {width}", self.name());
        }
        Ok(())
    }

    /// The parts one `width`-wide family is stored as.
    pub fn parts(self, width: usize) -> Vec<Part> {
        let part = |width, dtype| Part { width, dtype };
        match self {
            StorageMode::F32 => vec![part(width, Dtype::Float32)],
            StorageMode::Bf16 => vec![part(width, Dtype::Bfloat16)],
            StorageMode::F16 => vec![part(width, Dtype::Float16)],
            StorageMode::Q8 | StorageMode::Q4 => {
                let groups = width / AFFINE_GROUP;
                vec![part(width * self.bits() / 32, Dtype::Uint32), part(groups, Dtype::Bfloat16), part(groups, Dtype::Bfloat16)]
            }
            StorageMode::Fp8 => vec![part(width, Dtype::Uint8), part(width / FP8_BLOCK, Dtype::Float32)],
        }
    }

    /// Bytes one position of one row takes in this mode.
    pub fn bytes_per_position(self, width: usize) -> usize {
        self.parts(width).iter().map(|p| p.width * p.bytes()).sum()
    }

    /// The dtype reads return: the stored one for float modes, float32 after a decode.
    pub fn read_dtype(self) -> Dtype {
        match self {
            StorageMode::Bf16 => Dtype::Bfloat16,
            StorageMode::F16 => Dtype::Float16,
            _ => Dtype::Float32,
        }
    }

    /// Encodes `x` (`[rows, tokens, width]`, any float dtype) into this mode's parts, lazily.
    pub fn encode(self, x: &Array, width: usize) -> Result<Vec<Array>> {
        match self {
            StorageMode::F32 => Ok(vec![mlx_ops::astype(x, Dtype::Float32)?]),
            StorageMode::Bf16 => Ok(vec![mlx_ops::astype(x, Dtype::Bfloat16)?]),
            StorageMode::F16 => Ok(vec![mlx_ops::astype(x, Dtype::Float16)?]),
            // Quantized from bf16, the checkpoint's precision, so scales and biases are bf16.
            StorageMode::Q8 | StorageMode::Q4 => {
                mlx_ops::quantize(&mlx_ops::astype(x, Dtype::Bfloat16)?, AFFINE_GROUP as i32, self.bits() as i32)
            }
            StorageMode::Fp8 => {
                let (rows, tokens) = leading(x);
                let blocks = width / FP8_BLOCK;
                if fp8_kernel::applies(rows * tokens * blocks) {
                    return fp8_kernel::encode(x, rows, tokens, width);
                }
                let x = mlx_ops::reshape(&mlx_ops::astype(x, Dtype::Float32)?, &[rows, tokens, blocks, FP8_BLOCK])?;
                let amax = mlx_ops::maximum(&mlx_ops::abs_max_last(&x)?, &mlx_ops::scalar(FP8_MIN_AMAX))?;
                let scale = mlx_ops::divide(&amax, &mlx_ops::scalar(FP8_MAX))?;
                let codes = mlx_ops::to_fp8(&mlx_ops::divide(&x, &scale)?)?;
                Ok(vec![mlx_ops::reshape(&codes, &[rows, tokens, width])?, mlx_ops::reshape(&scale, &[rows, tokens, blocks])?])
            }
        }
    }

    /// Decodes parts (`[rows, tokens, part_width]` each) into `[rows, tokens, width]` values of
    /// `read_dtype()`, lazily. Float modes return their one part as is (a view stays a view).
    pub fn decode(self, parts: &[Array], width: usize) -> Result<Array> {
        let (rows, tokens) = leading(&parts[0]);
        if self.is_packed() && rows * tokens == 0 {
            // No positions: MLX cannot dequantize empty codes.
            return mlx_ops::zeros(&[rows, tokens, width], self.read_dtype());
        }
        match self {
            StorageMode::F32 | StorageMode::Bf16 | StorageMode::F16 => Ok(parts[0].clone()),
            StorageMode::Q8 | StorageMode::Q4 => {
                let values = mlx_ops::dequantize(&parts[0], &parts[1], &parts[2], AFFINE_GROUP as i32, self.bits() as i32)?;
                mlx_ops::astype(&values, Dtype::Float32)
            }
            StorageMode::Fp8 => {
                let blocks = width / FP8_BLOCK;
                let codes = mlx_ops::reshape(&parts[0], &[rows, tokens, blocks, FP8_BLOCK])?;
                let scale = mlx_ops::reshape(&parts[1], &[rows, tokens, blocks, 1])?;
                let values = mlx_ops::multiply(&mlx_ops::from_fp8(&codes, Dtype::Float32)?, &scale)?;
                mlx_ops::reshape(&values, &[rows, tokens, width])
            }
        }
    }
}

/// The `(rows, tokens)` of a `[rows, tokens, width]` array.
fn leading(a: &Array) -> (usize, usize) {
    let shape = a.shape();
    (shape[0] as usize, shape[1] as usize)
}
