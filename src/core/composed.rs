//! Composed storage on `LatentCache`: each row's newest positions are read in a float "hot"
//! mode, older ones in their family's compact mode (`hot_window`, `hot_storage` in the
//! geometry; the boundaries are `boundary`'s pure logic).
//!
//! Every position is encoded in the compact mode when it is appended, in the main storage, as
//! in a cache that is not composed. The hot side keeps the float values of the positions rows
//! may still read hot, in a second storage covering the stored window from `base` on (the
//! oldest hot position of any row, rebuilt from there when it must grow), so its size is about
//! `hot_window` plus a block per row, not the history. Converting a block is then only moving
//! a row's boundary: nothing is copied or re-encoded, and the compact values are exactly what
//! a cache of the compact mode alone holds.
use mlx_rs::{Array, Dtype};

use super::boundary;
use super::cache::{LatentCache, LatentState};
use super::donor::HotCapture;
use super::error::{fail, CacheError, Result};
use super::families::Families;
use super::geometry::{Family, Geometry};
use super::layout::RowLayout;
use super::mlx_math;
use super::mlx_ops;
use super::prefill::valid_end;
use super::rows::Change;
use super::storage::{Pending, RowPiece, Storage, MIN_CAPACITY};

/// The hot side of a composed cache.
#[derive(Debug)]
pub(crate) struct Hot {
    /// Every family in the hot mode; holds window positions `[base, base + capacity)`.
    pub(crate) storage: Storage,
    /// The window position of the hot storage's first position: at most every row's first hot
    /// position (rows without hot positions aside).
    pub(crate) base: usize,
    /// Per row: how many of its valid positions are read in the compact mode.
    pub(crate) converted: Vec<usize>,
}

/// A prepared change of the hot side (part of a `rows::Change`).
pub(crate) struct HotChange {
    /// A rebuilt hot storage that replaces the current one (then `pending` lands on it).
    pub(crate) replace: Option<Storage>,
    pub(crate) pending: Option<Pending>,
    pub(crate) base: usize,
    pub(crate) converted: Vec<usize>,
}

/// One row's valid positions `[lo, hi)` of `source` landing at `[dest_row, dest_lo..)`: what a
/// row rebuild moves, told with the cache it comes from (for its hot side).
pub(crate) struct RowMove<'a> {
    pub source: &'a LatentCache,
    pub row: usize,
    pub lo: usize,
    pub hi: usize,
    pub dest_row: usize,
    pub dest_lo: usize,
}

/// The geometry of the hot storage: every family in the hot mode.
fn hot_geometry(g: &Geometry) -> Geometry {
    let mode = g.hot_storage;
    Geometry { latent_storage: mode, rope_storage: mode, index_storage: mode, max_tokens: 0, hot_window: 0, ..*g }
}

impl Hot {
    /// The hot side of a cache of geometry `g`, or `None` when it is not composed.
    pub(crate) fn new(g: &Geometry) -> Option<Hot> {
        g.composed().then(|| Hot { storage: Storage::new(&hot_geometry(g)), base: 0, converted: Vec::new() })
    }

    pub(crate) fn apply(&mut self, change: HotChange) {
        if let Some(storage) = change.replace {
            self.storage = storage;
        }
        if let Some(pending) = change.pending {
            self.storage.commit(pending);
        }
        self.base = change.base;
        self.converted = change.converted;
    }

    pub(crate) fn clear(&mut self) {
        self.storage.clear();
        self.base = 0;
        self.converted.clear();
    }

    /// The window position one past the last the hot storage holds.
    fn end(&self) -> usize {
        if self.storage.is_empty() {
            self.base
        } else {
            self.base + self.storage.capacity()
        }
    }
}

/// `cold` (`[rows, hi - lo, width]`, positions `[lo, hi)`) with each row's positions from
/// `starts[row]` on taken from `hot` (`[rows, e - a, width]`, positions `[a, e)`).
pub(crate) fn overlay(cold: &Array, lo: usize, hot: &Array, (a, e): (usize, usize), starts: &[usize]) -> Result<Array> {
    let rows = starts.len();
    let width = cold.shape()[2] as usize;
    let positions: Vec<i32> = (a..e).map(|p| p as i32).collect();
    let starts: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
    let is_hot =
        mlx_math::greater_equal(&mlx_ops::indices(&positions, &[1, e - a, 1]), &mlx_ops::indices(&starts, &[rows, 1, 1]))?;
    let span = ([0, a - lo, 0], [rows, e - lo, width]);
    let tail = mlx_math::select(&is_hot, hot, &mlx_ops::slice(cold, &span.0, &span.1)?)?;
    mlx_ops::slice_update(cold, &tail, &span.0, &span.1)
}

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
    /// older positions go to the compact mode alone); when the hot storage must grow, it is
    /// rebuilt from the oldest position a row reads hot now (allocated and evaluated here).
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
        let needed_from = Self::hot_starts_of(after, &converted).into_iter().min().unwrap_or(0);
        let starts = self.layout.append_starts(batch);
        let skip = match starts.iter().all(|&s| s == starts[0]) {
            true => needed_from.saturating_sub(starts[0]).min(tokens),
            false => 0,
        };
        let offset = self.layout.offset();
        let fresh = self.batch_size() == 0 || hot.storage.is_empty();
        if skip == tokens {
            let base = if fresh { needed_from } else { hot.base };
            return Ok(Some(HotChange { replace: None, pending: None, base, converted }));
        }
        let end = after.offset();
        let write_from = starts.iter().copied().min().unwrap_or(0) + skip;
        // Rows with hot positions now, and where those start.
        let live: Vec<(usize, usize)> = (0..self.batch_size())
            .map(|b| (b, self.hot_start(b)))
            .filter(|&(b, start)| start < self.layout.row_ends()[b])
            .collect();
        let (replace, base) = if fresh {
            (Some(Storage::new(&hot_geometry(&self.geometry))), needed_from.min(write_from))
        } else if hot.end() < end || write_from < hot.base {
            // Growing (or writing below the hot storage after a trim with bypass): rebuild from
            // the oldest position a row reads hot after the append, with room to double.
            let from = needed_from.min(write_from);
            let capacity = (2 * (end - from)).max(MIN_CAPACITY);
            let pieces: Vec<RowPiece<'_>> = live
                .iter()
                .filter(|&&(b, lo)| lo.max(from) < self.layout.row_ends()[b])
                .map(|&(b, lo)| {
                    let lo = lo.max(from);
                    let hi = self.layout.row_ends()[b];
                    RowPiece {
                        source: &hot.storage,
                        row: b,
                        lo: lo - hot.base,
                        hi: hi - hot.base,
                        dest_row: b,
                        dest_lo: lo - from,
                    }
                })
                .collect();
            let mut rebuilt = Storage::new(&hot_geometry(&self.geometry));
            rebuilt.commit(hot.storage.prepare_assemble(batch, capacity, &pieces)?);
            (Some(rebuilt), from)
        } else {
            (None, hot.base)
        };
        let target = replace.as_ref().unwrap_or(&hot.storage);
        let sliced = updates.try_map(|_, u| match skip {
            0 => Ok(u.clone()),
            _ => {
                let shape = u.shape();
                mlx_ops::slice(u, &[0, skip, 0], &[shape[0] as usize, tokens, shape[2] as usize])
            }
        })?;
        let at: Vec<usize> = starts.iter().map(|&s| s + skip - base).collect();
        let pending = target.prepare_append(sliced.as_ref(), batch, offset + skip - base, &at, tokens - skip, (0, 0))?;
        Ok(Some(HotChange { replace, pending: Some(pending), base, converted }))
    }

    /// Prepares the hot side of a row rebuild: `moves` land in a cache laid out as `layout`,
    /// whose rows keep `converted` positions each. In place (rows shifting within this cache,
    /// `in_place`) only the moving hot positions are written; otherwise a new hot storage is
    /// assembled from the oldest hot position on, allocated and evaluated here.
    pub(crate) fn prepare_hot_rows(
        &self,
        moves: &[RowMove<'_>],
        layout: &RowLayout,
        converted: Vec<usize>,
        in_place: bool,
    ) -> Result<Option<HotChange>> {
        let Some(hot) = &self.hot else { return Ok(None) };
        let starts = Self::hot_starts_of(layout, &converted);
        let in_place = in_place && starts.iter().all(|&s| s >= hot.base) && layout.offset() <= hot.end();
        let base = if in_place { hot.base } else { starts.iter().copied().min().unwrap_or(0) };
        let pieces: Vec<RowPiece<'_>> = moves
            .iter()
            .filter_map(|m| {
                let source = m.source.hot.as_ref().expect("rows move between caches of one geometry");
                let lo = m.lo.max(m.source.hot_start(m.row));
                let dest_lo = m.dest_lo + (lo - m.lo);
                (lo < m.hi && !(in_place && dest_lo == lo)).then(|| RowPiece {
                    source: &source.storage,
                    row: m.row,
                    lo: lo - source.base,
                    hi: m.hi - source.base,
                    dest_row: m.dest_row,
                    dest_lo: dest_lo - base,
                })
            })
            .collect();
        if in_place {
            let pending = (!pieces.is_empty()).then(|| hot.storage.prepare_move(&pieces)).transpose()?;
            return Ok(Some(HotChange { replace: None, pending, base, converted }));
        }
        let capacity = layout.offset().saturating_sub(base) + MIN_CAPACITY;
        let pending = hot.storage.prepare_assemble(layout.batch_size(), capacity, &pieces)?;
        Ok(Some(HotChange {
            replace: Some(Storage::new(&hot_geometry(&self.geometry))),
            pending: Some(pending),
            base,
            converted,
        }))
    }

    /// Values of a composed family at rows `[rows.0, rows.1)`, positions `[lo, hi)`, in the hot
    /// mode's dtype: the compact values decoded, each row's hot positions from the hot side. Of a
    /// prepared state when `pending` gives one (main, hot, base and boundaries as prepared).
    fn composed_window(
        &self,
        family: Family,
        rows: (usize, usize),
        (lo, hi): (usize, usize),
        pending: Option<(&Pending, &HotChange, &RowLayout)>,
    ) -> Result<Array> {
        let hot = self.hot.as_ref().expect("composed caches have a hot side");
        let dtype = self.geometry.hot_storage.read_dtype();
        if pending.is_none() && self.storage.is_empty() {
            // Before the first write: the empty view every cache returns.
            return mlx_ops::astype(&self.storage.view(family, 0)?, dtype);
        }
        let cold = mlx_ops::astype(&self.storage.window_in(pending.map(|p| p.0), family, rows, lo, hi)?, dtype)?;
        let (store, hot_pending, base, converted, layout) = match pending {
            Some((_, change, layout)) => {
                let store = change.replace.as_ref().unwrap_or(&hot.storage);
                (store, change.pending.as_ref(), change.base, &change.converted, layout)
            }
            None => (&hot.storage, None, hot.base, &hot.converted, &self.layout),
        };
        let capacity = match hot_pending {
            Some(p) => p.capacity(),
            None if store.is_empty() => 0,
            None => store.capacity(),
        };
        let (a, e) = (lo.max(base), hi.min(base + capacity));
        if a >= e {
            return Ok(cold);
        }
        let hot_values = store.window_in(hot_pending, family, rows, a - base, e - base)?;
        let starts = Self::hot_starts_of(layout, converted);
        overlay(&cold, lo, &mlx_ops::astype(&hot_values, dtype)?, (a, e), &starts[rows.0..rows.1])
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
        mlx_ops::to_host(&mlx_ops::astype(&values, Dtype::Float32)?)
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

    /// The hot side for a donor: each composed family's values over the hot span that holds
    /// positions (views), its base and each row's first hot position; `None` when not composed.
    pub(crate) fn capture_hot(&self) -> Result<Option<HotCapture>> {
        let Some(hot) = &self.hot else { return Ok(None) };
        let end = self.offset().min(hot.end());
        let rows = self.batch_size();
        let mut values = Vec::new();
        if end > hot.base && !hot.storage.is_empty() {
            for family in Family::ALL.into_iter().filter(|&f| self.geometry.is_composed(f)) {
                values.push((family, hot.storage.window_in(None, family, (0, rows), 0, end - hot.base)?));
            }
        }
        let starts = Self::hot_starts_of(&self.layout, &hot.converted);
        Ok(Some(HotCapture { base: hot.base, starts, values }))
    }

    /// Takes a loaded hot side (`persist`, which checked it): the hot values of the composed
    /// families over window positions `[base, base + T_h)`, and each row's boundary.
    pub(crate) fn adopt_hot(&mut self, base: usize, converted: Vec<usize>, values: Vec<(Family, Array)>) -> Result<()> {
        let g = hot_geometry(&self.geometry);
        let rows = self.batch_size();
        let span = values.first().map_or(0, |(_, a)| a.shape()[1] as usize);
        let storage = match span {
            0 => Storage::new(&g),
            _ => {
                // Families that are not composed are never read from the hot side.
                let parts =
                    Families::for_geometry(&g, |family, width| (family, width)).try_map(|_, (family, width)| {
                        match values.iter().find(|(f, _)| *f == family) {
                            Some((_, a)) => Ok(vec![a.clone()]),
                            None => Ok::<_, CacheError>(vec![mlx_ops::zeros(&[rows, span, width], g.hot_storage.read_dtype())?]),
                        }
                    })?;
                Storage::from_parts(&g, rows, span, parts)
            }
        };
        self.hot = Some(Hot { storage, base, converted });
        Ok(())
    }

    /// Each row's count of valid positions read in the compact mode (the row's precision
    /// boundary, counted from its first valid position); empty when the cache is not composed.
    pub fn converted_positions(&self) -> Vec<usize> {
        self.hot.as_ref().map(|h| h.converted.clone()).unwrap_or_default()
    }
}
