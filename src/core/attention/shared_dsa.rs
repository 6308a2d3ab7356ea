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
        let q = ops::astype(q_index, Dtype::Float32)?;
        let weights = math::expand_dims(&math::swapaxes(&ops::astype(weights, Dtype::Float32)?, 1, 2)?, 3)?;
        // keys `[1 or B, T, w]`: a piece's one row serves every row's queries, folded into one product.
        let scores = |keys: &Array| -> Result<Array> {
            let t = keys.shape()[1] as usize;
            let q = match keys.shape()[0] {
                1 => ops::reshape(&q, &[1, b * heads * lq, width])?,
                _ => ops::reshape(&q, &[b, heads * lq, width])?,
            };
            let per_head = ops::maximum(&math::matmul(&q, &math::swapaxes(keys, -1, -2)?)?, &ops::scalar(0.0))?;
            math::sum(&ops::multiply(&ops::reshape(&per_head, &[b, heads, lq, t])?, &weights)?, 1)
        };
        let mut prefix = Vec::new();
        for (piece, start) in self.pieces() {
            let mut sc = scores(&ops::astype(&piece.decoded(Family::IndexKeys)?, Dtype::Float32)?)?;
            if self.prefix_masked(mode, lq) {
                sc = math::add(&sc, &ops::reshape(&self.piece_mask(start, piece.offset, lq)?, &[b, lq, piece.offset])?)?;
            }
            prefix.push(sc);
        }
        let prefix = math::concatenate(&prefix.iter().collect::<Vec<_>>(), -1)?;
        let own = match self.offset {
            0 => None,
            t => {
                let sc = scores(&ops::astype(&self.decoded(Family::IndexKeys)?, Dtype::Float32)?)?;
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
        let gather = |family: Family| -> Result<Array> {
            let mut values: Option<Array> = None;
            for (piece, start) in self.pieces() {
                let len = piece.offset as i64;
                let local = clip(&math::subtract(&rel, &int(&[start as i64], &[1]))?, len - 1)?;
                let parts = piece
                    .parts(family)
                    .iter()
                    .map(|part| math::take(&ops::reshape(part, &[piece.offset, part.shape()[2] as usize])?, &local, 0))
                    .collect::<Result<Vec<_>>>()?;
                let decoded = piece.decode_parts(family, &parts)?;
                let inside = math::logical_and(&ge(&rel, start as i64)?, &lt(&rel, start as i64 + len)?)?;
                values = Some(match values {
                    Some(v) => math::select(&math::expand_dims(&inside, 2)?, &decoded, &v)?,
                    None => decoded,
                });
            }
            let mut values = values.expect("a shared prefix has a piece");
            if self.offset > 0 {
                let at = ops::reshape(&clip(&own_at, self.offset as i64 - 1)?, &[b, lq * k, 1])?;
                let parts =
                    self.parts(family).iter().map(|part| math::take_along_axis(part, &at, 1)).collect::<Result<Vec<_>>>()?;
                let own = self.decode_parts(family, &parts)?;
                values = math::select(&math::expand_dims(&in_prefix, 2)?, &values, &own)?;
            }
            let width = self.geometry.width(family).expect("present");
            ops::reshape(&values, &[b, lq, k, width])
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
        let out =
            self.attend_gathered(q_latent, q_rope, scale, &gather(Family::Latent)?, &gather(Family::Rope)?, Some(&visible))?;
        let sees = math::less(&neg_inf(), &math::max_keep(&visible, -1)?)?;
        // [B, Lq, 1, 1] -> [B, 1, Lq, 1] against the output's [B, H, Lq, r].
        math::select(&ops::reshape(&sees, &[b, 1, lq, 1])?, &out, &ops::scalar(0.0))
    }
}
