//! Which window positions each query sees: a row's valid range `[left_pad, row_end)`, with
//! `Causal` a band ending at the query's own position. Built as additive masks only where some
//! query misses a position (a mask made on the host costs an evaluation on MLX's CUDA backend).
//! A query that sees no position (a left-padded prefill's padding queries under `Causal`, or a
//! mask array's row that is all -inf) gets zeros, never the NaN of a softmax over nothing.
use mlx_rs::Array;

use super::{Donor, MaskMode};
use crate::core::error::{fail, Result};
use crate::core::mlx::{math, ops};

impl Donor {
    /// Whether some query misses a position of the window: a row padded or ending before the
    /// window's end, or causal queries after the first. Otherwise `row_mask` is all zeros and is
    /// left out: besides its operations, its two index arrays are made on the host, which on
    /// MLX's CUDA backend costs an evaluation reading them about 30 us each (measured on an H200).
    pub(super) fn masks(&self, mode: MaskMode, queries: usize) -> bool {
        !(self.whole_rows() && (mode == MaskMode::None || (mode == MaskMode::Causal && queries == 1)))
    }

    /// Whether every row spans the whole window (no padding, every row at the offset).
    fn whole_rows(&self) -> bool {
        self.left_pad.iter().all(|&p| p == 0) && self.row_ends.iter().all(|&e| e == self.offset)
    }

    /// Each row's window positions `[left_pad, row_end)`.
    pub(super) fn row_ranges(&self) -> Vec<(usize, usize)> {
        self.left_pad.iter().copied().zip(self.row_ends.iter().copied()).collect()
    }

    /// Additive mask `[B, 1, 1 or Lq, T]`: 0 where a query sees the position, -inf elsewhere.
    pub(super) fn row_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let batch = self.batch_size();
        let positions = ops::reshape(&math::arange(self.offset)?, &[1, 1, 1, self.offset])?;
        let lo: Vec<i32> = self.left_pad.iter().map(|&p| p as i32).collect();
        let lo = ops::indices(&lo, &[batch, 1, 1, 1]);
        let hi = match mode {
            MaskMode::Causal => {
                let hi: Vec<i32> =
                    self.row_ends.iter().flat_map(|&end| (0..queries).map(move |i| (end - queries + i + 1) as i32)).collect();
                ops::indices(&hi, &[batch, 1, queries, 1])
            }
            _ => ops::indices(&self.row_ends.iter().map(|&e| e as i32).collect::<Vec<_>>(), &[batch, 1, 1, 1]),
        };
        let visible = math::logical_and(&math::greater_equal(&positions, &lo)?, &math::less(&positions, &hi)?)?;
        math::select(&visible, &ops::scalar(0.0), &ops::scalar(f32::NEG_INFINITY))
    }

    /// `row_mask` without the head axis: `[B, 1 or Lq, T]`.
    pub(super) fn query_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let mask = self.row_mask(mode, queries)?;
        let rows = mask.shape()[2] as usize;
        ops::reshape(&mask, &[self.batch_size(), rows, self.offset])
    }

    /// Refuses an empty batch and empty rows. With `Causal`, a row may hold fewer positions
    /// than there are queries: its first queries then see none (the padding queries of a
    /// left-padded prefill) and get zeros (`padding_queries`).
    pub(super) fn check_rows(&self, mode: MaskMode, queries: usize) -> Result<()> {
        let lengths: Vec<usize> = self.left_pad.iter().zip(&self.row_ends).map(|(p, e)| e - p).collect();
        if self.batch_size() == 0 || lengths.iter().any(|&l| l == 0) {
            return fail!(State, "every row must hold a position (rows: {lengths:?}, {queries} queries, {mode:?})");
        }
        Ok(())
    }

    /// Whether some query sees no position: with `Causal`, a row shorter than the queries.
    pub(super) fn padding_queries(&self, mode: MaskMode, queries: usize) -> bool {
        mode == MaskMode::Causal && self.left_pad.iter().zip(&self.row_ends).any(|(p, e)| e - p < queries)
    }

    /// `[B, 1, Lq, 1]`: whether query `i` of row `b` sees a position under `Causal` (query `i`
    /// is the row's position `len - Lq + i`, so it sees one when `i >= Lq - len`).
    pub(super) fn causal_sees(&self, queries: usize) -> Result<Array> {
        let sees: Vec<i32> = self
            .left_pad
            .iter()
            .zip(&self.row_ends)
            .flat_map(|(p, e)| (0..queries).map(move |i| (i + (e - p) >= queries) as i32))
            .collect();
        math::greater_equal(&ops::indices(&sees, &[self.batch_size(), 1, queries, 1]), &ops::indices(&[1], &[1]))
    }

    /// `out` (`[B, H, Lq, w]`, or anything broadcasting against `[B, 1, Lq, 1]`) with the
    /// queries that see no position set to zero rather than the NaN a softmax over nothing
    /// gives. Nothing is built where every query sees a position.
    pub(super) fn zero_padding_queries(&self, out: Array, mode: MaskMode, queries: usize) -> Result<Array> {
        if !self.padding_queries(mode, queries) {
            return Ok(out);
        }
        math::select(&self.causal_sees(queries)?, &out, &ops::scalar(0.0))
    }
}
