//! Speculative rounds and batch row operations on `LatentCache`: rollback (equal drops move the
//! offset; unequal drops move ragged row ends, or shift right-justified rows in place), filter,
//! extract and merge. Every rebuild assembles new storage from row pieces, evaluated during the
//! call, and is committed only once it exists.
use super::{Change, LatentCache, RowMove};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::{Relayout, Rollback, RowLayout};
use crate::core::layout::slots::Placement;
use crate::core::storage::buffers::RowPiece;
use crate::core::storage::shared::SharedPrefix;

impl LatentCache {
    /// A change that keeps storage and sets the layout to `layout`.
    pub(crate) fn relabel(&self, layout: RowLayout) -> Change {
        let (reserved, prefill, maintaining) = (self.reserved, self.prefill.clone(), self.maintaining);
        Change {
            layout,
            pending: None,
            reserved,
            prefill,
            hot: None,
            maintaining,
            moves_rows: false,
            chains: None,
            rebase: None,
            slots: None,
        }
    }

    /// Applies a prepared change.
    pub fn apply(&mut self, change: Change) {
        if let Some(base) = change.rebase {
            // The rows' own buffers go; the slots reserved for the batch stay (`reserve_rows`).
            let slots = self.storage.slots();
            self.storage.clear();
            self.storage.set_slots(slots);
            self.base = base;
        }
        if let Some(pending) = change.pending {
            self.storage.commit(pending);
        }
        if let Some(slots) = change.slots {
            self.storage.set_slots(slots);
        }
        if let (Some(hot), Some(change)) = (&mut self.hot, change.hot) {
            hot.apply(change);
        }
        self.layout = change.layout;
        self.reserved = change.reserved;
        self.prefill = change.prefill;
        self.maintaining = change.maintaining;
        self.settle();
        if let Some(chains) = change.chains {
            self.chains = chains;
        }
        self.keep_chain(change.moves_rows);
    }

    /// Records every row's position count; appends and reads then behave as usual.
    pub fn spec_round_begin(&mut self) -> Result<()> {
        let change = self.prepare_round_begin()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_round_begin(&self) -> Result<Change> {
        if self.in_prefill() {
            return fail!(State, "a speculative round cannot begin inside a prefill (call prefill_finalize first)");
        }
        let mut layout = self.layout.clone();
        layout.begin_round()?;
        Ok(self.relabel(layout))
    }

    /// Keeps everything appended in the round.
    pub fn spec_round_commit(&mut self) -> Result<()> {
        let change = self.prepare_round_commit()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_round_commit(&self) -> Result<Change> {
        let mut layout = self.layout.clone();
        layout.commit_round()?;
        Ok(self.relabel(layout))
    }

    /// Row `b` keeps the first `keep[b]` positions it appended in the round. Equal drops move the
    /// offset; unequal drops move ragged row ends, or shift right-justified rows in place (kept
    /// values are exact).
    pub fn spec_round_rollback(&mut self, keep: &[usize]) -> Result<()> {
        let change = self.prepare_rollback(keep)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_rollback(&self, keep: &[usize]) -> Result<Change> {
        self.prepare_plan(self.layout.plan_rollback(keep)?)
    }

    pub(crate) fn prepare_plan(&self, plan: Rollback) -> Result<Change> {
        match plan {
            Rollback::Trim(n) => {
                let mut layout = self.layout.clone();
                layout.trim(n);
                layout.finish_rollback();
                Ok(self.relabel(layout))
            }
            Rollback::Ends(layout) => Ok(self.relabel(layout)),
            Rollback::Relayout(plan) => self.prepare_relayout(&plan),
        }
    }

    /// Rollback with one keep count for every row.
    pub fn spec_round_rollback_all(&mut self, keep: usize) -> Result<()> {
        let change = self.prepare_rollback_all(keep)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_rollback_all(&self, keep: usize) -> Result<Change> {
        if self.batch_size() == 0 && keep > 0 && self.in_spec_round() {
            return fail!(OutOfRange, "the round appended nothing; cannot keep {keep}");
        }
        self.prepare_rollback(&vec![keep; self.batch_size()])
    }

    /// Drops the last `n` positions of every row (see `trim`), as a change.
    pub fn prepare_trim(&self, n: usize, bypass: bool) -> Result<Change> {
        // Outside a round, a trim into the shared prefix is named as such (OUT_OF_RANGE) before
        // the rows' bound; inside one the round's rule comes first (INVALID_STATE) and, as what
        // the round appended lies above the prefix, keeps the trim above it.
        if !self.in_spec_round() {
            self.check_above_prefix(n)?;
        }
        self.layout.check_trim(n, bypass)?;
        self.check_composed_trim(n, bypass)?;
        let mut layout = self.layout.clone();
        layout.trim(n);
        Ok(self.relabel(layout))
    }

    fn prepare_relayout(&self, plan: &Relayout) -> Result<Change> {
        let new = &plan.layout;
        let pieces: Vec<RowPiece<'_>> = (0..plan.rows.len())
            .map(|b| {
                let lo = new.left_pad()[b];
                let at = |pos: usize| (pos as isize + plan.shift[b]) as usize;
                let hi = new.row_ends()[b];
                RowPiece { source: &self.storage, row: plan.rows[b], lo: at(lo), hi: at(hi), dest_row: b, dest_lo: lo }
            })
            .collect();
        let moves: Vec<RowMove<'_>> = pieces
            .iter()
            .map(|p| RowMove { source: self, row: p.row, lo: p.lo, hi: p.hi, dest_row: p.dest_row, dest_lo: p.dest_lo })
            .collect();
        if let Some(change) = self.prepare_slots_in_place(plan, &pieces, &moves)? {
            return Ok(change);
        }
        let same_rows = plan.rows.iter().enumerate().all(|(b, &row)| b == row) && plan.rows.len() == self.batch_size();
        let in_place = same_rows && new.offset() <= self.storage.capacity();
        let hot = self.prepare_hot_rows(&moves, new, self.kept_converted(&plan.rows), in_place)?;
        let pending = if in_place {
            // A rollback: only the rows that shift move, in place, and only their positions.
            let moving: Vec<RowPiece<'_>> = pieces.into_iter().filter(|p| p.lo != p.dest_lo && p.hi > p.lo).collect();
            if moving.is_empty() {
                // Nothing moves (rows over a shared prefix may hold no positions of their own yet).
                let mut layout = plan.layout.clone();
                layout.finish_rollback();
                return Ok(Change { hot, ..self.relabel(layout) });
            }
            let frame = self.storage.frame();
            self.storage.prepare_move(&moving, frame.placement, frame.start)?
        } else {
            let capacity = self.storage.capacity().max(new.offset());
            self.storage.prepare_assemble(plan.rows.len(), self.storage.slots(), capacity, &pieces)?
        };
        let mut layout = plan.layout.clone();
        layout.finish_rollback();
        Ok(Change { pending: Some(pending), hot, ..self.relabel(layout) })
    }

    /// A relayout in which every kept row shifts by the same count (a filter, whose kept rows
    /// drop the padding none of them needs), done in place: position 0 moves by that count and
    /// every kept row stays in its slot, whatever rows left and in whatever order the rest are
    /// kept (`layout::slots`); a dropped row's slot stays for a row to join. Where that would
    /// leave the rows in more runs than attention reads, they are gathered into one run, moving
    /// the fewest positions (only rows that change slots are written, at the same positions of
    /// their new slot). Composed storage's hot side (each row's newest positions, about a
    /// window's worth) is rebuilt from `moves`. `None` where rows shift by different counts.
    fn prepare_slots_in_place(&self, plan: &Relayout, pieces: &[RowPiece<'_>], moves: &[RowMove<'_>]) -> Result<Option<Change>> {
        let shift = plan.shift.first().copied().unwrap_or(0);
        let uniform = shift >= 0 && plan.shift.iter().all(|&s| s == shift);
        if !uniform || self.storage.is_empty() {
            return Ok(None);
        }
        let frame = self.storage.frame();
        let placement = frame.placement.kept(&plan.rows).unwrap_or_else(|| {
            let now: Vec<Option<usize>> = plan.rows.iter().map(|&r| Some(frame.placement.slot(r))).collect();
            Placement::gather(&now, frame.slots, |b| pieces[b].hi - pieces[b].lo)
        });
        let moving: Vec<RowPiece<'_>> =
            pieces.iter().filter(|p| p.hi > p.lo && frame.placement.slot(p.row) != placement.slot(p.dest_row)).copied().collect();
        let hot = self.prepare_hot_rows(moves, &plan.layout, self.kept_converted(&plan.rows), false)?;
        let pending = self.storage.prepare_move(&moving, placement, frame.start + shift as usize)?;
        let mut layout = plan.layout.clone();
        layout.finish_rollback();
        Ok(Some(Change { pending: Some(pending), hot, ..self.relabel(layout) }))
    }

    /// The compact positions of rows `rows` (in that order), as a row rebuild keeps them.
    fn kept_converted(&self, rows: &[usize]) -> Vec<usize> {
        let converted = self.converted_positions();
        rows.iter().map(|&r| converted.get(r).copied().unwrap_or(0)).collect()
    }

    /// Keeps rows `rows` in that order and drops the padding no kept row needs.
    pub fn filter_rows(&mut self, rows: &[usize]) -> Result<()> {
        let change = self.prepare_filter(rows)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_filter(&self, rows: &[usize]) -> Result<Change> {
        let plan = self.layout.plan_filter(rows)?;
        let mut change = self.prepare_relayout(&plan)?;
        change.prefill = self.prefill.as_ref().map(|p| p.keep_rows(rows));
        // Rows may change places without changing their count or padding.
        change.moves_rows = true;
        Ok(change)
    }

    /// Makes room for `tokens` positions per row now (see `reserve`), as a change.
    /// With a shared prefix, `tokens` counts it: the rows' own buffers take the rest.
    pub fn prepare_reserve(&self, tokens: usize) -> Result<Change> {
        let max = self.geometry.max_tokens;
        if tokens > i32::MAX as usize || (max != 0 && tokens > max) {
            return fail!(Capacity, "cannot reserve {tokens} positions (max_tokens {max}, and at most INT32_MAX)");
        }
        let tokens = tokens.saturating_sub(self.shared_positions());
        let pending = match self.batch_size() {
            0 => {
                self.storage.check_row(tokens)?;
                None
            }
            _ => self.storage.prepare_reserve(tokens, 0, self.layout.offset())?,
        };
        let reserved = self.reserved.max(tokens);
        Ok(Change { pending, reserved, ..self.relabel(self.layout.clone()) })
    }

    /// A new single-row cache holding exactly row `row`'s valid positions (over the same shared
    /// prefix, if any: only the row's own positions are copied).
    pub fn extract_row(&self, row: usize) -> Result<LatentCache> {
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        let mut out = LatentCache::new(self.geometry)?;
        out.base = self.base.clone();
        // A row leaving mid-prefill leaves with its prompt's positions, without its right padding.
        let (lo, hi) = (self.layout.left_pad()[row], self.prefill_valid_end(row));
        out.fill_from(&[(self, row, lo, hi)], &[hi - lo])?;
        Ok(out)
    }

    /// Fills this empty cache from `(source, row, lo, hi)` pieces, one per new row, with the
    /// given row lengths (laid out as this cache's layout rebuilds rows; see `prepare_rebuild`).
    pub(super) fn fill_from(&mut self, rows: &[(&LatentCache, usize, usize, usize)], lengths: &[usize]) -> Result<()> {
        let (layout, pending, hot) = self.prepare_rebuild(rows, lengths)?;
        self.storage.commit(pending);
        if let (Some(side), Some(change)) = (&mut self.hot, hot) {
            side.apply(change);
        }
        self.layout.adopt(layout);
        self.settle();
        self.chains.clear();
        Ok(())
    }

    /// Every row of every source after this cache's rows, in order, right-justified to the
    /// longest (ragged: each from position 0). A source without rows contributes one empty row.
    /// Sources are not changed. Rows over a shared prefix merge only with rows over the same
    /// prefix (the same pieces, not equal values), which the merged rows then share: only their
    /// own positions are copied. An empty destination is filled; one holding rows keeps them
    /// where they are and the sources' rows join in free slots (see `prepare_join`).
    pub fn merge_rows(&mut self, sources: &[&LatentCache]) -> Result<()> {
        if sources.is_empty() {
            return fail!(InvalidArgument, "merge needs at least one source");
        }
        if self.in_spec_round() || self.prefill.is_some() || self.maintaining {
            return fail!(State, "the merge destination must be outside a round, a prefill and prefill maintenance");
        }
        if self.batch_size() != 0 {
            let change = self.prepare_join(sources)?;
            self.apply(change);
            return Ok(());
        }
        let base = sources[0].base.clone();
        if let Some(i) = sources.iter().position(|s| !same_prefix(&s.base, &base)) {
            return fail!(
                InvalidArgument,
                "source {i} and source 0 do not share one prefix: rows merge over the same shared prefix or none"
            );
        }
        self.base = base;
        let result = self.source_rows(sources).and_then(|(rows, lengths)| self.fill_from(&rows, &lengths));
        if result.is_err() {
            self.base = None;
        }
        result
    }
}

/// Whether two caches' rows read the same shared prefix (the same pieces), or both none.
pub(crate) fn same_prefix(a: &Option<SharedPrefix>, b: &Option<SharedPrefix>) -> bool {
    match (a, b) {
        (Some(a), Some(b)) => a.same_as(b),
        (a, b) => a.is_some() == b.is_some(),
    }
}
