//! Composed storage on `LatentCache`: each row's newest positions are read in a float "hot"
//! mode, older ones in their family's compact mode (`hot_window`, `hot_storage` in the
//! geometry; the boundaries are `boundary`'s pure logic).
//!
//! Every position is encoded in the compact mode when it is appended, in the main storage, as
//! in a cache that is not composed. The hot side keeps the float values of the positions rows
//! may still read hot, of the composed families only, in a second storage where row `b` holds
//! window positions from its own `bases[b]` on (its oldest hot position when last rebuilt), so
//! its size is about `hot_window` plus a block per row, however far apart rows end, not the
//! history. Converting a block is then only moving a row's boundary: nothing is copied or
//! re-encoded, and the compact values are exactly what a cache of the compact mode alone holds.
//!
//! This file moves the precision boundaries (settling, trims, how far an append may go before
//! one moves), prepares the hot side's change for appends and row rebuilds, and adopts a loaded
//! hot side. Reading composed values is `read`'s; the maintenance calls are `maintenance`'s.
use mlx_rs::Array;

use super::{LatentCache, RowMove};
use crate::core::error::{fail, Result};
use crate::core::layout::boundary;
use crate::core::layout::prefill::valid_end;
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;
use crate::core::storage::buffers::{RowPiece, MIN_CAPACITY};
use crate::core::storage::hot::{hot_storage, Hot, HotChange};

impl LatentCache {
    /// Each row's settled length under `layout`: its positions that nothing in progress can take
    /// back. Inside a round, those it held when the round began (a rollback must find the state
    /// it left); inside a padded prefill, those that cannot be right padding (its valid end, see
    /// `prefill::valid_end`); otherwise all of them. Boundaries follow it.
    pub(crate) fn settled(&self, layout: &RowLayout) -> Vec<usize> {
        let round = layout.round_start();
        (0..layout.batch_size())
            .map(|b| {
                let valid = valid_end(layout, self.prefill.as_ref(), b) - layout.left_pad()[b];
                match round {
                    Some(start) => valid.min(start.get(b).copied().unwrap_or(0)),
                    None => valid,
                }
            })
            .collect()
    }

    /// Moves the boundaries after a change of the layout (see `boundary::settle`).
    pub(crate) fn settle(&mut self) {
        let (lengths, settled) = (self.layout.row_offsets(), self.settled(&self.layout));
        let hot_window = self.geometry.hot_window;
        if let Some(hot) = &mut self.hot {
            hot.converted.resize(lengths.len(), 0);
            boundary::settle(&mut hot.converted, &lengths, &settled, hot_window);
        }
    }

    /// Each row's first hot window position under `layout` with `converted`.
    pub(super) fn hot_starts_of(layout: &RowLayout, converted: &[usize]) -> Vec<usize> {
        boundary::hot_starts(layout.left_pad(), converted, layout.row_ends())
    }

    /// Row `row`'s first hot window position now.
    fn hot_start(&self, row: usize) -> usize {
        let hot = self.hot.as_ref().expect("composed caches have a hot side");
        let c = hot.converted.get(row).copied().unwrap_or(0);
        (self.layout.left_pad()[row] + c).min(self.layout.row_ends()[row])
    }

    /// Prepares the hot side of an append of `batch x tokens` whose layout afterwards is
    /// `after`. Only the new positions some row will read hot are written (a long prefill's
    /// older positions go to the compact mode alone). When a row's writes would fall outside its
    /// hot row, the hot storage is rebuilt (allocated and evaluated here): each row from the
    /// oldest position it reads hot after the append, with room for another window.
    pub(crate) fn prepare_hot_append(
        &self,
        updates: Families<&Array>,
        batch: usize,
        tokens: usize,
        after: &RowLayout,
    ) -> Result<Option<HotChange>> {
        let Some(hot) = &self.hot else { return Ok(None) };
        let mut converted = hot.converted.clone();
        converted.resize(batch, 0);
        boundary::settle(&mut converted, &after.row_offsets(), &self.settled(after), self.geometry.hot_window);
        let hot_after = Self::hot_starts_of(after, &converted);
        let starts = self.layout.append_starts(batch);
        // Rows written together (one slice update) skip the new positions no row reads hot.
        let skip = match starts.iter().all(|&s| s == starts[0]) {
            true => hot_after.iter().copied().min().unwrap_or(0).saturating_sub(starts[0]).min(tokens),
            false => 0,
        };
        let fresh = self.batch_size() == 0 || hot.storage.is_empty();
        if skip == tokens {
            let bases = if fresh { hot_after } else { hot.bases.clone() };
            return Ok(Some(HotChange { replace: None, pending: None, bases, converted }));
        }
        let written = tokens - skip;
        let writes: Vec<usize> = starts.iter().map(|&s| s + skip).collect();
        let capacity = hot.capacity();
        let outside = |b: usize| writes[b] < hot.bases[b] || writes[b] + written > hot.bases[b] + capacity;
        let (replace, bases) = if fresh {
            let bases = hot_after.iter().zip(&writes).map(|(&h, &w)| h.min(w)).collect();
            (Some(hot_storage(&self.geometry)), bases)
        } else if (0..batch).any(outside) {
            let bases: Vec<usize> = hot_after.iter().zip(&writes).map(|(&h, &w)| h.min(w)).collect();
            let room = (0..batch).map(|b| writes[b] + written - bases[b]).max().unwrap_or(0);
            // Each row's positions it reads hot now and will after the append.
            let pieces: Vec<RowPiece<'_>> = (0..batch)
                .filter_map(|b| {
                    let lo = self.hot_start(b).max(bases[b]);
                    let hi = self.layout.row_ends()[b];
                    (lo < hi).then(|| RowPiece {
                        source: &hot.storage,
                        row: b,
                        lo: lo - hot.bases[b],
                        hi: hi - hot.bases[b],
                        dest_row: b,
                        dest_lo: lo - bases[b],
                    })
                })
                .collect();
            let mut rebuilt = hot_storage(&self.geometry);
            // Room for another window and block of appends before the next rebuild: a rebuild
            // copies about that many positions per row, so its cost per append stays constant.
            let slack = self.geometry.hot_window + boundary::CONVERSION_BLOCK;
            rebuilt.commit(hot.storage.prepare_assemble(batch, batch, (room + slack).max(MIN_CAPACITY), &pieces)?);
            (Some(rebuilt), bases)
        } else {
            (None, hot.bases.clone())
        };
        let target = replace.as_ref().unwrap_or(&hot.storage);
        let sliced = updates.try_map(|_, u| match skip {
            0 => Ok(u.clone()),
            _ => {
                let shape = u.shape();
                ops::slice(u, &[0, skip, 0], &[shape[0] as usize, tokens, shape[2] as usize])
            }
        })?;
        let at: Vec<usize> = writes.iter().zip(&bases).map(|(&w, &base)| w - base).collect();
        let reach = at.iter().copied().max().unwrap_or(0);
        let pending = target.prepare_append(sliced.as_ref(), batch, reach, &at, written, (0, 0))?;
        Ok(Some(HotChange { replace, pending: Some(pending), bases, converted }))
    }

    /// Prepares the hot side of a row rebuild: `moves` land in a cache laid out as `layout`,
    /// whose rows keep `converted` positions each. Rows shifting within this cache (`in_place`,
    /// a rollback) only move their bases: their hot values stay where they are. Otherwise a new
    /// hot storage is assembled, each row from its first hot position, allocated and evaluated
    /// here.
    pub(crate) fn prepare_hot_rows(
        &self,
        moves: &[RowMove<'_>],
        layout: &RowLayout,
        converted: Vec<usize>,
        in_place: bool,
    ) -> Result<Option<HotChange>> {
        let Some(hot) = &self.hot else { return Ok(None) };
        // In place, each row's base follows its shift; a row shifting left past the window's
        // first position (its base would be negative) is rebuilt instead.
        let shifted = in_place.then(|| {
            let mut bases = hot.bases.clone();
            let rows = bases.len();
            for m in moves.iter().filter(|m| m.dest_row < rows) {
                let base = bases[m.dest_row] as i64 + m.dest_lo as i64 - m.lo as i64;
                bases[m.dest_row] = usize::try_from(base).ok()?;
            }
            Some(bases)
        });
        if let Some(Some(bases)) = shifted {
            return Ok(Some(HotChange { replace: None, pending: None, bases, converted }));
        }
        let bases = Self::hot_starts_of(layout, &converted);
        let pieces: Vec<RowPiece<'_>> = moves
            .iter()
            // A move without positions (an empty source's row) brings nothing hot.
            .filter(|m| m.hi > m.lo)
            .filter_map(|m| {
                let source = m.source.hot.as_ref().expect("rows move between caches of one geometry");
                let lo = m.lo.max(m.source.hot_start(m.row));
                let dest_lo = m.dest_lo + (lo - m.lo);
                (lo < m.hi).then(|| RowPiece {
                    source: &source.storage,
                    row: m.row,
                    lo: lo - source.bases[m.row],
                    hi: m.hi - source.bases[m.row],
                    dest_row: m.dest_row,
                    dest_lo: dest_lo - bases[m.dest_row],
                })
            })
            .collect();
        let room = (0..layout.batch_size()).map(|b| layout.row_ends()[b] - bases[b]).max().unwrap_or(0);
        let pending = hot.storage.prepare_assemble(layout.batch_size(), layout.batch_size(), room + MIN_CAPACITY, &pieces)?;
        Ok(Some(HotChange { replace: Some(hot_storage(&self.geometry)), pending: Some(pending), bases, converted }))
    }

    /// Refuses a trim of `n` positions (without bypass) that would leave converted positions a
    /// fresh cache given the remaining positions would hold hot.
    pub(crate) fn check_composed_trim(&self, n: usize, bypass: bool) -> Result<()> {
        let Some(hot) = &self.hot else { return Ok(()) };
        if bypass || n == 0 {
            return Ok(());
        }
        let max = boundary::max_reusable_trim(&hot.converted, &self.row_offsets(), self.geometry.hot_window);
        if max.is_some_and(|max| n > max) {
            return fail!(
                State,
                "trimming {n} positions goes below minimum_reusable_offset ({}): positions already converted to the \
                 compact mode would not be what a fresh prefill holds (trim with bypass to accept that)",
                self.minimum_reusable_offset()
            );
        }
        Ok(())
    }

    /// The most positions the next append may take before some row's boundary moves: counted
    /// from each row's settled length as the append would move it (right padding still to come,
    /// and positions past a prompt's declared length, settle nothing). `usize::MAX` when no
    /// append moves one (inside a round, or every prompt in).
    pub(crate) fn appendable_before_conversion(&self) -> usize {
        let Some(hot) = &self.hot else { return usize::MAX };
        if self.in_spec_round() {
            return usize::MAX;
        }
        let (held, window) = (self.row_offsets(), self.geometry.hot_window);
        let prefill = self.prefill.as_ref();
        (0..self.batch_size())
            .map(|b| {
                let c = hot.converted.get(b).copied().unwrap_or(0);
                let threshold = boundary::next_move(c, window);
                let prompts = prefill.and_then(|p| p.lengths.as_ref().map(|l| (p, l)));
                let right = prefill.and_then(|p| p.right_padding.as_ref());
                match (prompts, right) {
                    (Some((p, lengths)), _) => {
                        let prompt = p.base.get(b).copied().unwrap_or(0) + lengths.get(b).copied().unwrap_or(0);
                        match prompt < threshold {
                            true => usize::MAX,
                            false => (threshold - 1).saturating_sub(held[b]),
                        }
                    }
                    (None, Some(right)) => (threshold + right.get(b).copied().unwrap_or(0) - 1).saturating_sub(held[b]),
                    (None, None) => (threshold - 1).saturating_sub(held[b]),
                }
            })
            .min()
            .unwrap_or(usize::MAX)
    }

    /// Each row's count of valid positions read in the compact mode (the row's precision
    /// boundary, counted from its first valid position); empty when the cache is not composed.
    pub fn converted_positions(&self) -> Vec<usize> {
        self.hot.as_ref().map(|h| h.converted.clone()).unwrap_or_default()
    }

    /// The smallest offset a trim may reach and leave state bit-identical to a fresh cache given
    /// the same positions: 0 for exact and compact storage (every position is encoded on its
    /// own); with composed storage, the offset below which converted positions would be ones a
    /// fresh cache holds hot.
    pub fn minimum_reusable_offset(&self) -> usize {
        let Some(hot) = &self.hot else { return 0 };
        match crate::core::layout::boundary::max_reusable_trim(&hot.converted, &self.row_offsets(), self.geometry.hot_window) {
            Some(n) => self.offset() - n.min(self.layout.shortest_row()),
            None => 0,
        }
    }

    /// Takes a loaded hot side (`persist`, which checked it): the hot rows of the composed
    /// families (`[B, capacity, width]`), each row's base and boundary.
    pub(crate) fn adopt_hot(&mut self, bases: Vec<usize>, converted: Vec<usize>, values: Vec<(Family, Array)>) {
        let rows = self.batch_size();
        let capacity = values.first().map_or(0, |(_, a)| a.shape()[1] as usize);
        let storage = hot_storage(&self.geometry);
        let storage = match capacity {
            0 => storage,
            _ => {
                let parts = Families::for_geometry(&self.geometry, |family, _| {
                    values.iter().find(|(f, _)| *f == family).map_or_else(Vec::new, |(_, a)| vec![a.clone()])
                });
                storage.adopt(rows, capacity, parts)
            }
        };
        self.hot = Some(Hot { storage, bases, converted });
    }
}
