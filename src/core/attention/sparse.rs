//! DSA's sparse attention: index scores against the stored index keys, the top-k positions
//! per query, and attention over the selected positions alone (read through the indices by our
//! kernels, or gathered as stored and then decoded by MLX's ops: `k` positions a query, never
//! the whole window).
use mlx_rs::{Array, Dtype};

use super::{Donor, MaskMode};
use crate::core::error::{fail, Result};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;
use crate::core::storage::hot::same_dtype;

impl Donor {
    /// The values of a family at `indices` (`[B, Lq, k]` window positions), `[B, Lq, k, width]`
    /// in the dtype `decoded` reads the window in: the selected positions' parts are gathered,
    /// then decoded by `decode_parts` as dense attention decodes them (k positions, not T).
    fn gather(&self, family: Family, indices: &Array) -> Result<Array> {
        let shape = indices.shape();
        let (batch, queries, k) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let flat = ops::reshape(indices, &[batch, queries * k, 1])?;
        let parts =
            self.parts(family).iter().map(|part| math::take_along_axis(part, &flat, 1)).collect::<Result<Vec<Array>>>()?;
        let width = self.geometry.width(family).expect("present");
        let mut values = self.decode_parts(family, &parts)?;
        if let Some((hot, bases, starts)) = self.hot_values(family) {
            // Selected hot positions are read from each row's hot row (the index is clamped into
            // it where the position is compact: that value is not used).
            let capacity = hot.shape()[1];
            let minus_base: Vec<i32> = bases.iter().map(|&b| -(b as i32)).collect();
            let shifted = math::add(&flat, &ops::indices(&minus_base, &[batch, 1, 1]))?;
            let in_span = math::logical_and(
                &math::greater_equal(&shifted, &ops::indices(&[0], &[1]))?,
                &math::less(&shifted, &ops::indices(&[capacity], &[1]))?,
            )?;
            let at = math::select(&in_span, &shifted, &ops::indices(&[0], &[1]))?;
            let hot = math::take_along_axis(hot, &at, 1)?;
            let row_starts: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
            let is_hot = math::logical_and(&in_span, &math::greater_equal(&flat, &ops::indices(&row_starts, &[batch, 1, 1]))?)?;
            // In one dtype as `overlay_hot` joins them (float32 where they differ).
            let (cold, hot) = same_dtype(values, hot)?;
            values = math::select(&is_hot, &hot, &cold)?;
        }
        ops::reshape(&values, &[batch, queries, k, width])
    }

    /// `indices` clamped into the window `[0, T)`: the indices are the caller's, and a gather
    /// never reads outside the stored buffers (a position outside the window reads its nearest).
    pub(super) fn within_window(&self, indices: &Array) -> Result<Array> {
        let last = ops::indices(&[self.offset.saturating_sub(1) as i32], &[1]);
        math::minimum(&ops::maximum(indices, &ops::indices(&[0], &[1]))?, &last)
    }

    /// DSA index scores, `[B, Lq, T]` float32: `sum over index heads h of weights[b, q, h] *
    /// ReLU(q_index[b, h, q] . k[b, t])` against the stored index keys, with positions the query
    /// does not see (padding, past the row's end, and with `Causal` the later positions) at -inf.
    /// `q_index` is `[B, Hi, Lq, index_head_dim]`, `weights` `[B, Lq, Hi]` (scaled as the model
    /// scales them).
    pub fn index_scores(&self, q_index: &Array, weights: &Array, mode: MaskMode) -> Result<Array> {
        Ok(self.scores_counted(q_index, weights, mode, None)?.0)
    }

    /// DSA's selection in one call: `select(index_scores(q_index, weights, mode), k)`, each
    /// checking its arguments as there, with the same result. Where both kernels apply (CUDA,
    /// Apple GPUs) the index-score kernel also counts the histogram the top-k's first kernel
    /// would: two operations where the two calls make three (a decode step's indexer layers are
    /// bound by the host's cost per operation).
    pub fn index_select(&self, q_index: &Array, weights: &Array, mode: MaskMode, k: usize) -> Result<Option<Array>> {
        if !self.runs.is_empty() {
            // Rows in several runs: each run's scores, then one selection over them all.
            return self.select(&self.index_scores(q_index, weights, mode)?, k);
        }
        // The scores' checks first, then the selection's, as the two calls make them.
        let (scores, counts) = self.scores_counted(q_index, weights, mode, Some(k))?;
        self.select_counted(&scores, counts.as_ref(), k)
    }

    /// `index_scores`, and with `count` (the top-k's `k`) the scores' top-k histogram where the
    /// library's kernels count it (see `index_select`).
    fn scores_counted(
        &self,
        q_index: &Array,
        weights: &Array,
        mode: MaskMode,
        count: Option<usize>,
    ) -> Result<(Array, Option<Array>)> {
        let Some(width) = self.geometry.width(Family::IndexKeys) else {
            return fail!(InvalidArgument, "this layer has no DSA index keys");
        };
        let (heads, queries) = self.check_query("q_index", q_index, width)?;
        if weights.shape() != [self.batch_size() as i32, queries, heads] {
            return fail!(Shape, "weights must be [{}, {queries}, {heads}], got {:?}", self.batch_size(), weights.shape());
        }
        if mode == MaskMode::Array {
            return fail!(InvalidArgument, "index scores take the NONE or CAUSAL mask mode");
        }
        if let Some(scores) = self.by_runs(&[Some(q_index), Some(weights)], |run, a| {
            run.index_scores(a[0].as_ref().expect("given"), a[1].as_ref().expect("given"), mode)
        })? {
            return Ok((scores, None));
        }
        if self.shared.is_some() {
            return Ok((self.shared_index_scores(q_index, weights, mode)?, None));
        }
        self.check_rows(mode, queries as usize)?;
        let (h, lq) = (heads as usize, queries as usize);
        if let Some(scored) = self.kernel_index_scores(q_index, weights, mode, (h, lq, width), count)? {
            return Ok(scored);
        }
        let keys = ops::astype(&self.decoded(Family::IndexKeys)?, Dtype::Float32)?;
        let scores = Self::index_products(q_index, weights, &keys)?;
        match self.masks(mode, lq) {
            true => Ok((math::add(&scores, &self.query_mask(mode, lq)?)?, None)),
            false => Ok((scores, None)),
        }
    }

    /// Index scores before any mask, `[B, Lq, T]` float32: queries `q_index` `[B, Hi, Lq, w]`
    /// and `weights` `[B, Lq, Hi]` against `keys` `[B, T, w]` float32, or `[1, T, w]` (a shared
    /// prefix's piece, whose one row serves every row's queries, folded into one product).
    pub(super) fn index_products(q_index: &Array, weights: &Array, keys: &Array) -> Result<Array> {
        let s = q_index.shape();
        let (b, h, lq, width) = (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize);
        let t = keys.shape()[1] as usize;
        // Every head and query folded into the rows of one product per row, [B, Hi*Lq, 128] x
        // [B, 128, T]: a head axis broadcast against the keys made MLX's CUDA matmul expand the
        // keys per head at batch > 1 (60x slower at batch 8, 128K positions).
        let rows = match keys.shape()[0] {
            1 => [1, b * h * lq, width],
            _ => [b, h * lq, width],
        };
        let q = ops::reshape(&ops::astype(q_index, Dtype::Float32)?, &rows)?;
        let per_head = ops::maximum(&math::matmul(&q, &math::swapaxes(keys, -1, -2)?)?, &ops::scalar(0.0))?;
        let weights = ops::astype(weights, Dtype::Float32)?;
        if lq == 1 {
            // One query: the weighted sum over heads is one more product, [B, 1, Hi] x [B, Hi, T]
            // (folded products unfolded to that first).
            let per_head = match rows[0] == b {
                true => per_head,
                false => ops::reshape(&per_head, &[b, h, t])?,
            };
            return math::matmul(&weights, &per_head);
        }
        // [B, Lq, Hi] -> [B, Hi, Lq, 1] against [B, Hi, Lq, T], summed over heads.
        let weights = math::expand_dims(&math::swapaxes(&weights, 1, 2)?, 3)?;
        math::sum(&ops::multiply(&ops::reshape(&per_head, &[b, h, lq, t])?, &weights)?, 1)
    }

    /// The `k` positions with the highest scores per query (`scores` `[B, Lq, T]` from
    /// `index_scores`), `[B, Lq, k]` int32 window positions in no particular order; `None` when
    /// the window holds no more than `k` positions (attend densely, as DeepSeek's indexer does).
    /// On CUDA and Apple GPUs up to 32K positions our radix-select kernel (`kernel_select`: ties
    /// at the k-th score go to the first positions), elsewhere MLX's `argpartition` (ties as it
    /// breaks them).
    pub fn select(&self, scores: &Array, k: usize) -> Result<Option<Array>> {
        self.select_counted(scores, None, k)
    }

    /// `select`, the scores' top-k histogram already `counted` where the index-score kernel
    /// counted it (`index_select`).
    fn select_counted(&self, scores: &Array, counted: Option<&Array>, k: usize) -> Result<Option<Array>> {
        if k == 0 {
            return fail!(InvalidArgument, "top-k needs k of at least 1");
        }
        let shape = scores.shape();
        let t = self.offset();
        if shape.len() != 3 || shape[0] as usize != self.batch_size() || shape[2] as usize != t {
            return fail!(Shape, "scores must be [{}, queries, {t}], got {shape:?}", self.batch_size());
        }
        if t <= k {
            return Ok(None);
        }
        if let Some(top) = self.kernel_select(scores, counted, k)? {
            return Ok(Some(top));
        }
        // The last k of a partition at T - k are the k largest (no negated copy of the scores).
        let order = math::argpartition(scores, (t - k) as i32, -1)?;
        let top = ops::slice(&order, &[0, 0, t - k], &[shape[0] as usize, shape[1] as usize, t])?;
        Ok(Some(ops::astype(&top, Dtype::Int32)?))
    }

    /// Attention over the selected positions alone (`indices` `[B, Lq, k]` from `select`): the
    /// formula of `attend` with `T` replaced by each query's `k` positions; selected positions
    /// the query does not see (a row shorter than `k`) are masked out, and a query that sees no
    /// position (`Causal` over a row shorter than the queries) gives zeros. `[B, H, Lq,
    /// kv_lora_rank]` float32, lazily; reads `k` positions per query, not the whole window.
    /// Computed with `attend`'s arithmetic: the selected positions decoded as `attend` reads
    /// them (`decode_parts`), the products in the queries' dtype where the family is read in it
    /// (16-bit queries over that storage), else in float32, as `attend`'s MLX-ops path does; the
    /// kernel (`kernel_selected`) as `attend`'s kernel.
    pub fn attend_selected(
        &self,
        q_latent: &Array,
        q_rope: &Array,
        scale: f32,
        mode: MaskMode,
        indices: &Array,
    ) -> Result<Array> {
        let dims = self.check_query("q_latent", q_latent, self.geometry.kv_lora_rank)?;
        if self.check_query("q_rope", q_rope, self.geometry.rope_head_dim)? != dims {
            return fail!(Shape, "q_rope's heads and queries {:?} differ from q_latent's", q_rope.shape());
        }
        let shape = indices.shape();
        if shape.len() != 3 || shape[0] as usize != self.batch_size() || shape[1] != dims.1 || indices.dtype() != Dtype::Int32 {
            return fail!(
                Shape,
                "indices must be int32 [{}, {}, k], got {:?} {:?}",
                self.batch_size(),
                dims.1,
                shape,
                indices.dtype()
            );
        }
        if mode == MaskMode::Array {
            return fail!(InvalidArgument, "selected attention takes the NONE or CAUSAL mask mode");
        }
        if let Some(out) = self.by_runs(&[Some(q_latent), Some(q_rope), Some(indices)], |run, a| {
            run.attend_selected(
                a[0].as_ref().expect("given"),
                a[1].as_ref().expect("given"),
                scale,
                mode,
                a[2].as_ref().expect("given"),
            )
        })? {
            return Ok(out);
        }
        if self.shared.is_some() {
            return self.shared_selected(q_latent, q_rope, scale, mode, indices);
        }
        self.check_rows(mode, dims.1 as usize)?;
        if let Some(out) = self.kernel_selected(q_latent, q_rope, scale, indices)? {
            return Ok(out);
        }
        if let Some(out) = self.kernel_selected_chunk(q_latent, q_rope, scale, mode, indices)? {
            return Ok(out);
        }
        let indices = &self.within_window(indices)?;
        // Visibility of the selected positions: the row mask gathered at them, [B, Lq, 1, k].
        let visible = match self.masks(mode, dims.1 as usize) {
            true => {
                let mask = self.query_mask(mode, dims.1 as usize)?;
                Some(math::expand_dims(&math::take_along_axis(&mask, indices, 2)?, 2)?)
            }
            false => None,
        };
        let (latent, rope) = (self.gather(Family::Latent, indices)?, self.gather(Family::Rope, indices)?);
        let out = self.attend_gathered(q_latent, q_rope, scale, &latent, &rope, visible.as_ref())?;
        self.zero_padding_queries(out, mode, dims.1 as usize)
    }

    /// Attention of `[B, H, Lq, w]` queries over each query's gathered positions (`latent`,
    /// `rope`: `[B, Lq, k, width]`), with an additive `visible` mask `[B, Lq, 1, k]`: `[B, H, Lq,
    /// kv_lora_rank]` float32.
    pub(super) fn attend_gathered(
        &self,
        q_latent: &Array,
        q_rope: &Array,
        scale: f32,
        latent: &Array,
        rope: &Array,
        visible: Option<&Array>,
    ) -> Result<Array> {
        // [B, H, Lq, w] -> [B, Lq, H, w], against [B, Lq, k, w]^T: [B, Lq, H, k]. As `attend`'s
        // `scores`: the queries as given against the values as read (MLX promotes the product
        // to float32 unless both are in one 16-bit dtype), summed, then float32 and scaled.
        let per_query = |q: &Array, values: &Array| -> Result<Array> {
            let q = math::swapaxes(q, 1, 2)?;
            math::matmul(&q, &math::swapaxes(values, -1, -2)?)
        };
        let scores = math::add(&per_query(q_latent, latent)?, &per_query(q_rope, rope)?)?;
        let mut scores = ops::multiply(&ops::astype(&scores, Dtype::Float32)?, &ops::scalar(scale))?;
        if let Some(visible) = visible {
            scores = math::add(&scores, visible)?;
        }
        let probs = math::softmax(&scores, -1)?;
        // As `attend`'s `weighted_latent`: in the queries' dtype where the latent is read in it.
        let compute = q_latent.dtype();
        let probs = match latent.dtype() == compute && compute != Dtype::Float32 {
            true => ops::astype(&probs, compute)?,
            false => probs,
        };
        let out = ops::astype(&math::matmul(&probs, latent)?, Dtype::Float32)?;
        math::swapaxes(&out, 1, 2)
    }
}
