//! Speculative rounds and batch row operations on `LatentCache`: rollback (equal drops move the
//! offset; unequal drops move ragged row ends, or shift right-justified rows in place), filter,
//! extract and merge. Every rebuild assembles new storage from row pieces, evaluated during the
//! call, and is committed only once it exists.
use super::cache::LatentCache;
use super::error::{fail, Result};
use super::layout::{Relayout, Rollback, RowLayout};
use super::storage::{RowPiece, Storage, MIN_CAPACITY};

impl LatentCache {
    /// Records every row's position count; appends and reads then behave as usual.
    pub fn spec_round_begin(&mut self) -> Result<()> {
        self.layout.begin_round()
    }

    /// Keeps everything appended in the round.
    pub fn spec_round_commit(&mut self) -> Result<()> {
        self.layout.commit_round()
    }

    /// Row `b` keeps the first `keep[b]` positions it appended in the round. Equal drops move the
    /// offset; unequal drops shift rows so they stay right-justified (kept values are exact).
    pub fn spec_round_rollback(&mut self, keep: &[usize]) -> Result<()> {
        match self.layout.plan_rollback(keep)? {
            Rollback::Trim(n) => {
                self.layout.trim(n);
                self.layout.finish_rollback();
            }
            Rollback::Ends(layout) => self.layout.adopt(layout),
            Rollback::Relayout(plan) => self.apply_relayout(&plan)?,
        }
        Ok(())
    }

    /// Rollback with one keep count for every row.
    pub fn spec_round_rollback_all(&mut self, keep: usize) -> Result<()> {
        if self.batch_size() == 0 && keep > 0 && self.in_spec_round() {
            return fail!(OutOfRange, "the round appended nothing; cannot keep {keep}");
        }
        self.spec_round_rollback(&vec![keep; self.batch_size()])
    }

    fn apply_relayout(&mut self, plan: &Relayout) -> Result<()> {
        let new = &plan.layout;
        let pieces: Vec<RowPiece<'_>> = (0..plan.rows.len())
            .map(|b| {
                let lo = new.left_pad()[b];
                let at = |pos: usize| (pos as isize + plan.shift[b]) as usize;
                let hi = new.row_ends()[b];
                RowPiece { source: &self.storage, row: plan.rows[b], lo: at(lo), hi: at(hi), dest_row: b, dest_lo: lo }
            })
            .collect();
        let same_rows = plan.rows.iter().enumerate().all(|(b, &row)| b == row) && plan.rows.len() == self.batch_size();
        let pending = if same_rows && new.offset() <= self.storage.capacity() {
            // A rollback: only the rows that shift move, in place, and only their positions.
            let moving: Vec<RowPiece<'_>> = pieces.into_iter().filter(|p| p.lo != p.dest_lo && p.hi > p.lo).collect();
            self.storage.prepare_move(&moving)?
        } else {
            let capacity = self.storage.capacity().max(new.offset());
            self.storage.prepare_assemble(plan.rows.len(), capacity, &pieces)?
        };
        self.storage.commit(pending);
        self.layout.adopt(plan.layout.clone());
        Ok(())
    }

    /// Keeps rows `rows` in that order and drops the padding no kept row needs.
    pub fn filter_rows(&mut self, rows: &[usize]) -> Result<()> {
        let plan = self.layout.plan_filter(rows)?;
        self.apply_relayout(&plan)
    }

    /// A new single-row cache holding exactly row `row`'s valid positions.
    pub fn extract_row(&self, row: usize) -> Result<LatentCache> {
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        let mut out = LatentCache::new(self.geometry)?;
        let (lo, hi) = (self.layout.left_pad()[row], self.layout.row_ends()[row]);
        out.fill_from(&[(&self.storage, row, lo, hi)], &[hi - lo])?;
        Ok(out)
    }

    /// Fills this empty cache from `(source, row, lo, hi)` pieces, one per new row, with the
    /// given row lengths (laid out as this cache's layout rebuilds rows). Room for the
    /// reservation, or for one growth step.
    fn fill_from(&mut self, rows: &[(&Storage, usize, usize, usize)], lengths: &[usize]) -> Result<()> {
        let layout = RowLayout::packed(self.layout.kind(), lengths);
        let mut capacity = (layout.offset() + MIN_CAPACITY).max(self.reserved);
        if self.geometry.max_tokens != 0 {
            capacity = capacity.min(self.geometry.max_tokens).max(layout.offset());
        }
        let pieces: Vec<RowPiece<'_>> = rows
            .iter()
            .enumerate()
            .map(|(b, &(source, row, lo, hi))| RowPiece { source, row, lo, hi, dest_row: b, dest_lo: layout.left_pad()[b] })
            .collect();
        let pending = self.storage.prepare_assemble(rows.len(), capacity, &pieces)?;
        self.storage.commit(pending);
        self.layout.adopt(layout);
        Ok(())
    }

    /// Fills this empty cache with every row of every source, in order, right-justified to the
    /// longest. A source without rows contributes one empty row. Sources are not changed.
    pub fn merge_rows(&mut self, sources: &[&LatentCache]) -> Result<()> {
        if sources.is_empty() {
            return fail!(InvalidArgument, "merge needs at least one source");
        }
        if self.batch_size() != 0 || self.in_spec_round() {
            return fail!(State, "the merge destination must be empty and outside a round");
        }
        let mut rows = Vec::new();
        let mut lengths = Vec::new();
        for (i, source) in sources.iter().enumerate() {
            // Geometry, limit, storage, layout and role: not only the signature string.
            if source.geometry != self.geometry {
                return fail!(
                    InvalidArgument,
                    "source {i} is {} but the destination is {}",
                    source.geometry.describe(),
                    self.geometry.describe()
                );
            }
            if source.batch_size() == 0 {
                rows.push((&source.storage, 0, 0, 0));
                lengths.push(0);
            }
            for (row, (&pad, &end)) in source.left_pad().iter().zip(source.row_ends()).enumerate() {
                rows.push((&source.storage, row, pad, end));
                lengths.push(end - pad);
            }
        }
        let longest = lengths.iter().copied().max().unwrap_or(0);
        if self.geometry.max_tokens != 0 && longest > self.geometry.max_tokens {
            return fail!(Capacity, "a merged row of {longest} positions exceeds max_tokens ({})", self.geometry.max_tokens);
        }
        self.fill_from(&rows, &lengths)
    }
}
