//! `LatentCache`: one MLA layer's cache. Ties the geometry, the row layout and the three family
//! buffers together, and validates every input before changing anything.
use mlx_rs::{Array, Dtype};

use super::error::{fail, CacheError, ErrorKind, Result};
use super::geometry::{Family, Geometry};
use super::layout::{Relayout, Rollback, RowLayout};
use super::mlx_ops;
use super::storage::{FamilyBuffer, Pending, Piece, MIN_CAPACITY};

/// The rejection of any index-key access on a layer without DSA.
fn no_index_keys() -> CacheError {
    CacheError::new(ErrorKind::InvalidArgument, "this layer has no DSA index keys (index_head_dim is 0)")
}

/// Views of everything stored, as returned by an append and by `state`.
pub struct LatentState {
    /// `[B, T, kv_lora_rank]`
    pub latent: Array,
    /// `[B, T, rope_head_dim]`
    pub rope: Array,
    /// `[B, T, index_head_dim]` on a DSA layer.
    pub index_keys: Option<Array>,
}

#[derive(Debug)]
pub struct LatentCache {
    geometry: Geometry,
    layout: RowLayout,
    latent: FamilyBuffer,
    rope: FamilyBuffer,
    index_keys: Option<FamilyBuffer>,
    /// Positions per row the engine asked to have room for (see `reserve`).
    reserved: usize,
}

impl LatentCache {
    pub fn new(geometry: Geometry) -> Result<Self> {
        geometry.validate()?;
        Ok(LatentCache {
            geometry,
            layout: RowLayout::default(),
            latent: FamilyBuffer::new(geometry.kv_lora_rank),
            rope: FamilyBuffer::new(geometry.rope_head_dim),
            index_keys: geometry.has_index_keys().then(|| FamilyBuffer::new(geometry.index_head_dim)),
            reserved: 0,
        })
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

    pub fn bytes_per_token(&self) -> usize {
        self.geometry.bytes_per_token()
    }

    pub fn signature(&self) -> String {
        self.geometry.signature()
    }

    pub fn max_append_tokens(&self) -> usize {
        self.layout.max_append_tokens(self.geometry.max_tokens)
    }

    /// f32 storage is exact at every position, so any prefix can resume generation.
    pub fn minimum_reusable_offset(&self) -> usize {
        0
    }

    /// Trimming only moves the offset, so the cache is always trimmable.
    pub fn is_trimmable(&self) -> bool {
        true
    }

    pub fn in_spec_round(&self) -> bool {
        self.layout.in_round()
    }

    fn buffers(&self) -> impl Iterator<Item = &FamilyBuffer> {
        [Some(&self.latent), Some(&self.rope), self.index_keys.as_ref()].into_iter().flatten()
    }

    fn buffers_mut(&mut self) -> impl Iterator<Item = &mut FamilyBuffer> {
        [Some(&mut self.latent), Some(&mut self.rope), self.index_keys.as_mut()].into_iter().flatten()
    }

    fn buffer(&self, family: Family) -> Result<&FamilyBuffer> {
        match family {
            Family::Latent => Ok(&self.latent),
            Family::Rope => Ok(&self.rope),
            Family::IndexKeys => match &self.index_keys {
                Some(buffer) => Ok(buffer),
                None => Err(no_index_keys()),
            },
        }
    }

    /// Commits prepared buffers for every family at once (in `Family::ALL` order, index keys
    /// only on DSA layers). Cannot fail, so callers prepare everything first.
    fn commit(&mut self, pending: Vec<Pending>) {
        let mut pending = pending.into_iter();
        for buffer in self.buffers_mut() {
            buffer.commit(pending.next().expect("one pending buffer per family"));
        }
    }

    /// Checks one input array and returns its `(batch, tokens)`.
    fn check_input(&self, family: Family, array: &Array) -> Result<(usize, usize)> {
        let width = self.geometry.width(family).expect("checked by caller");
        let name = family.name();
        if array.dtype() != Dtype::Float32 {
            return fail!(Dtype, "{name} must be float32, got {:?}", array.dtype());
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

    /// Validates an append of the given arrays; returns `(batch, tokens)`.
    fn check_append(&self, latent: &Array, rope: &Array, index_keys: Option<&Array>) -> Result<(usize, usize)> {
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
        self.layout.check_append(dims.0, dims.1, self.geometry.max_tokens)?;
        Ok(dims)
    }

    /// Appends `tokens` positions to every row at the right end, atomically for all families,
    /// and returns views of everything stored. Inputs are borrowed `[B, N, width]` float32.
    /// Release the returned views before the next append, or that append copies the buffers.
    pub fn append_latent(&mut self, latent: &Array, rope: &Array, index_keys: Option<&Array>) -> Result<LatentState> {
        let (batch, tokens) = self.check_append(latent, rope, index_keys)?;
        let offset = self.layout.offset();
        let max_tokens = self.geometry.max_tokens;
        let reserved = self.reserved;
        let write = |buffer: &FamilyBuffer, update: &Array| {
            buffer.prepare_write(update, batch, offset, tokens, max_tokens, reserved)
        };
        let mut pending = vec![write(&self.latent, latent)?, write(&self.rope, rope)?];
        if let (Some(buffer), Some(keys)) = (&self.index_keys, index_keys) {
            pending.push(write(buffer, keys)?);
        }
        self.commit(pending);
        self.layout.append(batch, tokens);
        self.state()
    }

    /// Copies host data in and appends it; evaluates the result so the caller's buffers may be
    /// reused at once. Lengths must equal `batch * tokens * width` of each family.
    pub fn append_host(&mut self, batch: usize, tokens: usize, latent: &[f32], rope: &[f32], index_keys: Option<&[f32]>) -> Result<()> {
        self.layout.check_append(batch, tokens, self.geometry.max_tokens)?;
        let to_array = |family: Family, data: &[f32]| -> Result<Array> {
            // Index keys on a layer without them are rejected here, with buffer()'s message.
            let width = self.buffer(family)?.width();
            let expected = batch.checked_mul(tokens).and_then(|n| n.checked_mul(width));
            if expected != Some(data.len()) {
                return fail!(Shape, "{} has {} floats; batch {batch} x tokens {tokens} x width {width} needs {}", family.name(), data.len(),
                    expected.map_or("more than fits in size_t".to_string(), |n| n.to_string()));
            }
            Ok(Array::from_slice(data, &[batch as i32, tokens as i32, width as i32]))
        };
        let latent = to_array(Family::Latent, latent)?;
        let rope = to_array(Family::Rope, rope)?;
        // append_latent reports keys missing on a DSA layer.
        let index_keys = index_keys.map(|data| to_array(Family::IndexKeys, data)).transpose()?;
        drop(self.append_latent(&latent, &rope, index_keys.as_ref())?);
        self.eval()
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        mlx_ops::eval(self.buffers().filter_map(FamilyBuffer::data))
    }

    /// The index keys stored before the coming append: `[B, T, index_head_dim]`, or
    /// `[0, 0, index_head_dim]` before the first append. An error on a layer without DSA.
    pub fn stored_index_keys(&self) -> Result<Array> {
        self.buffer(Family::IndexKeys)?.view(self.layout.offset())
    }

    /// Views of every stored family.
    pub fn state(&self) -> Result<LatentState> {
        let offset = self.layout.offset();
        Ok(LatentState {
            latent: self.latent.view(offset)?,
            rope: self.rope.view(offset)?,
            index_keys: self.index_keys.as_ref().map(|b| b.view(offset)).transpose()?,
        })
    }

    /// Drops the last `n` positions of every row; returns `n`. Moves the offset, copies nothing.
    pub fn trim(&mut self, n: usize, bypass: bool) -> Result<usize> {
        self.layout.check_trim(n, bypass)?;
        self.layout.trim(n);
        Ok(n)
    }

    /// Empties the cache (rows, positions, round, reservation), keeping its geometry.
    pub fn reset(&mut self) {
        self.layout.reset();
        self.reserved = 0;
        self.buffers_mut().for_each(FamilyBuffer::clear);
    }

    /// Makes room for `tokens` positions per row, so appends up to that length never reallocate.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        let max = self.geometry.max_tokens;
        if tokens > i32::MAX as usize || (max != 0 && tokens > max) {
            return fail!(Capacity, "cannot reserve {tokens} positions (max_tokens {max})");
        }
        let (rows, offset) = (self.batch_size(), self.offset());
        let mut pending = Vec::new();
        for buffer in self.buffers() {
            match buffer.prepare_reserve(rows, tokens, offset)? {
                Some(p) => pending.push(p),
                None => break,
            }
        }
        if pending.len() == self.buffers().count() {
            self.commit(pending);
        }
        self.reserved = self.reserved.max(tokens);
        Ok(())
    }

    /// Row `row`'s valid positions of one family, row-major `[row_offsets[row], width]`.
    pub fn read_row(&self, family: Family, row: usize) -> Result<Vec<f32>> {
        let buffer = self.buffer(family)?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        buffer.read_row(row, self.layout.left_pad()[row], self.layout.offset())
    }

    /// The whole stored window of one family, `[B, T, width]` row-major; padding positions
    /// (before a row's `left_pad`) hold unspecified values.
    pub fn read(&self, family: Family) -> Result<Vec<f32>> {
        let buffer = self.buffer(family)?;
        let mut out = Vec::new();
        for row in 0..self.batch_size() {
            out.extend(buffer.read_row(row, 0, self.layout.offset())?);
        }
        Ok(out)
    }

    // ---- speculative rounds -------------------------------------------------------------

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
            Rollback::Relayout(plan) => self.apply_relayout(&plan)?,
        }
        Ok(())
    }

    /// Rollback with one keep count for every row.
    pub fn spec_round_rollback_all(&mut self, keep: usize) -> Result<()> {
        self.spec_round_rollback(&vec![keep; self.batch_size()])
    }

    // ---- batch rows ---------------------------------------------------------------------

    fn apply_relayout(&mut self, plan: &Relayout) -> Result<()> {
        let new = &plan.layout;
        let capacity = self.latent.capacity().max(new.offset());
        fn pieces<'a>(source: &'a FamilyBuffer, plan: &Relayout) -> Vec<Piece<'a>> {
            let new = &plan.layout;
            (0..plan.rows.len())
                .map(|b| {
                    let lo = new.left_pad()[b];
                    let at = |pos: usize| (pos as isize + plan.shift[b]) as usize;
                    Piece { source, row: plan.rows[b], lo: at(lo), hi: at(new.offset()), dest_row: b, dest_lo: lo }
                })
                .collect()
        }
        let mut pending = Vec::new();
        for buffer in self.buffers() {
            pending.push(FamilyBuffer::prepare_assemble(buffer.width(), plan.rows.len(), capacity, &pieces(buffer, plan))?);
        }
        self.commit(pending);
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
        let (lo, hi) = (self.layout.left_pad()[row], self.layout.offset());
        out.fill_from(&[(self, row, lo, hi)], &[hi - lo])?;
        Ok(out)
    }

    /// Fills this empty cache from `(source, row, lo, hi)` pieces, one per new row, with the
    /// given row lengths (right-justified).
    fn fill_from(&mut self, rows: &[(&LatentCache, usize, usize, usize)], lengths: &[usize]) -> Result<()> {
        let layout = RowLayout::from_row_offsets(lengths);
        let mut capacity = layout.offset() + MIN_CAPACITY;
        if self.geometry.max_tokens != 0 {
            capacity = capacity.min(self.geometry.max_tokens).max(layout.offset());
        }
        let mut pending = Vec::new();
        for family in Family::ALL {
            let Some(width) = self.geometry.width(family) else { continue };
            let pieces: Vec<Piece<'_>> = rows
                .iter()
                .enumerate()
                .map(|(b, &(source, row, lo, hi))| Piece {
                    source: source.buffer(family).expect("same geometry"),
                    row,
                    lo,
                    hi,
                    dest_row: b,
                    dest_lo: layout.left_pad()[b],
                })
                .collect();
            pending.push(FamilyBuffer::prepare_assemble(width, rows.len(), capacity, &pieces)?);
        }
        self.commit(pending);
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
            if source.geometry.signature() != self.geometry.signature() {
                return fail!(InvalidArgument, "source {i} has geometry {} but the destination has {}", source.signature(), self.signature());
            }
            if source.batch_size() == 0 {
                rows.push((*source, 0, 0, 0));
                lengths.push(0);
            }
            for (row, &pad) in source.left_pad().iter().enumerate() {
                rows.push((*source, row, pad, source.offset()));
                lengths.push(source.offset() - pad);
            }
        }
        let longest = lengths.iter().copied().max().unwrap_or(0);
        if self.geometry.max_tokens != 0 && longest > self.geometry.max_tokens {
            return fail!(Capacity, "a merged row of {longest} positions exceeds max_tokens ({})", self.geometry.max_tokens);
        }
        self.fill_from(&rows, &lengths)
    }
}
