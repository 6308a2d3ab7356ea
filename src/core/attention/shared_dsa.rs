//! DSA over rows that read a shared prefix (see `shared`): index scores per piece (one product
//! for every row's queries) and over the rows' own window, joined into the row's window; and
//! selected attention gathering each selected position from the piece or own window holding it.
use mlx_rs::{Array, Dtype};

use super::shared::{int, neg_inf};
use super::{Donor, MaskMode};
use crate::core::error::Result;
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;

impl Donor {
    /// `index_scores` over a shared prefix and the rows' own positions, `[B, Lq, window]`.
    pub(super) fn shared_index_scores(&self, q_index: &Array, weights: &Array, mode: MaskMode) -> Result<Array> {
        let s = q_index.shape();
        let (b, heads, lq, width) = (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize);
        let scores = |keys: &Array| Self::index_products(q_index, weights, &ops::astype(keys, Dtype::Float32)?);
        let masked = self.prefix_masked(mode, lq);
        let mut prefix = Vec::new();
        for (piece, start) in self.pieces() {
            // Our CUDA kernel where no query misses part of the prefix, else MLX's operations.
            if let Some(sc) = (!masked).then(|| self.kernel_piece_scores(piece, q_index, weights)).transpose()?.flatten() {
                prefix.push(sc);
                continue;
            }
            let mut sc = scores(&piece.decoded(Family::IndexKeys)?)?;
            if masked {
                sc = math::add(&sc, &ops::reshape(&self.piece_mask(start, piece.offset, lq)?, &[b, lq, piece.offset])?)?;
            }
            prefix.push(sc);
        }
        let prefix = math::concatenate(&prefix.iter().collect::<Vec<_>>(), -1)?;
        let own = match self.offset {
            0 => None,
            _ if let Some((sc, _)) = self.kernel_index_scores(q_index, weights, mode, (heads, lq, width), None)? => Some(sc),
            t => {
                let sc = scores(&self.decoded(Family::IndexKeys)?)?;
                Some(match self.masks(mode, lq) {
                    true => {
                        let mask = self.own_mask(mode, lq)?;
                        let rows = mask.shape()[2] as usize;
                        math::add(&sc, &ops::reshape(&mask, &[b, rows, t])?)?
                    }
                    false => sc,
                })
            }
        };
        self.to_window(&prefix, own.as_ref())
    }

    /// `attend_selected` over a shared prefix and the rows' own positions: each selected window
    /// position gathered from the piece or own window holding it (`k` positions a query).
    pub(super) fn shared_selected(
        &self,
        q_latent: &Array,
        q_rope: &Array,
        scale: f32,
        mode: MaskMode,
        indices: &Array,
    ) -> Result<Array> {
        let s = indices.shape();
        let (b, lq, k) = (s[0] as usize, s[1] as usize, s[2] as usize);
        let p = self.shared_positions() as i64;
        let flat = ops::reshape(indices, &[b, lq * k])?;
        let pads = int(&self.left_pad.iter().map(|&x| x as i64).collect::<Vec<_>>(), &[b, 1]);
        // Each selected position among the row's positions, counted from the prefix's first.
        let rel = math::subtract(&flat, &pads)?;
        let ge = |x: &Array, v: i64| math::greater_equal(x, &int(&[v], &[1]));
        let lt = |x: &Array, v: i64| math::less(x, &int(&[v], &[1]));
        let clip = |x: &Array, hi: i64| math::minimum(&ops::maximum(x, &int(&[0], &[1]))?, &int(&[hi], &[1]));
        let in_prefix = math::logical_and(&ge(&rel, 0)?, &lt(&rel, p)?)?;
        // Own window positions: the row's padding as it is, its own positions less the prefix's.
        let own_at = math::select(&lt(&rel, 0)?, &flat, &math::subtract(&flat, &int(&[p], &[1]))?)?;
        // Each family's stored parts at the selected positions, `[B, Lq * k, part_width]`.
        let gather_parts = |family: Family| -> Result<Vec<Array>> {
            let specs = self.parts(family).len();
            let mut out = Vec::with_capacity(specs);
            for i in 0..specs {
                let mut values: Option<Array> = None;
                for (piece, start) in self.pieces() {
                    let (len, part) = (piece.offset as i64, &piece.parts(family)[i]);
                    let local = clip(&math::subtract(&rel, &int(&[start as i64], &[1]))?, len - 1)?;
                    let taken = math::take(&ops::reshape(part, &[piece.offset, part.shape()[2] as usize])?, &local, 0)?;
                    let inside = math::logical_and(&ge(&rel, start as i64)?, &lt(&rel, start as i64 + len)?)?;
                    values = Some(match values {
                        Some(v) => math::select(&math::expand_dims(&inside, 2)?, &taken, &v)?,
                        None => taken,
                    });
                }
                let mut values = values.expect("a shared prefix has a piece");
                if self.offset > 0 {
                    let at = ops::reshape(&clip(&own_at, self.offset as i64 - 1)?, &[b, lq * k, 1])?;
                    let own = math::take_along_axis(&self.parts(family)[i], &at, 1)?;
                    values = math::select(&math::expand_dims(&in_prefix, 2)?, &values, &own)?;
                }
                out.push(values);
            }
            Ok(out)
        };
        let (latent_parts, rope_parts) = (gather_parts(Family::Latent)?, gather_parts(Family::Rope)?);
        // A decode step whose rows each hold k positions or more: every selected position is
        // one the query sees, so our kernel runs over them as over a window of k.
        let rows_hold_k = self.own_lengths().iter().all(|&n| n + self.shared_positions() >= k);
        if lq == 1 && rows_hold_k {
            let query = super::Query { q_latent, q_rope, scale, mode, extra: None, queries: 1 };
            if let Some(out) = self.kernel_gathered(&query, &latent_parts, &rope_parts[0], k)? {
                return Ok(out);
            }
        }
        let gather = |family: Family, parts: &[Array]| -> Result<Array> {
            let width = self.geometry.width(family).expect("present");
            ops::reshape(&self.decode_parts(family, parts)?, &[b, lq, k, width])
        };
        // Which selected positions each query sees: prefix ones up to its causal limit, own ones
        // in the row's own range (up to the query's position under `Causal`).
        let rel3 = ops::reshape(&rel, &[b, lq, k])?;
        let at3 = ops::reshape(&own_at, &[b, lq, k])?;
        let limits = ops::reshape(&self.causal_limits(lq), &[b, lq, 1])?;
        let prefix_seen = match mode {
            MaskMode::Causal => math::logical_and(&ops::reshape(&in_prefix, &[b, lq, k])?, &math::less_equal(&rel3, &limits)?)?,
            _ => ops::reshape(&in_prefix, &[b, lq, k])?,
        };
        let own_hi: Vec<i64> = match mode {
            MaskMode::Causal => {
                self.row_ends.iter().flat_map(|&e| (0..lq).map(move |i| e as i64 - lq as i64 + i as i64 + 1)).collect()
            }
            _ => self.row_ends.iter().flat_map(|&e| (0..lq).map(move |_| e as i64)).collect(),
        };
        let own_seen = math::logical_and(&ge(&rel3, p)?, &math::less(&at3, &int(&own_hi, &[b, lq, 1]))?)?;
        let seen = math::logical_or(&prefix_seen, &own_seen)?;
        let visible = math::expand_dims(&math::select(&seen, &ops::scalar(0.0), &neg_inf())?, 2)?;
        let (latent, rope) = (gather(Family::Latent, &latent_parts)?, gather(Family::Rope, &rope_parts)?);
        let out = self.attend_gathered(q_latent, q_rope, scale, &latent, &rope, Some(&visible))?;
        let sees = math::less(&neg_inf(), &math::max_keep(&visible, -1)?)?;
        // [B, Lq, 1, 1] -> [B, 1, Lq, 1] against the output's [B, H, Lq, r].
        math::select(&ops::reshape(&sees, &[b, 1, lq, 1])?, &out, &ops::scalar(0.0))
    }
}
