//! Reads on `LatentCache`: values of every stored family (views for the float modes, lazy
//! decodes for the packed ones), the stored parts as they are, host copies of rows, and the
//! hot side a donor captures. Composed families read their compact positions decoded with each
//! row's hot positions laid over them, of the committed state or of a prepared append.
use mlx_rs::{Array, Dtype};

use super::{LatentCache, LatentState};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;
use crate::core::model::storage_mode::StorageMode;
use crate::core::storage::buffers::Pending;
use crate::core::storage::hot::{overlay_hot, HotCapture, HotChange};

impl LatentCache {
    /// The index keys stored before the coming append: `[B, T, index_head_dim]`, or
    /// `[0, 0, index_head_dim]` before the first append. An error on a layer without DSA.
    pub fn stored_index_keys(&self) -> Result<Array> {
        self.width(Family::IndexKeys)?;
        self.family_view(Family::IndexKeys, None)
    }

    /// Values of every stored family (see `LatentState`). With composed storage, composed
    /// families are the decoded compact positions with each row's hot positions over them, in
    /// the hot mode's dtype, or float32 where the compact mode reads another (O(stored) when
    /// evaluated).
    pub fn state(&self) -> Result<LatentState> {
        Families::for_geometry(&self.geometry, |family, _| family).try_map(|_, f| self.family_view(f, None))
    }

    /// How `family` is stored on this layer.
    pub fn storage_mode(&self, family: Family) -> Result<StorageMode> {
        self.width(family)?;
        Ok(self.geometry.storage(family))
    }

    /// Views of one family's stored parts `[B, T, part_width]` as its mode holds them (see
    /// `StorageMode::parts`): the values for the float modes; codes and scales (and biases) for
    /// the packed ones, as MLX's quantized matmul and our kernels read them. No copy, no decode.
    /// Over a shared prefix, the rows joined as a cache holding copies holds them: a copy,
    /// O(history) when evaluated (`shared`).
    pub fn stored_parts(&self, family: Family) -> Result<Vec<Array>> {
        self.width(family)?;
        match self.base.is_some() {
            true => self.joined_parts(family),
            false => self.storage.stored_parts(family, self.layout.offset()),
        }
    }

    /// Row `row`'s valid positions of one family, row-major `[row_offsets[row], width]`.
    pub fn read_row(&self, family: Family, row: usize) -> Result<Vec<f32>> {
        self.width(family)?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        if self.base.is_none() {
            return self.read_span(family, row, self.layout.left_pad()[row], self.layout.row_ends()[row]);
        }
        // The prefix's positions, then the row's own (`stored_row_parts` joins them).
        let parts = self.stored_row_parts(family, row, 0, self.row_offsets()[row])?;
        let values = self.geometry.storage(family).decode(&parts, self.geometry.width(family).expect("present"))?;
        ops::to_host(&ops::astype(&values, Dtype::Float32)?)
    }

    /// Row `row`'s positions `[lo, hi)` of one family as float32 on the host.
    fn read_span(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        match self.geometry.is_composed(family) {
            true => self.read_composed_row(family, row, lo, hi),
            false => self.storage.read_row(family, row, lo, hi),
        }
    }

    /// The whole stored window of one family, `[B, T, width]` row-major; positions outside a
    /// row's `[left_pad, row_end)` hold unspecified values.
    pub fn read(&self, family: Family) -> Result<Vec<f32>> {
        self.width(family)?;
        if self.base.is_some() {
            return ops::to_host(&ops::astype(&self.family_view(family, None)?, Dtype::Float32)?);
        }
        let mut out = Vec::new();
        for row in 0..self.batch_size() {
            out.extend(self.read_span(family, row, 0, self.layout.offset())?);
        }
        Ok(out)
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
    /// Over a shared prefix (never composed), the rows joined (`joined_parts`), decoded.
    pub(crate) fn family_view(&self, family: Family, pending: Option<(&Pending, &HotChange, &RowLayout)>) -> Result<Array> {
        if self.base.is_some() && pending.is_none() {
            return self
                .geometry
                .storage(family)
                .decode(&self.joined_parts(family)?, self.geometry.width(family).expect("present"));
        }
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
}
