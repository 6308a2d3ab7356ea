//! What segments (`persist::segment`) need of one cache: a row's positions as stored (views;
//! over a shared prefix, its pieces' too),
//! a composed row's hot side, an append of positions already encoded (a segment's parts,
//! written as they are, never re-encoded), and the chain mark (`ChainMark`) a save or a restore
//! leaves.
use mlx_rs::Array;

use super::{ChainMark, Change, LatentCache};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::{math, ops};
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;

impl LatentCache {
    /// A composed one-row cache's hot row now: its boundary, its base and its length.
    pub fn hot_row_now(&self) -> (usize, usize, usize) {
        let hot = self.hot.as_ref().expect("composed caches have a hot side");
        (hot.converted.first().copied().unwrap_or(0), hot.bases.first().copied().unwrap_or(0), hot.capacity())
    }

    /// A composed one-row cache's hot values of `family`, `[1, capacity, width]` (a view).
    pub fn hot_values(&self, family: Family) -> Result<Array> {
        let hot = self.hot.as_ref().expect("composed caches have a hot side");
        hot.storage.window_in(None, family, (0, 1), 0, hot.capacity())
    }

    /// Views of one family's stored parts for row `row`'s positions `[from, to)` (counted from
    /// the row's first position): `[1, to - from, part_width]` each, as stored. Over a shared
    /// prefix, positions of the prefix come from its pieces: views where the range lies in one
    /// piece or in the row's own positions, else the parts joined (a copy of `to - from`
    /// positions).
    pub fn stored_row_parts(&self, family: Family, row: usize, from: usize, to: usize) -> Result<Vec<Array>> {
        self.width(family)?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        let len = self.row_offsets()[row];
        if from >= to || to > len {
            return fail!(OutOfRange, "positions [{from}, {to}) of row {row}, which holds {len}");
        }
        let (pad, shared) = (self.layout.left_pad()[row], self.shared_positions());
        let Some(base) = self.base.as_ref().filter(|_| from < shared) else {
            return self.storage.stored_row_parts(family, row, pad + from - shared, pad + to - shared);
        };
        // Each part's pieces of the range, in order: the prefix's pieces, then the row's own.
        let mut chunks: Vec<Vec<Array>> = Vec::new();
        let mut start = 0;
        for piece in base.pieces() {
            let (lo, hi) = (from.max(start), to.min(start + piece.len));
            if lo < hi {
                let parts = piece.parts.get(family).expect("present");
                let views = parts.iter().map(|p| ops::slice(p, &[0, lo - start, 0], &[1, hi - start, p.shape()[2] as usize]));
                chunks.push(views.collect::<Result<Vec<_>>>()?);
            }
            start += piece.len;
        }
        if to > shared {
            chunks.push(self.storage.stored_row_parts(family, row, pad, pad + to - shared)?);
        }
        if chunks.len() == 1 {
            return Ok(chunks.pop().expect("one chunk"));
        }
        (0..chunks[0].len()).map(|k| math::concatenate(&chunks.iter().map(|c| &c[k]).collect::<Vec<_>>(), 1)).collect()
    }

    /// Prepares the append of `tokens` positions given as stored parts (`[1, tokens,
    /// part_width]` per family, this cache's modes and dtypes, checked by the caller) to a cache
    /// of one row, or to an empty one. Refused inside a round, a prefill or maintenance. A
    /// composed cache's hot side is left as it is: the caller adopts the segment's after
    /// applying (`adopt_hot`).
    pub fn prepare_append_stored(&self, parts: Families<Vec<Array>>, tokens: usize) -> Result<Change> {
        self.check_saveable()?;
        if self.batch_size() > 1 {
            return fail!(State, "the cache holds {} rows; segments extend a cache of one row", self.batch_size());
        }
        self.layout.check_append(1, tokens, self.own_max_tokens())?;
        let starts = self.layout.append_starts(1);
        let limits = (self.own_max_tokens(), self.reserved);
        let pending = self.storage.prepare_append_encoded(parts, 1, self.layout.offset(), &starts, tokens, limits)?;
        let mut after = self.layout.clone();
        after.append(1, tokens);
        Ok(Change { pending: Some(pending), ..self.relabel(after) })
    }

    /// Records that row `row`'s first `positions` positions are the chain of digest `digest`
    /// (the other rows' marks stay). Positions within the shared prefix are every row's: the
    /// rows that know no chain take it too (a prompt saved after its fork is still saved once).
    pub fn mark_chain(&mut self, digest: u64, row: usize, positions: usize) {
        let rows = self.batch_size();
        self.chains.resize(rows, None);
        let shared = positions <= self.shared_positions();
        for r in 0..rows {
            if r == row || (shared && self.chains[r].is_none()) {
                let left_pad = self.left_pad()[r];
                self.chains[r] = Some(ChainMark { digest, positions, row: r, left_pad });
            }
        }
    }

    /// Each new row of `layout` (a fork's or an attach's) marked as holding `parent`'s chain
    /// (its digest and positions), or none where the parent's chain is not known.
    pub(crate) fn inherited_chains(parent: Option<(u64, usize)>, layout: &RowLayout) -> Vec<Option<ChainMark>> {
        let Some((digest, positions)) = parent else {
            return Vec::new();
        };
        let mark = |(row, &left_pad): (usize, &usize)| Some(ChainMark { digest, positions, row, left_pad });
        layout.left_pad().iter().enumerate().map(mark).collect()
    }
}
