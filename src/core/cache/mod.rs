//! `LatentCache`: one MLA layer's cache. Ties the geometry, the row layout and the stored
//! families together, and validates every input before changing anything. Row operations
//! (rounds with uneven drops, merge, extract, filter) are in `rows.rs`.
pub mod composed;
pub mod prefill;
pub mod rows;
pub mod set;

use mlx_rs::{Array, Dtype};

use crate::core::error::{fail, CacheError, ErrorKind, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::storage::hot::{Hot, HotChange};

use crate::core::layout::prefill::Prefill;
use crate::core::mlx::ops;
use crate::core::storage::buffers::{Pending, Storage};

/// The rejection of any index-key access on a layer without DSA.
fn no_index_keys() -> CacheError {
    CacheError::new(ErrorKind::InvalidArgument, "this layer has no DSA index keys (index_head_dim is 0)")
}

/// A prepared change of one cache: made (and whatever it allocates, allocated) by a `prepare_*`
/// call that changes nothing, applied by `apply`, which cannot fail. A set of caches prepares
/// every layer's change before applying any, so a failure on one layer leaves all as they were.
pub struct Change {
    pub(crate) layout: RowLayout,
    pub(crate) pending: Option<Pending>,
    pub(crate) reserved: usize,
    /// The open prefill after the change (its rows follow filters).
    pub(crate) prefill: Option<Prefill>,
    /// The hot side after the change (composed storage whose rows moved), if it changes.
    pub(crate) hot: Option<HotChange>,
    /// Prefill maintenance open after the change.
    pub(crate) maintaining: bool,
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

/// Values of everything stored, as returned by an append and by `state`: latent
/// `[B, T, kv_lora_rank]`, rope `[B, T, rope_head_dim]`, index keys `[B, T, index_head_dim]` on
/// a DSA layer. Views in the stored dtype for the float modes; lazy float32 decodes of the
/// whole window (O(stored) when evaluated) for the quantized ones (see `packed`).
pub type LatentState = Families<Array>;

#[derive(Debug)]
pub struct LatentCache {
    pub(crate) geometry: Geometry,
    pub(crate) layout: RowLayout,
    pub(crate) storage: Storage,
    /// Positions per row the engine asked to have room for (see `reserve`).
    pub(crate) reserved: usize,
    /// A padded batched prefill between `prefill_prepare` and `prefill_finalize`.
    pub(crate) prefill: Option<Prefill>,
    /// The hot side of composed storage (`None` when the cache is not composed).
    pub(crate) hot: Option<Hot>,
    /// Between `prefill_begin` and `prefill_end` (see `composed`).
    pub(crate) maintaining: bool,
}

impl LatentCache {
    pub fn new(geometry: Geometry) -> Result<Self> {
        geometry.validate()?;
        let layout = RowLayout::new(geometry.layout);
        Ok(LatentCache::adopt(geometry, layout, Storage::new(&geometry)))
    }

    /// A cache over storage and a layout a load checked (`persist`).
    pub(crate) fn adopt(geometry: Geometry, layout: RowLayout, storage: Storage) -> Self {
        let hot = Hot::new(&geometry);
        LatentCache { geometry, layout, storage, reserved: 0, prefill: None, hot, maintaining: false }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn batch_size(&self) -> usize {
        self.layout.batch_size()
    }

    pub fn offset(&self) -> usize {
        self.layout.offset()
    }

    pub fn row_offsets(&self) -> Vec<usize> {
        self.layout.row_offsets()
    }

    pub fn left_pad(&self) -> &[usize] {
        self.layout.left_pad()
    }

    /// Where each row's valid positions end (`offset` for every row when right-justified).
    pub fn row_ends(&self) -> &[usize] {
        self.layout.row_ends()
    }

    pub fn bytes_per_token(&self) -> usize {
        self.geometry.bytes_per_token()
    }

    /// Bytes the cache's buffers hold now (every row's capacity, valid or not; with composed
    /// storage, the hot side's too).
    pub fn bytes_in_use(&self) -> usize {
        self.storage.held_bytes() + self.hot.as_ref().map_or(0, |h| h.storage.held_bytes())
    }

    /// Bytes of valid state: every row's position count times `bytes_per_token` (the seed's
    /// `byteLength`; padding and spare capacity are not counted).
    pub fn byte_length(&self) -> usize {
        self.row_offsets().iter().sum::<usize>() * self.bytes_per_token()
    }

    pub fn signature(&self) -> String {
        self.geometry.signature()
    }

    /// Positions the next append may take before `max_tokens`, or, with composed storage
    /// outside a round, before some row's precision boundary moves (whichever comes first). An
    /// append of more still succeeds: a boundary move copies nothing.
    pub fn max_append_tokens(&self) -> usize {
        let limit = self.layout.max_append_tokens(self.geometry.max_tokens);
        match self.batch_size() {
            0 => limit,
            _ => limit.min(self.appendable_before_conversion()),
        }
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

    /// Trimming only moves the offset, so the cache is always trimmable.
    pub fn is_trimmable(&self) -> bool {
        true
    }

    pub fn in_spec_round(&self) -> bool {
        self.layout.in_round()
    }

    /// The width of a family on this layer, or the index-key rejection.
    fn width(&self, family: Family) -> Result<usize> {
        self.geometry.width(family).ok_or_else(no_index_keys)
    }

    /// Checks one input array and returns its `(batch, tokens)`.
    fn check_input(&self, family: Family, array: &Array) -> Result<(usize, usize)> {
        let width = self.geometry.width(family).expect("checked by caller");
        let name = family.name();
        if !matches!(array.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16) {
            return fail!(Dtype, "{name} must be float32, bfloat16 or float16, got {:?}", array.dtype());
        }
        let shape = array.shape();
        if shape.len() != 3 {
            return fail!(Shape, "{name} must be [batch, tokens, {width}], got rank {}", shape.len());
        }
        if shape[2] as usize != width {
            return fail!(Shape, "{name} must be {width} wide, got {shape:?}");
        }
        Ok((shape[0] as usize, shape[1] as usize))
    }

    /// Validates the arrays of an append; returns `(batch, tokens)`.
    fn check_arrays(&self, latent: &Array, rope: &Array, index_keys: Option<&Array>) -> Result<(usize, usize)> {
        let dims = self.check_input(Family::Latent, latent)?;
        let rope_dims = self.check_input(Family::Rope, rope)?;
        if rope_dims != dims {
            return fail!(Shape, "rope is {rope_dims:?} (batch, tokens) but latent is {dims:?}");
        }
        match (index_keys, self.geometry.has_index_keys()) {
            (Some(keys), true) => {
                let key_dims = self.check_input(Family::IndexKeys, keys)?;
                if key_dims != dims {
                    return fail!(Shape, "index_keys are {key_dims:?} (batch, tokens) but latent is {dims:?}");
                }
            }
            (None, true) => return fail!(InvalidArgument, "this DSA layer needs index_keys with every append"),
            (Some(_), false) => return Err(no_index_keys()),
            (None, false) => {}
        }
        Ok(dims)
    }

    /// Checks where an append of `batch x tokens` may go: after every row's end, or (a padded
    /// first append) as a fresh batch whose row `b` starts after `left_pad[b]` padding positions.
    fn check_placement(&self, batch: usize, tokens: usize, left_pad: Option<&[usize]>) -> Result<()> {
        match left_pad {
            None => self.layout.check_append(batch, tokens, self.geometry.max_tokens),
            Some(pad) => self.layout.check_append_padded(batch, tokens, pad, self.geometry.max_tokens),
        }
    }

    /// Records a checked append in `layout`.
    fn record_in(layout: &mut RowLayout, batch: usize, tokens: usize, left_pad: Option<&[usize]>) {
        match left_pad {
            None => layout.append(batch, tokens),
            Some(pad) => layout.append_padded(tokens, pad),
        }
    }

    /// Commits a prepared append: the stored families, the hot side, the layout after it.
    fn commit_append(&mut self, pending: Pending, hot: Option<HotChange>, after: RowLayout) {
        self.storage.commit(pending);
        if let (Some(side), Some(change)) = (&mut self.hot, hot) {
            side.apply(change);
        }
        self.layout = after;
        self.settle();
    }

    /// Prepares the write of a checked append: each row's new positions at its end.
    fn prepare_write(&self, updates: Families<&Array>, batch: usize, tokens: usize) -> Result<Pending> {
        let starts = self.layout.append_starts(batch);
        let limits = (self.geometry.max_tokens, self.reserved);
        self.storage.prepare_append(updates, batch, self.layout.offset(), &starts, tokens, limits)
    }

    /// Appends `tokens` positions to every row, each at its own end (the right end of the
    /// window when rows are right-justified), atomically for all families, and returns the
    /// values of everything stored (see `LatentState`). Inputs are borrowed `[B, N, width]`
    /// float32, bfloat16 or float16, converted to each family's storage mode (only the new
    /// positions are converted).
    /// The write is lazy; growing the buffers allocates during the call (`reserve` avoids it).
    /// Release the returned views before the next append, or that append copies the buffers.
    pub fn append_latent(&mut self, latent: &Array, rope: &Array, index_keys: Option<&Array>) -> Result<LatentState> {
        Ok(self.append_inner(latent, rope, index_keys, None, true)?.expect("views were asked for"))
    }

    /// `append_latent` without building the returned values: for engines that read the stored
    /// parts (`packed`) or nothing this step (a quantized mode's decode is never built).
    pub fn append(&mut self, latent: &Array, rope: &Array, index_keys: Option<&Array>) -> Result<()> {
        self.append_inner(latent, rope, index_keys, None, false).map(drop)
    }

    /// The general append: with `left_pad`, the first append of a padded batch (prompts of
    /// different lengths, as mlx-lm's `BatchKVCache(left_padding)`): row `b`'s first
    /// `left_pad[b]` positions are padding, so `row_offsets[b] = tokens - left_pad[b]`; only on
    /// an empty cache, outside a round, with at least one row unpadded. Returns the values of
    /// everything stored when `views` asks for them.
    pub fn append_with(
        &mut self,
        left_pad: Option<&[usize]>,
        latent: &Array,
        rope: &Array,
        index_keys: Option<&Array>,
        views: bool,
    ) -> Result<Option<LatentState>> {
        self.append_inner(latent, rope, index_keys, left_pad, views)
    }

    fn append_inner(
        &mut self,
        latent: &Array,
        rope: &Array,
        index_keys: Option<&Array>,
        left_pad: Option<&[usize]>,
        views: bool,
    ) -> Result<Option<LatentState>> {
        let prepared = self.prepared_left_pad();
        let left_pad = left_pad.or(prepared.as_deref());
        let (batch, tokens) = self.check_arrays(latent, rope, index_keys)?;
        self.check_prefill_batch(batch)?;
        self.check_placement(batch, tokens, left_pad)?;
        let updates = Families { latent, rope, index_keys };
        let pending = self.prepare_write(updates.clone(), batch, tokens)?;
        let mut after = self.layout.clone();
        Self::record_in(&mut after, batch, tokens, left_pad);
        let hot = self.prepare_hot_append(updates, batch, tokens, &after)?;
        // Built before the commit, so a failure here leaves the cache as it was.
        let views = match (&hot, views) {
            (_, false) => None,
            (Some(hot), true) => Some(self.composed_views(&pending, hot, &after)?),
            (None, true) => Some(self.storage.pending_views(&pending, after.offset())?),
        };
        self.commit_append(pending, hot, after);
        Ok(views)
    }

    /// Copies host data in and appends it, evaluated before the call returns (so the caller's
    /// buffers may be reused at once); a failed evaluation leaves the cache as it was. Lengths
    /// must equal `batch * tokens * width` of each family.
    pub fn append_host(
        &mut self,
        batch: usize,
        tokens: usize,
        latent: &[f32],
        rope: &[f32],
        index_keys: Option<&[f32]>,
    ) -> Result<()> {
        self.append_host_inner(batch, tokens, None, latent, rope, index_keys)
    }

    /// `append_host` as the first append of a padded batch (see `append_latent_padded`).
    pub fn append_host_padded(
        &mut self,
        batch: usize,
        tokens: usize,
        left_pad: &[usize],
        latent: &[f32],
        rope: &[f32],
        index_keys: Option<&[f32]>,
    ) -> Result<()> {
        self.append_host_inner(batch, tokens, Some(left_pad), latent, rope, index_keys)
    }

    fn append_host_inner(
        &mut self,
        batch: usize,
        tokens: usize,
        left_pad: Option<&[usize]>,
        latent: &[f32],
        rope: &[f32],
        index_keys: Option<&[f32]>,
    ) -> Result<()> {
        self.check_prefill_batch(batch)?;
        let prepared = self.prepared_left_pad();
        let left_pad = left_pad.or(prepared.as_deref());
        self.check_placement(batch, tokens, left_pad)?;
        let to_array = |family: Family, data: &[f32]| -> Result<Array> {
            ops::from_host(data, &[batch, tokens, self.width(family)?], family.name())
        };
        let latent = to_array(Family::Latent, latent)?;
        let rope = to_array(Family::Rope, rope)?;
        let index_keys = index_keys.map(|data| to_array(Family::IndexKeys, data)).transpose()?;
        self.check_arrays(&latent, &rope, index_keys.as_ref())?;
        // Whatever an earlier call left unevaluated is evaluated first: if that fails (say, an
        // engine's array built on another thread's stream), nothing has changed yet.
        self.eval()?;
        let updates = Families { latent: &latent, rope: &rope, index_keys: index_keys.as_ref() };
        let pending = self.prepare_write(updates.clone(), batch, tokens)?;
        let mut after = self.layout.clone();
        Self::record_in(&mut after, batch, tokens, left_pad);
        let hot = self.prepare_hot_append(updates, batch, tokens, &after)?;
        // Committed before it is evaluated: while the cache still held the old buffer, MLX
        // could not write in place and would copy the whole history.
        let before = self.layout.clone();
        let converted = self.converted_positions();
        // A rebuilt hot side drops positions only the old boundaries read hot: keep the old one
        // (shared, not copied) until the append is evaluated.
        let replaced = hot.as_ref().is_some_and(|h| h.replace.is_some());
        let old_hot = self.hot.as_ref().filter(|_| replaced).map(|h| (h.storage.clone(), h.bases.clone()));
        self.commit_append(pending, hot, after);
        if let Err(err) = self.eval() {
            // The write lies beyond every row's end, so the old layout, boundaries and hot side
            // show exactly the old state again (the unevaluated write is retried by the next
            // evaluation).
            self.layout = before;
            if let Some(hot) = &mut self.hot {
                hot.converted = converted;
                if let Some((storage, bases)) = old_hot {
                    (hot.storage, hot.bases) = (storage, bases);
                }
            }
            if self.layout.batch_size() == 0 {
                self.storage.clear();
                if let Some(hot) = &mut self.hot {
                    hot.clear();
                }
            }
            return Err(err);
        }
        Ok(())
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        self.storage.eval()?;
        match &self.hot {
            Some(hot) => hot.storage.eval(),
            None => Ok(()),
        }
    }

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
    pub fn storage_mode(&self, family: Family) -> Result<crate::core::StorageMode> {
        self.width(family)?;
        Ok(self.geometry.storage(family))
    }

    /// Views of one family's stored parts `[B, T, part_width]` as its mode holds them (see
    /// `codec::StorageMode::parts`): the values for the float modes; codes, scales (and
    /// biases) for the quantized ones, for MLX's quantized matmul. No copy, no decode.
    pub fn packed(&self, family: Family) -> Result<Vec<Array>> {
        self.width(family)?;
        self.storage.packed(family, self.layout.offset())
    }

    /// Drops the last `n` positions of every row; returns `n`. Moves the offset, copies nothing.
    pub fn trim(&mut self, n: usize, bypass: bool) -> Result<usize> {
        let change = self.prepare_trim(n, bypass)?;
        self.apply(change);
        Ok(n)
    }

    /// Empties the cache (rows, positions, round, prefills, reservation), keeping its geometry.
    pub fn reset(&mut self) {
        self.layout.reset();
        self.reserved = 0;
        self.prefill = None;
        self.maintaining = false;
        self.storage.clear();
        if let Some(hot) = &mut self.hot {
            hot.clear();
        }
    }

    /// Makes room for `tokens` positions per row now, so appends up to that length never
    /// reallocate: allocated during the call on a cache holding rows; on an empty cache (batch
    /// size unknown) checked for one row now and allocated by the first append.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        let change = self.prepare_reserve(tokens)?;
        self.apply(change);
        Ok(())
    }

    /// Row `row`'s valid positions of one family, row-major `[row_offsets[row], width]`.
    pub fn read_row(&self, family: Family, row: usize) -> Result<Vec<f32>> {
        self.width(family)?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        self.read_span(family, row, self.layout.left_pad()[row], self.layout.row_ends()[row])
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
        let mut out = Vec::new();
        for row in 0..self.batch_size() {
            out.extend(self.read_span(family, row, 0, self.layout.offset())?);
        }
        Ok(out)
    }
}
