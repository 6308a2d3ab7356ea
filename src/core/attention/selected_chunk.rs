//! `attend_selected` for a prefill chunk on a GPU: many queries in one row, each with its own
//! selection. The split-K kernels read selected positions through their indices one query a
//! row (`kernel_selected`); here each query of the chunk becomes a row of its own, so the kernel
//! reads each query's `k` selected positions and nothing else, where MLX's operations gather
//! `Lq x k` positions first (at GLM-5.2's chunk of 2048 queries and top-2048, 4.8 GB a layer).
//! Nothing is copied to make the rows: the queries are a transposed view, the stored parts a
//! broadcast view (stride 0), and the selection a reshape. The CUDA kernel and the Metal one
//! (Apple GPUs, float storage) take the same rows; each masks a selected position outside its
//! row's bounds.
use mlx_rs::Array;

use super::on_kernels::KernelInputs;
use super::{Donor, MaskMode, Query};
use crate::core::error::Result;
use crate::core::kernels::{cuda, decode, metal};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;

impl Donor {
    /// `attend_selected` of `Lq > 1` queries of one row that spans the window (no padding) by
    /// the CUDA or Metal kernel: query `i` sees the stored positions before `offset - Lq + i + 1`
    /// under `Causal` (every stored position under `None`), and a selected position it does not
    /// see is masked in the kernel (the kernel's bounds over the stored positions a selection
    /// names). `None` where it does not apply (several rows, padded or short rows, composed
    /// storage, packed storage on Apple GPUs, MLX's ops).
    pub(super) fn kernel_selected_chunk(
        &self,
        q_latent: &Array,
        q_rope: &Array,
        scale: f32,
        mode: MaskMode,
        indices: &Array,
    ) -> Result<Option<Array>> {
        let shape = indices.shape();
        let (batch, queries, k) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let Some((storage, packing)) = self.kernel_storage() else { return Ok(None) };
        // The chunk's queries as the kernels take queries (`kernel_takes`: every query seeing a
        // position, one dtype, the rope not composed), over one row spanning the window.
        let query = Query { q_latent, q_rope, scale, mode, extra: None, queries };
        let spans = self.row_ranges() == [(0, self.offset)];
        if batch != 1 || queries < 2 || !spans || self.hot_values(Family::Latent).is_some() {
            return Ok(None);
        }
        if !decode::THROUGH_INDICES.enabled() || !self.kernel_takes(&query) {
            return Ok(None);
        }
        // The kernel's sizes with each query a row of its own, over its k selected positions.
        // On Apple GPUs MLX passes an input of fewer than 8 values in another address space (a
        // kernel compiled apart from the probed one): at least 8 selected positions in all.
        let kernel = KernelInputs { storage, packing, q: &query };
        let rows_shape = cuda::mla_decode::Shape { batch: queries, queries: 1, ..kernel.shape(self, k) };
        let on_metal = packing.is_none()
            && queries * k >= 8
            && metal::mla_decode::applies(storage, q_latent.dtype(), &rows_shape, false, true);
        if !on_metal && !kernel.applies_at(&rows_shape) {
            return Ok(None);
        }
        // Each query a row: [1, H, Lq, w] viewed as [Lq, H, 1, w]; each stored part broadcast
        // over the Lq rows; the selection [1, Lq, k] as [Lq, 1, k].
        let rows = |q: &Array| math::swapaxes(q, 0, 2);
        let over_rows = |part: &Array| {
            let s = part.shape();
            ops::broadcast_to(part, &[queries, s[1] as usize, s[2] as usize])
        };
        let parts = self.parts(Family::Latent).iter().map(over_rows).collect::<Result<Vec<Array>>>()?;
        let rope = over_rows(&self.parts(Family::Rope)[0])?;
        let selected = ops::reshape(indices, &[queries, 1, k])?;
        // Causal: query i sees the stored positions before offset - Lq + i + 1 (a bound each,
        // `padding_queries` above made sure every query sees one).
        let causal = || (0..queries).map(|i| (0, self.offset + 1 + i - queries)).collect();
        let (q_latent, q_rope) = (rows(q_latent)?, rows(q_rope)?);
        let out = match on_metal {
            // The Metal kernel bounds every row: under `None`, by all the stored positions.
            true => {
                let seen = match mode {
                    MaskMode::Causal => causal(),
                    _ => vec![(0, self.offset); queries],
                };
                metal::mla_decode::attend_selected(&q_latent, &q_rope, &parts[0], &rope, &selected, &seen, scale)?
            }
            // The CUDA kernel's bounds are optional: under `None` the whole selection, no bounds
            // (no host array, no mask).
            false => {
                let ranges = match mode {
                    MaskMode::Causal => causal(),
                    _ => vec![(0, k); queries],
                };
                let latent = kernel.read(&parts);
                let pass = cuda::mla_decode::Pass {
                    latent,
                    rope: &rope,
                    ranges,
                    causal: false,
                    shared: false,
                    selected: Some(&selected),
                };
                cuda::mla_decode::attend_passes(&q_latent, &q_rope, &[pass], scale)?
            }
        };
        Ok(Some(rows(&out)?))
    }
}
