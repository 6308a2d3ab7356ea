//! Choosing and feeding our kernels (`kernels::cuda`, `kernels::metal`): which storage and
//! queries the split-K decode kernels take, the stored parts handed to them as stored (packed
//! latents included), composed storage's two passes, the selected positions of a DSA decode
//! step, the CUDA index-score kernel and the top-k kernels. Every path returns `None` where it
//! does not apply, and the caller falls back to MLX's operations (`dense`, `sparse`).
use mlx_rs::{Array, Dtype};

use super::{Donor, MaskMode, Query};
use crate::core::error::Result;
use crate::core::kernels::{cuda, decode, metal};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;
use crate::core::model::storage_mode::{Packing, StorageMode};

impl Donor {
    /// The latent's stored dtype (or packing) where the split-K kernels may read it: latent and
    /// rope in one 16-bit float or float32 dtype, or a Q8, Q4 or FP8 latent with bfloat16 rope.
    pub(super) fn kernel_storage(&self) -> Option<(Dtype, Option<Packing>)> {
        StorageMode::kernel_reads(self.geometry.latent_storage, self.geometry.rope_storage)
    }

    /// Whether the split-K kernels take `q` at all: no mask array, every query seeing a
    /// position, queries of one dtype, and a rope that is not composed (its hot and compact positions would need joining per row).
    pub(super) fn kernel_takes(&self, q: &Query) -> bool {
        q.extra.is_none()
            && q.mode != MaskMode::Array
            // Queries that see no position (a causal prefill over a shorter row) take MLX's ops.
            && !self.padding_queries(q.mode, q.queries)
            && self.hot_values(Family::Rope).is_none()
            && q.q_rope.dtype() == q.q_latent.dtype()
    }

    /// Attention on CUDA without a mask array over 16-bit float storage, or a Q8, Q4 or FP8
    /// latent with bfloat16 rope: the split-K kernel of `kernels::cuda::mla_decode`, which reads each stored
    /// position once for 64 head-query pairs (packed ones as stored, decoded tile by tile).
    /// Composed storage takes `kernel_composed`. `None` where it does not apply.
    pub(super) fn kernel_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, .. } = *q;
        // (Float32 storage is the Metal kernel's only: `applies` refuses it on CUDA.)
        let Some((storage, packing)) = self.kernel_storage() else { return Ok(None) };
        if !self.kernel_takes(q) {
            return Ok(None);
        }
        let kernel = KernelInputs { storage, packing, q };
        let (parts, rope) = (self.parts(Family::Latent), &self.parts(Family::Rope)[0]);
        if let Some(hot) = self.hot_values(Family::Latent) {
            return self.kernel_composed(&kernel, hot);
        }
        let Some(latent) = kernel.latent(parts, self.offset, self) else { return Ok(None) };
        cuda::mla_decode::attend(q_latent, q_rope, latent, rope, &self.row_ranges(), scale, mode == MaskMode::Causal).map(Some)
    }

    /// Attention on an Apple GPU without a mask array over float32, bfloat16 or float16 storage
    /// (latent and rope in the queries' dtype, not composed): the split-K kernel of
    /// `kernels::metal::mla_decode`. `None` where it does not apply.
    pub(super) fn metal_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, .. } = *q;
        let Some((storage, None)) = self.kernel_storage() else { return Ok(None) };
        if !self.kernel_takes(q) || self.hot_values(Family::Latent).is_some() {
            return Ok(None);
        }
        let (latent, rope) = (&self.parts(Family::Latent)[0], &self.parts(Family::Rope)[0]);
        let kernel = KernelInputs { storage, packing: None, q };
        let causal = mode == MaskMode::Causal;
        if !metal::mla_decode::applies(storage, q_latent.dtype(), &kernel.shape(self, self.offset), causal, false) {
            return Ok(None);
        }
        metal::mla_decode::attend(q_latent, q_rope, latent, rope, &self.row_ranges(), scale, causal).map(Some)
    }

    /// `kernel_decode` over composed storage: each row's compact positions (the packed latent,
    /// the stored rope) in one pass, its hot ones (the hot latent, the rope at the same
    /// positions) in another, one combine over both, so the row's softmax spans them. The rope
    /// is read in place where every row's hot row starts at the same window position (one row,
    /// or rows filled together); else each row's is sliced to its hot row (O(hot window) a row,
    /// never the history). `None` where a pass does not apply, where a row holds compact
    /// positions after its hot ones, or where a causal verify's first query would miss some of
    /// a row's compact positions (the compact pass is unmasked).
    fn kernel_composed(&self, k: &KernelInputs, (hot, bases, starts): (&Array, &[usize], &[usize])) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, queries, .. } = *k.q;
        let (batch, capacity) = (self.batch_size(), hot.shape()[1] as usize);
        let verify = mode == MaskMode::Causal && queries > 1;
        let (mut cold, mut warm) = (Vec::with_capacity(batch), Vec::with_capacity(batch));
        for (b, (lo, hi)) in self.row_ranges().into_iter().enumerate() {
            // Positions from `split` on are read hot, those before it compact.
            let split = starts[b].max(bases[b]).clamp(lo, hi);
            if (split < hi && hi > bases[b] + capacity) || (verify && split > lo && split + queries > hi + 1) {
                return Ok(None);
            }
            cold.push(if split > lo { (lo, split) } else { (0, 0) });
            warm.push(if split < hi { (split - bases[b], hi - bases[b]) } else { (0, 0) });
        }
        let (cold_len, hot_len) = (cold.iter().map(|r| r.1).max().unwrap_or(0), warm.iter().map(|r| r.1).max().unwrap_or(0));
        let rope = &self.parts(Family::Rope)[0];
        let rope_width = rope.shape()[2] as usize;
        let prefix = |a: &Array, len: usize| ops::slice(a, &[0, 0, 0], &[batch, len, a.shape()[2] as usize]);
        let cold_parts = self.parts(Family::Latent).iter().map(|p| prefix(p, cold_len)).collect::<Result<Vec<_>>>()?;
        let cold_rope = prefix(rope, cold_len)?;
        let hot_latent = prefix(hot, hot_len)?;
        let hot_rope = match bases.iter().all(|&base| base == bases[0]) {
            true => ops::slice(rope, &[0, bases[0], 0], &[batch, bases[0] + hot_len, rope_width])?,
            false => self.rope_at(rope, bases, hot_len)?,
        };
        let mut passes = Vec::with_capacity(2);
        if cold_len > 0 {
            let Some(latent) = k.latent(&cold_parts, cold_len, self) else { return Ok(None) };
            passes.push(cuda::mla_decode::Pass {
                latent,
                rope: &cold_rope,
                ranges: cold,
                causal: false,
                shared: false,
                selected: None,
            });
        }
        if hot_len > 0 {
            let shape = k.shape(self, hot_len);
            if !cuda::mla_decode::applies(hot.dtype(), q_latent.dtype(), &shape) {
                return Ok(None);
            }
            passes.push(cuda::mla_decode::Pass {
                latent: cuda::mla_decode::Latent::Float(&hot_latent),
                rope: &hot_rope,
                ranges: warm,
                causal: mode == MaskMode::Causal,
                shared: false,
                selected: None,
            });
        }
        cuda::mla_decode::attend_passes(q_latent, q_rope, &passes, scale).map(Some)
    }

    /// `kernel_decode` over rows that read a shared prefix (`shared`): one pass over each piece
    /// (its one row read once for every row's queries), one over the rows' own window, one
    /// combine, so each row's softmax spans its prefix and its own positions. On CUDA over the
    /// storage `kernel_decode` takes; `None` elsewhere (Metal included: MLX's operations), and
    /// where a causal query is itself a prefix position.
    pub(super) fn kernel_shared(&self, q: &Query, pieces: &[(&Donor, usize)]) -> Result<Option<Array>> {
        let Some((storage, packing)) = self.kernel_storage() else { return Ok(None) };
        if !self.kernel_takes(q) {
            return Ok(None);
        }
        let kernel = KernelInputs { storage, packing, q };
        let heads = q.q_latent.shape()[1] as usize;
        let mut passes = Vec::with_capacity(pieces.len() + 1);
        for (piece, _) in pieces {
            let shape =
                cuda::mla_decode::Shape { batch: 1, heads: self.batch_size() * heads, ..kernel.shape(self, piece.offset) };
            if !kernel.applies_at(&shape) {
                return Ok(None);
            }
            let latent = kernel.read(piece.parts(Family::Latent));
            let rope = &piece.parts(Family::Rope)[0];
            passes.push(cuda::mla_decode::Pass {
                latent,
                rope,
                ranges: vec![(0, piece.offset)],
                causal: false,
                shared: true,
                selected: None,
            });
        }
        if self.offset > 0 {
            let Some(latent) = kernel.latent(self.parts(Family::Latent), self.offset, self) else { return Ok(None) };
            let (rope, ranges) = (&self.parts(Family::Rope)[0], self.row_ranges());
            passes.push(cuda::mla_decode::Pass {
                latent,
                rope,
                ranges,
                causal: q.mode == MaskMode::Causal,
                shared: false,
                selected: None,
            });
        }
        cuda::mla_decode::attend_passes(q.q_latent, q.q_rope, &passes, q.scale).map(Some)
    }

    /// Each row's stored rope from its hot row's first window position on, `len` positions
    /// (zeros past the window), `[B, len, P]`.
    fn rope_at(&self, rope: &Array, bases: &[usize], len: usize) -> Result<Array> {
        let width = rope.shape()[2] as usize;
        let mut rows = Vec::with_capacity(bases.len());
        for (b, &base) in bases.iter().enumerate() {
            let take = len.min(self.offset.saturating_sub(base));
            let mut row = ops::slice(rope, &[b, base.min(self.offset), 0], &[b + 1, base.min(self.offset) + take, width])?;
            if take < len {
                row = math::concatenate(&[&row, &ops::zeros(&[1, len - take, width], rope.dtype())?], 1)?;
            }
            rows.push(row);
        }
        math::concatenate(&rows.iter().collect::<Vec<_>>(), 0)
    }

    /// `attend_selected` for a decode step (one query per row) whose rows each span the whole
    /// window, so that every position the indices can name is visible (no mask is needed): the
    /// split-K kernel over the selected positions as over a window of `k` positions. On CUDA
    /// (16-bit or packed latents) the kernel reads each selected position through the indices
    /// as it copies its tile in, so the step is the kernel's two operations and nothing is
    /// gathered; on Apple GPUs (float storage) likewise. `None` where it does not apply
    /// (composed storage, verify queries, padded or shorter rows: MLX's ops, which mask the
    /// selected positions a row lacks).
    pub(super) fn kernel_selected(&self, q_latent: &Array, q_rope: &Array, scale: f32, indices: &Array) -> Result<Option<Array>> {
        let shape = indices.shape();
        let (batch, queries, k) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let query = Query { q_latent, q_rope, scale, mode: MaskMode::None, extra: None, queries };
        if queries != 1 || self.row_ranges().iter().any(|&range| range != (0, self.offset)) {
            return Ok(None);
        }
        if !decode::THROUGH_INDICES.enabled() {
            // Gathered first (benchmarks compare the paths): each part's selected positions.
            let flat = self.within_window(&ops::reshape(indices, &[batch, k, 1])?)?;
            let gather = |family: Family| -> Result<Vec<Array>> {
                self.parts(family).iter().map(|part| math::take_along_axis(part, &flat, 1)).collect()
            };
            return self.kernel_gathered(&query, &gather(Family::Latent)?, &gather(Family::Rope)?[0], k);
        }
        let Some((kernel, on_metal)) = self.gathered_kernel(&query, k, true) else { return Ok(None) };
        let rope = &self.parts(Family::Rope)[0];
        if on_metal {
            // MLX passes an input of fewer than 8 values in another address space: a kernel
            // compiled apart from the probed one (MLX's ops instead).
            if batch * k < 8 {
                return Ok(None);
            }
            let latent = &self.parts(Family::Latent)[0];
            // A decode step's query sees every stored position its selection names.
            let every = vec![(0, latent.shape()[1] as usize); batch];
            return metal::mla_decode::attend_selected(q_latent, q_rope, latent, rope, indices, &every, scale).map(Some);
        }
        let Some(latent) = kernel.latent(self.parts(Family::Latent), k, self) else { return Ok(None) };
        let whole = vec![(0, k); batch];
        let pass = cuda::mla_decode::Pass { latent, rope, ranges: whole, causal: false, shared: false, selected: Some(indices) };
        cuda::mla_decode::attend_passes(q_latent, q_rope, &[pass], scale).map(Some)
    }

    /// The split-K kernel over `k` gathered positions a row (`latent`: the latent's stored parts,
    /// `rope`: the stored rope, `[B, k, width]` each), every one visible to the row's one query,
    /// as over a window of `k` positions (on CUDA over 16-bit or packed latents, on Apple GPUs
    /// over float storage). `None` where it does not apply.
    pub(super) fn kernel_gathered(&self, query: &Query, latent: &[Array], rope: &Array, k: usize) -> Result<Option<Array>> {
        match self.gathered_kernel(query, k, false) {
            Some(kernel) => self.run_gathered(kernel, latent, rope, k),
            None => Ok(None),
        }
    }

    /// Whether a kernel runs over `k` gathered positions a row for `query` (one query per row,
    /// the latent not composed), read through their indices (`through`) or gathered before:
    /// its inputs, and whether it is the Metal one.
    fn gathered_kernel<'q>(&self, query: &'q Query<'q>, k: usize, through: bool) -> Option<(KernelInputs<'q>, bool)> {
        if query.queries != 1 || self.hot_values(Family::Latent).is_some() || !self.kernel_takes(query) {
            return None;
        }
        let (storage, packing) = self.kernel_storage()?;
        let kernel = KernelInputs { storage, packing, q: query };
        let metal = packing.is_none()
            && metal::mla_decode::applies(storage, query.q_latent.dtype(), &kernel.shape(self, k), false, through);
        (metal || kernel.applies(self, k)).then_some((kernel, metal))
    }

    /// Runs the kernel `gathered_kernel` chose over the gathered positions.
    fn run_gathered(
        &self,
        (kernel, metal): (KernelInputs, bool),
        latent: &[Array],
        rope: &Array,
        k: usize,
    ) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, .. } = *kernel.q;
        let whole = vec![(0, k); self.batch_size()];
        if metal {
            return metal::mla_decode::attend(q_latent, q_rope, &latent[0], rope, &whole, scale, false).map(Some);
        }
        let Some(latent) = kernel.latent(latent, k, self) else { return Ok(None) };
        cuda::mla_decode::attend(q_latent, q_rope, latent, rope, &whole, scale, false).map(Some)
    }
}

/// What `kernel_decode` found: the latent's storage dtype (or its packing) and the query.
pub(super) struct KernelInputs<'a> {
    pub(super) storage: Dtype,
    pub(super) packing: Option<Packing>,
    pub(super) q: &'a Query<'a>,
}

impl KernelInputs<'_> {
    /// The kernel's sizes over `positions` positions of `donor`'s rows.
    pub(super) fn shape(&self, donor: &Donor, positions: usize) -> cuda::mla_decode::Shape {
        cuda::mla_decode::Shape {
            batch: donor.batch_size(),
            heads: self.q.q_latent.shape()[1] as usize,
            queries: self.q.queries,
            positions,
            rank: donor.geometry.kv_lora_rank,
            rope: donor.geometry.rope_head_dim,
            scale: self.q.scale,
        }
    }

    /// Whether the CUDA kernel reads this latent over `positions` positions of `donor`'s rows.
    fn applies(&self, donor: &Donor, positions: usize) -> bool {
        self.applies_at(&self.shape(donor, positions))
    }

    /// Whether the CUDA kernel reads this latent at `shape`.
    pub(super) fn applies_at(&self, shape: &cuda::mla_decode::Shape) -> bool {
        let dtype = self.q.q_latent.dtype();
        match self.packing {
            None => cuda::mla_decode::applies(self.storage, dtype, shape),
            Some(packing) => cuda::mla_decode::applies_packed(packing, dtype, shape),
        }
    }

    /// The latent's stored `parts` as the kernel reads them (callers check `applies_at`).
    pub(super) fn read<'p>(&self, parts: &'p [Array]) -> cuda::mla_decode::Latent<'p> {
        match self.packing {
            None => cuda::mla_decode::Latent::Float(&parts[0]),
            Some(packing) => cuda::mla_decode::Latent::Packed { parts, packing },
        }
    }

    /// The latent's stored `parts` (`positions` of them) as the kernel reads them, where it
    /// applies.
    fn latent<'p>(&self, parts: &'p [Array], positions: usize, donor: &Donor) -> Option<cuda::mla_decode::Latent<'p>> {
        self.applies(donor, positions).then(|| self.read(parts))
    }
}
