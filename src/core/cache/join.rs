//! Rows joining a batch that holds rows (`merge_rows` into a non-empty cache), room for them
//! (`reserve_rows`) and its release (`shrink_rows`). A joining row is written into a free slot
//! of the buffers, which the rows already there share, wherever that slot lies
//! (`layout::slots`): the join costs the joining rows' positions, and the rows that stay are
//! not touched (composed storage's hot side, about a window per row, is rebuilt). Where the buffers have no free slot or the rows already there
//! would have to move unevenly, the batch is rebuilt once (every row copied).
use super::rows::same_prefix;
use super::{Change, LatentCache, RowMove};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::layout::slots::Placement;
use crate::core::storage::buffers::{Pending, RowPiece, MIN_CAPACITY};
use crate::core::storage::hot::HotChange;

/// One source row: `(source, row, lo, hi)`, its valid positions.
pub(super) type SourceRow<'a> = (&'a LatentCache, usize, usize, usize);

/// A source row landing at row `dest_row` of `layout`, where that row's positions start.
fn landing<'a>(layout: &RowLayout, dest_row: usize, (source, row, lo, hi): SourceRow<'a>) -> RowPiece<'a> {
    RowPiece { source: &source.storage, row, lo, hi, dest_row, dest_lo: layout.left_pad()[dest_row] }
}

impl LatentCache {
    /// The rows the sources give, in order, with their lengths: a batch source all its rows (a
    /// source mid-prefill its rows' prompts, as `extract_row` does), an empty source one empty
    /// row. Refuses a source of another geometry, and rows longer than `max_tokens`.
    pub(super) fn source_rows<'a>(&self, sources: &[&'a LatentCache]) -> Result<(Vec<SourceRow<'a>>, Vec<usize>)> {
        let mut rows = Vec::new();
        let mut lengths = Vec::new();
        for (i, &source) in sources.iter().enumerate() {
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
                rows.push((source, 0, 0, 0));
                lengths.push(0);
            }
            for (row, &pad) in source.layout.left_pad().iter().enumerate() {
                let end = source.prefill_valid_end(row);
                rows.push((source, row, pad, end));
                lengths.push(end - pad);
            }
        }
        let longest = lengths.iter().copied().max().unwrap_or(0) + self.shared_positions();
        if self.geometry.max_tokens != 0 && longest > self.geometry.max_tokens {
            return fail!(Capacity, "a merged row of {longest} positions exceeds max_tokens ({})", self.geometry.max_tokens);
        }
        Ok((rows, lengths))
    }

    /// The sources' rows joining this cache's rows (`merge_rows` into a cache holding rows), as
    /// a change. The layout is the one a merge of this cache and the sources would make. In
    /// place when the rows already here keep their positions relative to each other (they all
    /// shift by one count, which moves position 0), and the buffers have a free slot for every
    /// joining row and room for the new window: then only the joining rows' positions are
    /// written (and composed storage's hot side rebuilt). Otherwise every row is copied into new
    /// buffers.
    pub fn prepare_join<'a>(&'a self, sources: &[&'a LatentCache]) -> Result<Change> {
        if let Some(i) = sources.iter().position(|s| !same_prefix(&s.base, &self.base)) {
            return fail!(
                InvalidArgument,
                "source {i} does not share the destination's prefix: rows merge over the same shared prefix or none"
            );
        }
        let (joining, lengths) = self.source_rows(sources)?;
        let batch = self.batch_size();
        let mut all = self.layout.row_offsets();
        all.extend(&lengths);
        // `source_rows` checked the joining rows against max_tokens; the rows here fit already.
        let layout = RowLayout::rebuilt(self.layout.kind(), &all);
        // Row b's old position j + shift[b] is its new position j.
        let shift: Vec<isize> = (0..batch).map(|b| self.left_pad()[b] as isize - layout.left_pad()[b] as isize).collect();
        let piece = |dest_row: usize, r: &SourceRow<'a>| landing(&layout, dest_row, *r);
        let frame = self.storage.frame();
        let common = shift.first().copied().unwrap_or(0);
        let start = frame.start as isize + common;
        let in_place = !self.storage.is_empty()
            && shift.iter().all(|&s| s == common)
            && start >= 0
            && start as usize + layout.offset() <= frame.capacity
            && all.len() <= frame.slots;
        // The rows already here first, then the joining ones.
        let own = (0..batch).map(|b| (self, b, self.left_pad()[b], self.layout.row_ends()[b]));
        let rows: Vec<SourceRow<'_>> = own.chain(joining.iter().copied()).collect();
        if in_place {
            // Composed storage's hot side (about a window per row) is rebuilt for every row.
            let hot = self.prepare_hot_of(&rows, &layout, &all)?;
            let mut pieces: Vec<RowPiece<'_>> = joining.iter().enumerate().map(|(k, r)| piece(batch + k, r)).collect();
            // Each joining row in a free slot, the rows here where they are; where that would
            // leave the rows in more runs than attention reads, every row gathered into one
            // run, moving the fewest positions (once per several joins and leaves).
            let placement = frame.placement.joined(all.len() - batch, frame.slots).unwrap_or_else(|| {
                let now: Vec<Option<usize>> = (0..all.len()).map(|b| (b < batch).then(|| frame.placement.slot(b))).collect();
                let gathered = Placement::gather(&now, frame.slots, |b| all[b]);
                let moved = (0..batch).filter(|&b| frame.placement.slot(b) != gathered.slot(b));
                pieces.extend(moved.map(|b| piece(b, &rows[b])));
                gathered
            });
            let pending = self.storage.prepare_move(&pieces, placement, start as usize)?;
            return Ok(Change { pending: Some(pending), hot, moves_rows: true, ..self.relabel(layout) });
        }
        let (layout, pending, hot) = self.prepare_rebuild(&rows, &all)?;
        Ok(Change { pending: Some(pending), hot, moves_rows: true, ..self.relabel(layout) })
    }

    /// New buffers holding `rows` (each `(source, row, lo, hi)`, with `lengths[b] = hi - lo`) in
    /// order, laid out as this cache's layout rebuilds rows, with room for the reservation or one
    /// growth step (and at least the capacity now), in this cache's slots; with composed
    /// storage, the hot side rebuilt alike (each row keeps its boundary within the positions it
    /// brings). Allocated and evaluated during the call; nothing is changed.
    pub(super) fn prepare_rebuild(
        &self,
        rows: &[SourceRow<'_>],
        lengths: &[usize],
    ) -> Result<(RowLayout, Pending, Option<HotChange>)> {
        let layout = RowLayout::rebuilt(self.layout.kind(), lengths);
        let mut capacity = (layout.offset() + MIN_CAPACITY).max(self.reserved).max(self.storage.capacity());
        if self.own_max_tokens() != 0 {
            capacity = capacity.min(self.own_max_tokens()).max(layout.offset());
        }
        let pieces: Vec<RowPiece<'_>> = rows.iter().enumerate().map(|(b, &r)| landing(&layout, b, r)).collect();
        let hot = self.prepare_hot_of(rows, &layout, lengths)?;
        let pending = self.storage.prepare_assemble(rows.len(), self.storage.slots(), capacity, &pieces)?;
        Ok((layout, pending, hot))
    }

    /// Composed storage's hot side rebuilt for `rows` (each `(source, row, lo, hi)` of
    /// `lengths[b]` positions) landing as rows of `layout`: each row keeps its boundary within
    /// the positions it brings. `None` when the cache is not composed.
    fn prepare_hot_of(&self, rows: &[SourceRow<'_>], layout: &RowLayout, lengths: &[usize]) -> Result<Option<HotChange>> {
        if self.hot.is_none() {
            return Ok(None);
        }
        let moves: Vec<RowMove<'_>> = rows
            .iter()
            .enumerate()
            .map(|(b, &(source, row, lo, hi))| RowMove { source, row, lo, hi, dest_row: b, dest_lo: layout.left_pad()[b] })
            .collect();
        let converted = rows
            .iter()
            .zip(lengths)
            .map(|(&(source, row, ..), &len)| source.converted_positions().get(row).copied().unwrap_or(0).min(len))
            .collect();
        self.prepare_hot_rows(&moves, layout, converted, false)
    }

    /// Makes room for `rows` rows now, so rows joining the batch up to that count are written
    /// into free slots and copy nothing else (`merge_rows` into a cache holding rows). On a
    /// cache holding rows the buffers are allocated during the call (the rows copied once); on
    /// an empty cache the first allocation takes that many. Never shrinks (`shrink_rows` does);
    /// `reset` forgets it.
    pub fn reserve_rows(&mut self, rows: usize) -> Result<()> {
        let change = self.prepare_reserve_rows(rows)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_reserve_rows(&self, rows: usize) -> Result<Change> {
        if rows > i32::MAX as usize {
            return fail!(Capacity, "cannot reserve {rows} rows (at most INT32_MAX)");
        }
        let mut change = self.relabel(self.layout.clone());
        change.slots = Some(rows.max(self.storage.slots()));
        if self.batch_size() != 0 && !self.storage.is_empty() {
            change.pending = self.storage.prepare_reserve(0, rows, self.layout.offset())?;
        } else {
            self.storage.check_rows(rows, self.storage.capacity().max(self.reserved))?;
        }
        Ok(change)
    }

    /// Releases the slots no row holds (left by rows that left, or reserved): the rows are
    /// copied once into buffers of exactly their count of slots, keeping every stored position
    /// and the capacity, so `bytes_in_use` and MLX's active memory shrink. On an empty cache,
    /// forgets a `reserve_rows`.
    pub fn shrink_rows(&mut self) -> Result<()> {
        let change = self.prepare_shrink_rows()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_shrink_rows(&self) -> Result<Change> {
        let mut change = self.relabel(self.layout.clone());
        let frame = self.storage.frame();
        change.slots = Some(frame.rows());
        if self.storage.is_empty() || frame.slots == frame.rows() {
            return Ok(change);
        }
        let (pads, ends) = (self.left_pad(), self.layout.row_ends());
        let pieces: Vec<RowPiece<'_>> = (0..frame.rows())
            .map(|b| RowPiece { source: &self.storage, row: b, lo: pads[b], hi: ends[b], dest_row: b, dest_lo: pads[b] })
            .collect();
        change.pending = Some(self.storage.prepare_assemble(frame.rows(), frame.rows(), self.storage.capacity(), &pieces)?);
        Ok(change)
    }
}
