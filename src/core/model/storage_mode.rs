//! Storage modes, as facts: what each mode stores per position (its parts, widths and dtypes,
//! bits, groups), what reads return, and which modes a kernel reads as stored. The encoding and
//! decoding over MLX arrays live in `storage::codec`.
//!
//! Storage modes: how one family's positions are held. A mode turns the values of some
//! positions `[rows, tokens, width]` into one or more *parts* that share the position axis
//! (`[rows, tokens, part_width]` each), and back. Because every part is indexed by position,
//! moving, trimming or copying positions never re-encodes anything: storage treats parts
//! alike, and only appends encode (the new positions only) and reads decode.
use mlx_rs::Dtype;

use crate::core::error::{fail, Result};

/// Values per group of the affine modes (MLX's quantization along the width, as mlx-lm's
/// `QuantizedKVCache` stores keys and values).
pub(crate) const AFFINE_GROUP: usize = 64;

/// Values per block sharing one float32 scale in FP8 mode (DeepSeek's FlashMLA and SGLang).
pub(crate) const FP8_BLOCK: usize = 128;

/// E4M3's largest finite value: a block's largest magnitude maps to it.
pub(crate) const FP8_MAX: f32 = 448.0;

/// Floor on a block's largest magnitude, so an all-zero block gets a finite scale.
pub(crate) const FP8_MIN_AMAX: f32 = 1e-10;

/// How a packed mode lays out its codes, as the kernels that read them packed see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Packing {
    /// MLX's affine quantization to 8 or 4 bits (Q8, Q4): codes in 32-bit words, a bfloat16
    /// scale and bias per 64 values.
    Affine(usize),
    /// E4M3 codes (bytes) with a float32 scale per block of 128 values (FP8).
    Fp8,
}

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

    /// Whether this mode stores plain float values (one part; a read is a view, never a
    /// decode). The others store codes with scales ("packed": `Q8`, `Q4`, `Fp8`).
    pub fn is_float(self) -> bool {
        self.group_size() == 0
    }

    /// The element type of a float mode's one part; `None` for the packed modes.
    pub fn float_dtype(self) -> Option<Dtype> {
        match self {
            StorageMode::F32 => Some(Dtype::Float32),
            StorageMode::Bf16 => Some(Dtype::Bfloat16),
            StorageMode::F16 => Some(Dtype::Float16),
            StorageMode::Q8 | StorageMode::Q4 | StorageMode::Fp8 => None,
        }
    }

    /// The float mode that stores `dtype` as is (float32, bfloat16, float16).
    pub fn of_float_dtype(dtype: Dtype) -> Option<StorageMode> {
        StorageMode::ALL.into_iter().find(|m| m.float_dtype() == Some(dtype))
    }

    /// The mode named `name` (as `name()` writes it).
    pub fn from_name(name: &str) -> Option<StorageMode> {
        StorageMode::ALL.into_iter().find(|m| m.name() == name)
    }

    /// What the split-K attention kernels read for a latent stored in `latent` beside a rope in
    /// `rope`: the query dtype they take and the latent's packing. Latent and rope in one float
    /// dtype, or a packed latent (Q8, Q4, FP8) with a bfloat16 rope; `None` otherwise.
    pub fn kernel_reads(latent: StorageMode, rope: StorageMode) -> Option<(Dtype, Option<Packing>)> {
        match (latent.float_dtype(), latent.packing()) {
            (Some(dtype), _) if rope == latent => Some((dtype, None)),
            (None, Some(packing)) if rope == StorageMode::Bf16 => Some((Dtype::Bfloat16, Some(packing))),
            _ => None,
        }
    }

    /// How a kernel reads this mode's parts without decoding them: `None` for the float modes
    /// (a kernel reads their values as stored), the packing for the others.
    pub fn packing(self) -> Option<Packing> {
        match self {
            StorageMode::F32 | StorageMode::Bf16 | StorageMode::F16 => None,
            StorageMode::Q8 | StorageMode::Q4 => Some(Packing::Affine(self.bits())),
            StorageMode::Fp8 => Some(Packing::Fp8),
        }
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
}
