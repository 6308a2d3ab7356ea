//! Reading a donor's stored families: values decoded (or read through MLX's quantized matmul
//! from the affine modes' codes, never expanded), with composed storage's hot positions laid
//! over the compact ones, and the alignment of the window to the hot rows that the score and
//! weighted-latent products share.
use mlx_rs::{Array, Dtype};

use super::Donor;
use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;
use crate::core::model::storage_mode::{Packing, AFFINE_GROUP};
use crate::core::storage::hot::{hot_alignment, hot_from, overlay_hot, same_dtype, with_tail};

/// Whether MLX's quantized matmul takes the batched shapes attention needs on the default
/// device. MLX 0.32's CUDA backend has no kernel for them (it fails at evaluation, too late to
/// fall back), so there the affine families (Q8, Q4) are decoded for the call instead.
fn batched_quantized_matmul() -> bool {
    !launch::cuda_device()
}

impl Donor {
    /// `[B, 1, T, ...]`: a stored part with the head axis attention broadcasts over.
    pub(super) fn per_head(part: &Array) -> Result<Array> {
        math::expand_dims(part, 1)
    }

    /// `x` times an affine family's values (Q8, Q4; `transpose`: their transpose), read by MLX's
    /// quantized matmul from the packed codes. It runs in float32 (the bfloat16 scales and biases
    /// converted, 1/32 of the codes' size or less): with bfloat16 inputs MLX's CPU kernel sums in
    /// bfloat16, which put a uniform average over 200 positions 9% off. `None` for float
    /// families, and where MLX has no kernel for the shape (its CUDA backend lacks some batched
    /// shapes): the caller then decodes.
    pub(super) fn quantized_product(&self, family: Family, x: &Array, transpose: bool) -> Result<Option<Array>> {
        let (mode, parts) = (self.geometry.storage(family), self.parts(family));
        if !matches!(mode.packing(), Some(Packing::Affine(_))) || !batched_quantized_matmul() {
            return Ok(None);
        }
        let [codes, scales, biases] = [&parts[0], &parts[1], &parts[2]].map(Self::per_head);
        let f32 = |a: Result<Array>| a.and_then(|a| ops::astype(&a, Dtype::Float32));
        let (scales, biases) = (f32(scales)?, f32(biases)?);
        let x = ops::astype(x, Dtype::Float32)?;
        match math::quantized_matmul(&x, &codes?, &scales, &biases, transpose, AFFINE_GROUP as i32, mode.bits() as i32) {
            Ok(out) => Ok(Some(ops::astype(&out, Dtype::Float32)?)),
            Err(_) => Ok(None),
        }
    }

    /// A family's stored `parts` (`[B, n, part_width]` each: the window, or positions gathered
    /// from it) decoded as attention reads them, `[B, n, width]`: the affine modes (Q8, Q4) as
    /// `code * scale + bias` in float32, their bfloat16 scales and biases converted first,
    /// which is the arithmetic of `quantized_product` (MLX's `dequantize` of the stored parts,
    /// which `StorageMode::decode` and reads use, rounds each value to bfloat16: up to 2^-9 of
    /// it); the other modes as `StorageMode::decode` (float32 for FP8, float modes as stored).
    /// Dense and selected attention both read through here, so they compute alike.
    pub(super) fn decode_parts(&self, family: Family, parts: &[Array]) -> Result<Array> {
        let (mode, width) = (self.geometry.storage(family), self.geometry.width(family).expect("present"));
        let positions = parts[0].shape()[0] as usize * parts[0].shape()[1] as usize;
        match mode.packing() {
            Some(Packing::Affine(bits)) if positions > 0 => {
                let [scales, biases] = [&parts[1], &parts[2]].map(|a| ops::astype(a, Dtype::Float32));
                ops::dequantize(&parts[0], &scales?, &biases?, AFFINE_GROUP as i32, bits as i32)
            }
            _ => mode.decode(parts, width),
        }
    }

    /// A family's values `[B, T, width]` (decoded for the packed modes by `decode_parts`:
    /// O(stored)), with composed storage's hot positions over the compact ones.
    pub(super) fn decoded(&self, family: Family) -> Result<Array> {
        let cold = self.decode_parts(family, self.parts(family))?;
        match self.hot_values(family) {
            Some((hot, bases, starts)) => overlay_hot(&cold, hot, bases, starts, (0, self.offset)),
            None => Ok(cold),
        }
    }

    /// A family's values `[B, 1, T, width]` (see `decoded`).
    pub(super) fn values(&self, family: Family) -> Result<Array> {
        Self::per_head(&self.decoded(family)?)
    }

    /// The first window position some row reads hot (`hot_from`), and where the window positions
    /// `[from, T)` of each row sit in its hot row (`[B, 1, 1, T - from]` indices) and whether each
    /// is read hot (a mask of that shape), for a hot row of `capacity`. Built once per donor and
    /// capacity (the host loop runs over every row's span).
    pub(super) fn window_alignment(&self, bases: &[usize], starts: &[usize], capacity: usize) -> Result<(usize, Array, Array)> {
        if let Some((built_for, from, at, mask)) = self.alignment.get() {
            if *built_for == capacity {
                return Ok((*from, at.clone(), mask.clone()));
            }
        }
        let from = hot_from(bases, starts, (0, self.offset));
        let (at, is_hot) = hot_alignment(bases, starts, capacity, (from, self.offset));
        let shape = [bases.len(), 1, 1, self.offset - from];
        let mask = math::greater_equal(&ops::indices(&is_hot, &shape), &ops::indices(&[1], &[1]))?;
        let at = ops::indices(&at, &shape);
        let _ = self.alignment.set((capacity, from, at.clone(), mask.clone()));
        Ok((from, at, mask))
    }

    /// `x` (`[B, 1, N, T]`, over the window) with each row's hot positions from `hot_part`
    /// (`[B, 1, N, capacity]`, over its hot row).
    pub(super) fn overlay_positions(&self, x: &Array, hot_part: &Array, bases: &[usize], starts: &[usize]) -> Result<Array> {
        let (from, at, is_hot) = self.window_alignment(bases, starts, hot_part.shape()[3] as usize)?;
        with_tail(x, 3, from, |tail| {
            let aligned = math::take_along_axis(hot_part, &at, 3)?;
            let (tail, aligned) = same_dtype(tail, aligned)?;
            math::select(&is_hot, &aligned, &tail)
        })
    }
}
