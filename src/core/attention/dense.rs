//! Dense attention through MLX's operations: every query against every window position it
//! sees, `softmax(scale * (q_latent . latent^T + q_rope . rope^T) + mask) . latent`, with every
//! head's queries folded into one product per row; for one row over float storage, MLX's fused
//! attention as mlx-lm's decode runs it. `attend` tries our kernels first (`on_kernels`).
use mlx_rs::{Array, Dtype};

use super::{Donor, MaskMode, Query};
use crate::core::error::{fail, Result};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;
use crate::core::storage::hot::with_tail;

impl Donor {
    /// `[B, H, Lq, n]` -> `[B, 1, H * Lq, n]`: every head's queries as rows of one product with a
    /// row's stored values, which are then read once per row rather than broadcast per head (MLX
    /// 0.32's CPU matmul also crashes on the broadcast form at batch 8 and 16K positions).
    fn fold_heads(x: &Array) -> Result<Array> {
        let s = x.shape();
        ops::reshape(x, &[s[0] as usize, 1, (s[1] * s[2]) as usize, s[3] as usize])
    }

    /// The inverse of `fold_heads` for a product `[B, 1, H * Lq, n]`, given `heads`.
    fn unfold_heads(x: &Array, heads: i32) -> Result<Array> {
        let s = x.shape();
        ops::reshape(x, &[s[0] as usize, heads as usize, (s[2] / heads) as usize, s[3] as usize])
    }

    /// `q . family^T`, `[B, H, Lq, T]`.
    pub(super) fn scores(&self, family: Family, q: &Array) -> Result<Array> {
        let folded = Self::fold_heads(q)?;
        let scores = match (self.quantized_product(family, &folded, true)?, self.hot_values(family)) {
            (Some(cold), Some((hot, bases, starts))) => {
                // Compact positions from their codes, hot ones from their values.
                let hot_scores = math::matmul(&folded, &math::swapaxes(&Self::per_head(hot)?, -1, -2)?)?;
                self.overlay_positions(&cold, &hot_scores, bases, starts)?
            }
            (Some(scores), None) => scores,
            (None, _) => math::matmul(&folded, &math::swapaxes(&self.values(family)?, -1, -2)?)?,
        };
        Self::unfold_heads(&scores, q.shape()[1])
    }

    /// `scale * (q_latent . latent^T + q_rope . rope^T)` in float32, `[B, H, Lq, T]`: the
    /// scores before any mask.
    pub(super) fn scaled_scores(&self, q_latent: &Array, q_rope: &Array, scale: f32) -> Result<Array> {
        let scores = math::add(&self.scores(Family::Latent, q_latent)?, &self.scores(Family::Rope, q_rope)?)?;
        ops::multiply(&ops::astype(&scores, Dtype::Float32)?, &ops::scalar(scale))
    }

    /// `probs . latent`, `[B, H, Lq, kv_lora_rank]` float32. `compute` is the queries' dtype:
    /// where the latent is stored in it (bfloat16 or float16 queries over that storage) the
    /// product runs in it, reading the stored values as they are; otherwise in float32 (exact,
    /// converting what is stored narrower).
    pub(super) fn weighted_latent(&self, probs: &Array, compute: Dtype) -> Result<Array> {
        let folded = Self::fold_heads(probs)?;
        let hot = self.hot_values(Family::Latent);
        // With hot positions, the compact parts take the probabilities of the compact ones only.
        let cold_probs = match hot {
            Some((values, bases, starts)) => {
                let (from, _, is_hot) = self.window_alignment(bases, starts, values.shape()[1] as usize)?;
                with_tail(&folded, 3, from, |tail| math::select(&is_hot, &ops::scalar(0.0), &tail))?
            }
            None => folded.clone(),
        };
        let out = match self.quantized_product(Family::Latent, &cold_probs, false)? {
            Some(cold) => match hot {
                Some((values, bases, starts)) => {
                    // The probabilities at each row's hot positions, laid out as its hot row.
                    let capacity = values.shape()[1] as usize;
                    let (mut at, mut is_hot) = (Vec::new(), Vec::new());
                    for (&base, &start) in bases.iter().zip(starts) {
                        for j in 0..capacity {
                            let p = base + j;
                            at.push(p.min(self.offset.saturating_sub(1)) as i32);
                            is_hot.push((p >= start && p < self.offset) as i32);
                        }
                    }
                    let shape = [bases.len(), 1, 1, capacity];
                    let is_hot = math::greater_equal(&ops::indices(&is_hot, &shape), &ops::indices(&[1], &[1]))?;
                    let gathered = math::take_along_axis(&folded, &ops::indices(&at, &shape), 3)?;
                    let hot_probs = math::select(&is_hot, &gathered, &ops::scalar(0.0))?;
                    let values = ops::astype(&Self::per_head(values)?, Dtype::Float32)?;
                    math::add(&cold, &math::matmul(&hot_probs, &values)?)?
                }
                None => cold,
            },
            None => {
                let values = self.values(Family::Latent)?;
                let folded = match values.dtype() == compute && compute != Dtype::Float32 {
                    true => ops::astype(&folded, compute)?,
                    false => folded,
                };
                ops::astype(&math::matmul(&folded, &values)?, Dtype::Float32)?
            }
        };
        Self::unfold_heads(&out, probs.shape()[1])
    }

    /// A single row's attention through MLX's fused attention, as mlx-lm's absorbed decode path
    /// runs it: the rope scores (with the row's mask) become the additive mask of one fused
    /// product over the latent as both keys and values. Taken for one row with the latent stored
    /// in the queries' float dtype; `None` elsewhere (MLX's fused kernel is slow for several rows
    /// sharing one key head, where the folded products above are faster).
    fn fused_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, extra, queries } = *q;
        let latent = self.values(Family::Latent)?;
        let float = self.geometry.latent_storage.is_float();
        if self.batch_size() != 1 || !float || latent.dtype() != q_latent.dtype() {
            return Ok(None);
        }
        // As mlx-lm: the rope query is scaled (a [H, Lq, 64] pass) rather than the scores, and
        // the scores are the mask as they come: no pass over [H, T] besides the product, unless
        // the row has padding, the queries a causal band, or the engine a mask of its own.
        let scaled = ops::multiply(q_rope, &ops::astype(&ops::scalar(scale), q_rope.dtype())?)?;
        let mut mask = self.scores(Family::Rope, &scaled)?;
        if self.masks(mode, queries) {
            mask = math::add(&mask, &self.row_mask(mode, queries)?)?;
        }
        if let Some(extra) = extra {
            mask = math::add(&mask, extra)?;
        }
        if mask.dtype() != q_latent.dtype() {
            mask = ops::astype(&mask, q_latent.dtype())?;
        }
        let out = math::sdpa(q_latent, &latent, &latent, scale, &mask)?;
        Ok(Some(ops::astype(&out, Dtype::Float32)?))
    }

    /// GLM-5's absorbed MLA attention over the donor's rows (see the module doc), `[B, H, Lq,
    /// kv_lora_rank]` float32, lazily. `mask` is required with `MaskMode::Array` and refused
    /// otherwise. Every row must hold a position; a query that sees none (with `Causal`, the
    /// first `Lq - len` queries of a row of `len < Lq` positions, a left-padded prefill's padding
    /// queries; with `Array`, a mask row that is all -inf) gives zeros.
    pub fn attend(&self, q_latent: &Array, q_rope: &Array, scale: f32, mode: MaskMode, mask: Option<&Array>) -> Result<Array> {
        let dims = self.check_query("q_latent", q_latent, self.geometry.kv_lora_rank)?;
        if self.check_query("q_rope", q_rope, self.geometry.rope_head_dim)? != dims {
            return fail!(Shape, "q_rope's heads and queries {:?} differ from q_latent's", q_rope.shape());
        }
        let queries = dims.1 as usize;
        let extra = match (mode, mask) {
            (MaskMode::Array, Some(mask)) => Some(mask),
            (MaskMode::Array, None) => return fail!(InvalidArgument, "the ARRAY mask mode needs a mask"),
            (_, Some(_)) => return fail!(InvalidArgument, "a mask array is taken only with the ARRAY mask mode"),
            (_, None) => None,
        };
        let inputs = [Some(q_latent), Some(q_rope), extra];
        if let Some(out) = self.by_runs(&inputs, |run, a| {
            run.attend(a[0].as_ref().expect("given"), a[1].as_ref().expect("given"), scale, mode, a[2].as_ref())
        })? {
            return Ok(out);
        }
        let query = Query { q_latent, q_rope, scale, mode, extra, queries };
        if self.shared.is_some() {
            // Every row holds the prefix's positions at least.
            return self.shared_attend(&query);
        }
        self.check_rows(mode, queries)?;
        if let Some(out) = self.metal_decode(&query)? {
            return Ok(out);
        }
        if let Some(out) = self.kernel_decode(&query)? {
            return Ok(out);
        }
        if let Some(out) = self.fused_decode(&query)? {
            return self.zero_padding_queries(out, mode, queries);
        }
        let scores = self.scaled_scores(q_latent, q_rope, scale)?;
        let mut scores = match self.masks(mode, queries) {
            true => math::add(&scores, &self.row_mask(mode, queries)?)?,
            false => scores,
        };
        if let Some(extra) = extra {
            scores = math::add(&scores, extra)?;
        }
        let out = self.weighted_latent(&math::softmax(&scores, -1)?, q_latent.dtype())?;
        if extra.is_some() {
            // A query whose mask row is all -inf sees nothing: zeros, as a padding query's.
            let sees = math::less(&ops::scalar(f32::NEG_INFINITY), &math::max_keep(&scores, -1)?)?;
            return math::select(&sees, &out, &ops::scalar(0.0));
        }
        self.zero_padding_queries(out, mode, queries)
    }
}
