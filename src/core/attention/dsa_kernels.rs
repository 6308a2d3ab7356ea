//! Choosing and feeding DSA's selection kernels (`kernels::cuda::dsa_scores`, `dsa_topk` and
//! their Metal counterparts): the index scores over the stored keys as they are, the top-k, and
//! the two in two operations where the scores kernel counts the top-k's histogram. Every path
//! returns `None` where it does not apply, and the caller falls back to MLX's operations
//! (`sparse`, `shared_dsa`).
use mlx_rs::{Array, Dtype};

use super::{Donor, MaskMode};
use crate::core::error::Result;
use crate::core::kernels::{cuda, metal};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;

impl Donor {
    /// `select` by the library's radix-select kernels (`kernels::cuda::dsa_topk` on CUDA,
    /// `kernels::metal::dsa_topk` on Apple GPUs), in two operations where MLX's `argpartition`
    /// sorts each row and then takes a slice and a cast; one where the scores' histogram is
    /// already `counted` (by that backend's index-score kernel: `kernel_index_scores`). `None`
    /// where neither applies.
    pub(super) fn kernel_select(&self, scores: &Array, counted: Option<&Array>, k: usize) -> Result<Option<Array>> {
        let s = scores.shape();
        let (batch, queries, positions) = (s[0] as usize, s[1] as usize, s[2] as usize);
        if cuda::dsa_topk::applies(scores.dtype(), batch, queries, positions, k) {
            return cuda::dsa_topk::top_k(scores, counted, k).map(Some);
        }
        if metal::dsa_topk::applies(scores.dtype(), batch, queries, positions, k) {
            return metal::dsa_topk::top_k(scores, counted, k).map(Some);
        }
        Ok(None)
    }

    /// `index_scores` of a shared prefix's piece (one row, `keys [1, len, w]`) for every row's
    /// queries by the CUDA kernel: the rows folded into the queries (`[1, Hi, B * Lq, w]`, a
    /// copy of the queries), `[B, Lq, len]`. `None` where it does not apply.
    pub(super) fn kernel_piece_scores(&self, piece: &Donor, q_index: &Array, weights: &Array) -> Result<Option<Array>> {
        let keys = &piece.parts(Family::IndexKeys)[0];
        let s = q_index.shape();
        let (batch, heads, queries, width) = (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize);
        let float = matches!(self.geometry.storage(Family::IndexKeys).float_dtype(), Some(Dtype::Bfloat16 | Dtype::Float16));
        if !float
            || !cuda::dsa_scores::applies((keys.dtype(), q_index.dtype()), 1, heads, batch * queries, width, piece.offset, false)
        {
            return Ok(None);
        }
        let folded = ops::reshape(&ops::contiguous(&math::swapaxes(q_index, 0, 1)?)?, &[1, heads, batch * queries, width])?;
        let weights = ops::reshape(weights, &[1, batch * queries, heads])?;
        let (scores, _) = cuda::dsa_scores::index_scores(&folded, &weights, keys, &[(0, piece.offset)], false, false)?;
        Ok(Some(ops::reshape(&scores, &[batch, queries, piece.offset])?))
    }

    /// `index_scores` by the library's kernel on CUDA (`kernels::cuda::dsa_scores`) or on Apple
    /// GPUs (`kernels::metal::dsa_scores`), from the stored keys as they are: 16-bit float
    /// storage without composed hot values. `None` where neither applies. With `count` (the
    /// top-k's `k`), where that backend's top-k kernel selects `k` of them, also the scores'
    /// top-k histogram, counted by the same kernel.
    pub(super) fn kernel_index_scores(
        &self,
        q_index: &Array,
        weights: &Array,
        mode: MaskMode,
        (heads, queries, width): (usize, usize, usize),
        count: Option<usize>,
    ) -> Result<Option<(Array, Option<Array>)>> {
        let keys = &self.parts(Family::IndexKeys)[0];
        let float = matches!(self.geometry.storage(Family::IndexKeys).float_dtype(), Some(Dtype::Bfloat16 | Dtype::Float16));
        let (batch, positions) = (self.batch_size(), self.offset);
        if !float || self.hot_values(Family::IndexKeys).is_some() || self.padding_queries(mode, queries) {
            return Ok(None);
        }
        let (ranges, causal) = (self.row_ranges(), mode == MaskMode::Causal);
        let dtypes = (q_index.dtype(), weights.dtype());
        let ranged = ranges.iter().any(|&r| r != (0, positions));
        let top_k = |applies: fn(Dtype, usize, usize, usize, usize) -> bool| {
            count.is_some_and(|k| applies(Dtype::Float32, batch, queries, positions, k))
        };
        // The scores kernel counts the top-k's histogram where that backend's top-k selects (and
        // scores alone where its histogram does not fit).
        for counted in [top_k(cuda::dsa_topk::applies), false] {
            if cuda::dsa_scores::applies((keys.dtype(), dtypes.0), batch, heads, queries, width, positions, counted) {
                return cuda::dsa_scores::index_scores(q_index, weights, keys, &ranges, causal, counted).map(Some);
            }
        }
        for counted in [top_k(metal::dsa_topk::applies), false] {
            let form = (ranged, causal, counted);
            if metal::dsa_scores::applies(keys.dtype(), dtypes, batch, heads, queries, width, positions, form) {
                return metal::dsa_scores::index_scores(q_index, weights, keys, &ranges, causal, counted).map(Some);
            }
        }
        Ok(None)
    }
}
