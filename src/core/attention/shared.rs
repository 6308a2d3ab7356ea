//! Attention over rows that read a shared prefix below their own positions (`cache::shared`):
//! each part is attended where it lies, the prefix once for every row's queries (its pieces have
//! one row, so the batch folds into the heads: `[1, B * H, Lq, w]` against `[1, len, w]`), the
//! rows' own window as `dense` attends it, and the parts joined by their log-sum-exp, which is
//! the softmax over the whole row. Nothing is copied: the pieces and the own buffers are read in
//! place. DSA's index scores are joined into the row's window (scores, not stored values);
//! selected attention gathers each selected position from the part holding it.
//!
//! The window is the rows as a cache holding copies lays them out: row `b` is `left_pad[b]`
//! padding, the prefix's `P` positions, then its own positions. Window position `j` of row `b`
//! is prefix position `j - left_pad[b]` when that lies in `[0, P)`, else own window position
//! `j - P` (its padding when `j < left_pad[b]`).
//!
//! These paths run MLX's operations on every platform (our kernels read one contiguous window).
//! This file holds the window's parts, their masks and dense attention; `shared_dsa` DSA's.
use mlx_rs::Array;

use super::{Donor, MaskMode, Query};
use crate::core::error::Result;
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Geometry;
use crate::core::storage::shared::Piece;

/// An attention's output and log-sum-exp over one part of the window.
type Partial = (Array, Array);

pub(super) fn neg_inf() -> Array {
    ops::scalar(f32::NEG_INFINITY)
}

/// `x[.., lo..hi]` along the last axis (a view).
fn last_axis(x: &Array, lo: usize, hi: usize) -> Result<Array> {
    let shape: Vec<usize> = x.shape().iter().map(|&d| d as usize).collect();
    let mut start = vec![0; shape.len()];
    let mut stop = shape.clone();
    *start.last_mut().expect("rank >= 1") = lo;
    *stop.last_mut().expect("rank >= 1") = hi;
    ops::slice(x, &start, &stop)
}

/// Row `b` of `x` (axis 0), kept as an axis of extent 1 (a view; `x` itself when it has one row).
fn row(x: &Array, b: usize) -> Result<Array> {
    match x.shape()[0] {
        1 => Ok(x.clone()),
        _ => ops::rows(x, b, b + 1),
    }
}

pub(super) fn int(values: &[i64], shape: &[usize]) -> Array {
    ops::indices(&values.iter().map(|&v| v as i32).collect::<Vec<_>>(), shape)
}

impl Donor {
    /// One piece of a shared prefix as a single-row donor spanning its positions.
    pub(super) fn piece(geometry: Geometry, piece: &Piece) -> Donor {
        Donor {
            geometry,
            offset: piece.len,
            left_pad: vec![0],
            row_ends: vec![piece.len],
            parts: piece.parts.clone(),
            hot: None,
            alignment: Default::default(),
            shared: None,
            runs: Vec::new(),
        }
    }

    /// Positions of the shared prefix below the rows (0 without one).
    pub(super) fn shared_positions(&self) -> usize {
        self.shared.as_ref().map_or(0, |pieces| pieces.iter().map(|p| p.offset).sum())
    }

    /// The prefix's pieces with the prefix position each starts at.
    pub(super) fn pieces(&self) -> Vec<(&Donor, usize)> {
        let mut start = 0;
        let mut out = Vec::new();
        for piece in self.shared.as_deref().unwrap_or(&[]) {
            out.push((piece, start));
            start += piece.offset;
        }
        out
    }

    pub(super) fn own_lengths(&self) -> Vec<usize> {
        self.left_pad.iter().zip(&self.row_ends).map(|(p, e)| e - p).collect()
    }

    /// Whether a causal query misses part of the prefix: a row holding fewer than `Lq - 1` own
    /// positions (its first queries are prefix positions).
    pub(super) fn prefix_masked(&self, mode: MaskMode, queries: usize) -> bool {
        mode == MaskMode::Causal && self.own_lengths().iter().any(|&n| n + 1 < queries)
    }

    /// `[B, 1, Lq, 1]`: the last of the row's positions (counted from the prefix's first) that
    /// causal query `i` sees, `P + own - Lq + i` (negative: none).
    pub(super) fn causal_limits(&self, queries: usize) -> Array {
        let p = self.shared_positions() as i64;
        let limits: Vec<i64> = self
            .own_lengths()
            .iter()
            .flat_map(|&n| (0..queries).map(move |i| p + n as i64 - queries as i64 + i as i64))
            .collect();
        int(&limits, &[self.batch_size(), 1, queries, 1])
    }

    /// Additive mask `[B, 1, Lq, len]` of the prefix positions `[start, start + len)` under
    /// `Causal` (see `causal_limits`).
    pub(super) fn piece_mask(&self, start: usize, len: usize, queries: usize) -> Result<Array> {
        let positions = math::add(&ops::reshape(&math::arange(len)?, &[1, 1, 1, len])?, &int(&[start as i64], &[1]))?;
        let visible = math::less_equal(&positions, &self.causal_limits(queries))?;
        math::select(&visible, &ops::scalar(0.0), &neg_inf())
    }

    /// Additive mask `[B, 1, 1 or Lq, T]` of the rows' own window: each row's own positions,
    /// under `Causal` those up to the query's own (signed: a query may see none of them).
    pub(super) fn own_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let batch = self.batch_size();
        let positions = ops::reshape(&math::arange(self.offset)?, &[1, 1, 1, self.offset])?;
        let lo = int(&self.left_pad.iter().map(|&p| p as i64).collect::<Vec<_>>(), &[batch, 1, 1, 1]);
        let hi = match mode {
            MaskMode::Causal => {
                let hi: Vec<i64> = self
                    .row_ends
                    .iter()
                    .flat_map(|&e| (0..queries).map(move |i| e as i64 - queries as i64 + i as i64 + 1))
                    .collect();
                int(&hi, &[batch, 1, queries, 1])
            }
            _ => int(&self.row_ends.iter().map(|&e| e as i64).collect::<Vec<_>>(), &[batch, 1, 1, 1]),
        };
        let visible = math::logical_and(&math::greater_equal(&positions, &lo)?, &math::less(&positions, &hi)?)?;
        math::select(&visible, &ops::scalar(0.0), &neg_inf())
    }

    /// Softmax probabilities of `scores` (float32, last axis) and their log-sum-exp; where a
    /// query sees nothing, zeros and -inf (never NaN).
    fn normalized(scores: &Array) -> Result<Partial> {
        let lse = math::logsumexp_keep(scores, -1)?;
        let safe = math::select(&math::less(&neg_inf(), &lse)?, &lse, &ops::scalar(0.0))?;
        Ok((math::exp(&math::subtract(scores, &safe)?)?, lse))
    }

    /// Partials joined by their log-sum-exp: `sum_i exp(lse_i - m) out_i / sum_i exp(lse_i - m)`,
    /// zeros where no part saw a position.
    fn join_partials(parts: Vec<Partial>) -> Result<Array> {
        let mut m = parts[0].1.clone();
        for (_, lse) in &parts[1..] {
            m = ops::maximum(&m, lse)?;
        }
        let sees = math::less(&neg_inf(), &m)?;
        let m = math::select(&sees, &m, &ops::scalar(0.0))?;
        let (mut num, mut den): (Option<Array>, Option<Array>) = (None, None);
        for (out, lse) in &parts {
            let w = math::exp(&math::subtract(lse, &m)?)?;
            let term = ops::multiply(out, &w)?;
            num = Some(match num {
                Some(n) => math::add(&n, &term)?,
                None => term,
            });
            den = Some(match den {
                Some(d) => math::add(&d, &w)?,
                None => w,
            });
        }
        let out = ops::divide(&num.expect("one part at least"), &den.expect("one part at least"))?;
        math::select(&sees, &out, &ops::scalar(0.0))
    }

    /// Row `b` of the window from its prefix part `base[b]` (`[.., P]`) and its own window
    /// `own[b]` (`[.., T]`): `[own[.., :pad], base, own[.., pad:]]` along the last axis, every
    /// row at once where their padding is equal. `base` may have one row for all.
    pub(super) fn to_window(&self, base: &Array, own: Option<&Array>) -> Result<Array> {
        let Some(own) = own else { return Ok(base.clone()) };
        let join = |base: &Array, own: &Array, pad: usize| -> Result<Array> {
            let mut parts = Vec::new();
            if pad > 0 {
                parts.push(last_axis(own, 0, pad)?);
            }
            parts.push(base.clone());
            if self.offset > pad {
                parts.push(last_axis(own, pad, self.offset)?);
            }
            math::concatenate(&parts.iter().collect::<Vec<_>>(), -1)
        };
        let pads = &self.left_pad;
        if pads.iter().all(|&p| p == pads[0]) {
            let base = match base.shape()[0] as usize == own.shape()[0] as usize {
                true => base.clone(),
                false => math::add(base, &ops::zeros(&own_batch(own), base.dtype())?)?,
            };
            return join(&base, own, pads[0]);
        }
        let rows = (0..self.batch_size()).map(|b| join(&row(base, b)?, &row(own, b)?, pads[b])).collect::<Result<Vec<_>>>()?;
        math::concatenate(&rows.iter().collect::<Vec<_>>(), 0)
    }

    /// `x` (broadcastable to `[B, H, Lq, window]`) over each piece and over the own window; a
    /// mask of extent 1 on the last axis applies to every part as it is.
    fn split_window(&self, x: &Array) -> Result<(Vec<Array>, Option<Array>)> {
        let mut shape: Vec<usize> = x.shape().iter().map(|&d| d as usize).collect();
        while shape.len() < 4 {
            shape.insert(0, 1);
        }
        let x = ops::reshape(x, &shape)?;
        if shape[3] == 1 {
            return Ok((self.pieces().iter().map(|_| x.clone()).collect(), (self.offset > 0).then(|| x.clone())));
        }
        let pads = &self.left_pad;
        let x = match pads.iter().all(|&p| p == pads[0]) || shape[0] != 1 {
            true => x,
            false => math::add(&x, &ops::zeros(&[self.batch_size(), 1, 1, 1], x.dtype())?)?,
        };
        let cut = |b: Option<usize>| -> Result<(Vec<Array>, Option<Array>)> {
            let (x, pad) = match b {
                Some(b) => (row(&x, b)?, pads[b]),
                None => (x.clone(), pads[0]),
            };
            let pieces = self
                .pieces()
                .iter()
                .map(|(p, start)| last_axis(&x, pad + start, pad + start + p.offset))
                .collect::<Result<_>>()?;
            let p = self.shared_positions();
            let own = match self.offset {
                0 => None,
                t => {
                    let mut parts = Vec::new();
                    if pad > 0 {
                        parts.push(last_axis(&x, 0, pad)?);
                    }
                    if t > pad {
                        parts.push(last_axis(&x, pad + p, t + p)?);
                    }
                    Some(math::concatenate(&parts.iter().collect::<Vec<_>>(), -1)?)
                }
            };
            Ok((pieces, own))
        };
        if pads.iter().all(|&p| p == pads[0]) {
            return cut(None);
        }
        let rows = (0..self.batch_size()).map(|b| cut(Some(b))).collect::<Result<Vec<_>>>()?;
        let cat = |parts: Vec<&Array>| math::concatenate(&parts, 0);
        let pieces = (0..self.pieces().len()).map(|i| cat(rows.iter().map(|r| &r.0[i]).collect())).collect::<Result<_>>()?;
        let own = match self.offset {
            0 => None,
            _ => Some(cat(rows.iter().map(|r| r.1.as_ref().expect("own part")).collect())?),
        };
        Ok((pieces, own))
    }

    /// `attend` over a shared prefix and the rows' own positions (see the module doc).
    pub(super) fn shared_attend(&self, q: &Query) -> Result<Array> {
        if let Some(out) = self.kernel_shared(q, &self.pieces())? {
            return Ok(out);
        }
        let (pieces_extra, own_extra) = match q.extra {
            Some(extra) => {
                let (pieces, own) = self.split_window(extra)?;
                (pieces.into_iter().map(Some).collect(), own)
            }
            None => (vec![None; self.pieces().len()], None),
        };
        let mut parts = Vec::new();
        for ((piece, start), extra) in self.pieces().into_iter().zip(pieces_extra) {
            parts.push(self.piece_partial(piece, start, q, extra.as_ref())?);
        }
        if self.offset > 0 {
            parts.push(self.own_partial(q, own_extra.as_ref())?);
        }
        Self::join_partials(parts)
    }

    /// The rows' queries against one piece, as one product for every row and head.
    fn piece_partial(&self, piece: &Donor, start: usize, q: &Query, extra: Option<&Array>) -> Result<Partial> {
        let s = q.q_latent.shape();
        let (b, h, lq) = (s[0] as usize, s[1] as usize, s[2] as usize);
        let fold = |x: &Array| ops::reshape(x, &[1, b * h, lq, x.shape()[3] as usize]);
        let len = piece.offset;
        let scores = piece.scaled_scores(&fold(q.q_latent)?, &fold(q.q_rope)?, q.scale)?;
        let mut scores = ops::reshape(&scores, &[b, h, lq, len])?;
        if self.prefix_masked(q.mode, lq) {
            scores = math::add(&scores, &self.piece_mask(start, len, lq)?)?;
        }
        if let Some(extra) = extra {
            scores = math::add(&scores, extra)?;
        }
        let (probs, lse) = Self::normalized(&scores)?;
        let out = piece.weighted_latent(&ops::reshape(&probs, &[1, b * h, lq, len])?, q.q_latent.dtype())?;
        Ok((ops::reshape(&out, &[b, h, lq, self.geometry.kv_lora_rank])?, lse))
    }

    /// The rows' queries against their own window.
    fn own_partial(&self, q: &Query, extra: Option<&Array>) -> Result<Partial> {
        let mut scores = self.scaled_scores(q.q_latent, q.q_rope, q.scale)?;
        if self.masks(q.mode, q.queries) {
            scores = math::add(&scores, &self.own_mask(q.mode, q.queries)?)?;
        }
        if let Some(extra) = extra {
            scores = math::add(&scores, extra)?;
        }
        let (probs, lse) = Self::normalized(&scores)?;
        Ok((self.weighted_latent(&probs, q.q_latent.dtype())?, lse))
    }
}

/// `[B, 1, ...]` zeros' shape that broadcasts a one-row array to `own`'s rows.
fn own_batch(own: &Array) -> Vec<usize> {
    let mut shape = vec![1; own.shape().len()];
    shape[0] = own.shape()[0] as usize;
    shape
}
