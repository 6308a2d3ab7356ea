//! Appends on `LatentCache`: checking the arrays and where they go, preparing the write of the
//! new positions (main storage and, when composed, the hot side), and committing it only once
//! everything that may fail has succeeded. `append_host` copies host data in and evaluates
//! before returning, restoring the old state if that evaluation fails.
use mlx_rs::{Array, Dtype};

use super::{no_index_keys, LatentCache, LatentState};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;
use crate::core::storage::buffers::Pending;
use crate::core::storage::hot::HotChange;

impl LatentCache {
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
            None => self.layout.check_append(batch, tokens, self.own_max_tokens()),
            Some(pad) => self.layout.check_append_padded(batch, tokens, pad, self.own_max_tokens()),
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
        self.keep_chain(false);
    }

    /// Prepares the write of a checked append: each row's new positions at its end.
    fn prepare_write(&self, updates: Families<&Array>, batch: usize, tokens: usize) -> Result<Pending> {
        let starts = self.layout.append_starts(batch);
        let limits = (self.own_max_tokens(), self.reserved);
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
    /// parts (`stored_parts`) or nothing this step (a packed mode's decode is never built).
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
        if views && self.base.is_some() {
            // Rows over a shared prefix read joined (a copy, see `shared`): built from the
            // committed state, of lazy operations that do not fail on valid shapes.
            self.commit_append(pending, hot, after);
            return Ok(Some(self.state()?));
        }
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
}
