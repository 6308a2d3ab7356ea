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
use mlx_rs::{Array, Dtype};

use crate::core::cache::{Change, LatentCache, LatentState, RowMove};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;

use crate::core::layout::boundary;
use crate::core::layout::prefill::valid_end;
use crate::core::mlx::ops;
use crate::core::storage::buffers::{Pending, RowPiece, MIN_CAPACITY};
use crate::core::storage::hot::{hot_storage, overlay_hot, Hot, HotCapture, HotChange};

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
    fn hot_starts_of(layout: &RowLayout, converted: &[usize]) -> Vec<usize> {
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
            rebuilt.commit(hot.storage.prepare_assemble(batch, (room + slack).max(MIN_CAPACITY), &pieces)?);
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
        let pending = hot.storage.prepare_assemble(layout.batch_size(), room + MIN_CAPACITY, &pieces)?;
        Ok(Some(HotChange { replace: Some(hot_storage(&self.geometry)), pending: Some(pending), bases, converted }))
    }

    /// The dtype a composed family reads in: the hot mode's where its compact mode reads the
    /// same, float32 otherwise (a decoded FP8 value is not a bfloat16 one).
    pub(crate) fn composed_dtype(&self, family: Family) -> Dtype {
        let hot = self.geometry.hot_storage.read_dtype();
        match self.geometry.storage(family).read_dtype() == hot {
            true => hot,
            false => Dtype::Float32,
        }
    }

    /// Values of a composed family at rows `[rows.0, rows.1)`, positions `[lo, hi)`, in
    /// `composed_dtype`: the compact values decoded, each row's hot positions from its hot row. Of a
    /// prepared state when `pending` gives one (main, hot, bases and boundaries as prepared).
    fn composed_window(
        &self,
        family: Family,
        rows: (usize, usize),
        (lo, hi): (usize, usize),
        pending: Option<(&Pending, &HotChange, &RowLayout)>,
    ) -> Result<Array> {
        let hot = self.hot.as_ref().expect("composed caches have a hot side");
        let dtype = self.composed_dtype(family);
        if pending.is_none() && self.storage.is_empty() {
            // Before the first write: the empty view every cache returns.
            return ops::astype(&self.storage.view(family, 0)?, dtype);
        }
        let cold = ops::astype(&self.storage.window_in(pending.map(|p| p.0), family, rows, lo, hi)?, dtype)?;
        let (store, hot_pending, bases, converted, layout) = match pending {
            Some((_, change, layout)) => {
                let store = change.replace.as_ref().unwrap_or(&hot.storage);
                (store, change.pending.as_ref(), &change.bases, &change.converted, layout)
            }
            None => (&hot.storage, None, &hot.bases, &hot.converted, &self.layout),
        };
        let capacity = match hot_pending {
            Some(p) => p.capacity(),
            None if store.is_empty() => 0,
            None => store.capacity(),
        };
        if capacity == 0 || hi <= lo {
            return Ok(cold);
        }
        let values = ops::astype(&store.window_in(hot_pending, family, rows, 0, capacity)?, dtype)?;
        let starts = Self::hot_starts_of(layout, converted);
        overlay_hot(&cold, &values, &bases[rows.0..rows.1], &starts[rows.0..rows.1], (lo, hi))
    }

    /// One family's values over the whole window `[rows, offset, width]` (see `LatentState`):
    /// composed families overlay their hot positions on the decoded compact ones.
    pub(crate) fn family_view(&self, family: Family, pending: Option<(&Pending, &HotChange, &RowLayout)>) -> Result<Array> {
        let layout = pending.map_or(&self.layout, |p| p.2);
        let window = (0, layout.batch_size());
        match (self.geometry.is_composed(family), pending) {
            (true, _) => self.composed_window(family, window, (0, layout.offset()), pending),
            (false, Some((main, _, _))) => self.storage.window_in(Some(main), family, window, 0, layout.offset()),
            (false, None) => self.storage.view(family, layout.offset()),
        }
    }

    /// Every family's values of a prepared append (composed caches).
    pub(crate) fn composed_views(&self, main: &Pending, hot: &HotChange, after: &RowLayout) -> Result<LatentState> {
        Families::for_geometry(&self.geometry, |family, _| family).try_map(|_, f| self.family_view(f, Some((main, hot, after))))
    }

    /// Row `row`'s positions `[lo, hi)` of a composed family, as float32 on the host.
    pub(crate) fn read_composed_row(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        if hi <= lo {
            return Ok(Vec::new());
        }
        let values = self.composed_window(family, (row, row + 1), (lo, hi), None)?;
        ops::to_host(&ops::astype(&values, Dtype::Float32)?)
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

    /// Starts prefill maintenance (the seed's `beginPrefill`). Moving a boundary here copies and
    /// re-encodes nothing, and boundaries follow each row's settled length whatever the chunks,
    /// so there is nothing to defer: a chunked prefill holds the same state as one append at
    /// every step, and its hot side stays the size of the window. The calls keep the seed's
    /// protocol and its checks (refused when maintenance is already open).
    pub fn prefill_begin(&mut self) -> Result<()> {
        let change = self.prepare_prefill_begin()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_begin(&self) -> Result<Change> {
        if self.maintaining {
            return fail!(State, "prefill maintenance is already open (prefill_begin was called twice)");
        }
        Ok(Change { maintaining: true, ..self.relabel(self.layout.clone()) })
    }

    /// Fixes each listed row's precision boundary at its current length, its request's prompt
    /// end (the seed's `commitPrefill`): where its settled length puts it, which a sibling's
    /// later chunks do not move. Refused outside maintenance or for a row the cache does not hold.
    pub fn prefill_commit(&mut self, rows: &[usize]) -> Result<()> {
        let change = self.prepare_prefill_commit(rows)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_commit(&self, rows: &[usize]) -> Result<Change> {
        if !self.maintaining {
            return fail!(State, "prefill_commit needs prefill_begin first");
        }
        if let Some(&row) = rows.iter().find(|&&r| r >= self.batch_size()) {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        Ok(self.relabel(self.layout.clone()))
    }

    /// Ends prefill maintenance (the seed's `endPrefill`).
    pub fn prefill_end(&mut self) -> Result<()> {
        let change = self.prepare_prefill_end()?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_prefill_end(&self) -> Result<Change> {
        if !self.maintaining {
            return fail!(State, "prefill_end needs prefill_begin first");
        }
        Ok(Change { maintaining: false, ..self.relabel(self.layout.clone()) })
    }

    /// Whether prefill maintenance is open.
    pub fn in_prefill_maintenance(&self) -> bool {
        self.maintaining
    }

    /// The hot side for a donor: each composed family's hot rows (views), each row's base and
    /// first hot position; `None` when not composed.
    pub(crate) fn capture_hot(&self) -> Result<Option<HotCapture>> {
        let Some(hot) = &self.hot else { return Ok(None) };
        let (rows, capacity) = (self.batch_size(), hot.capacity());
        let mut values = Vec::new();
        if capacity > 0 {
            for family in Family::ALL.into_iter().filter(|&f| self.geometry.is_composed(f)) {
                values.push((family, hot.storage.window_in(None, family, (0, rows), 0, capacity)?));
            }
        }
        let starts = Self::hot_starts_of(&self.layout, &hot.converted);
        Ok(Some(HotCapture { bases: hot.bases.clone(), starts, values }))
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
}
