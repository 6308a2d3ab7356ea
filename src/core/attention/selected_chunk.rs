//! `attend_selected` for a prefill chunk on CUDA: many queries in one row, each with its own
//! selection. The split-K kernel reads selected positions through their indices one query a row
//! (`kernel_selected`); here each query of the chunk becomes a row of its own, so the kernel
//! reads each query's `k` selected positions and nothing else, where MLX's operations gather
//! `Lq x k` positions first (at GLM-5.2's chunk of 2048 queries and top-2048, 4.8 GB a layer).
//! Nothing is copied to make the rows: the queries are a transposed view, the stored parts a
//! broadcast view (stride 0), and the selection a reshape.
use mlx_rs::Array;

use super::{Donor, MaskMode};
use crate::core::error::Result;
use crate::core::kernels::{cuda, decode};
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::Family;
use crate::core::model::storage_mode::StorageMode;

impl Donor {
    /// `attend_selected` of `Lq > 1` queries of one row that spans the window (no padding) by
    /// the CUDA kernel: query `i` sees the stored positions before `offset - Lq + i + 1` under
    /// `Causal` (every stored position under `None`), and a selected position it does not see
    /// is masked in the kernel (the bounds are the kernel's `RANGES` over the selection). `None`
    /// where it does not apply (several rows, padded or short rows, composed storage, MLX's ops).
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
        let heads = q_latent.shape()[1] as usize;
        let spans = self.row_ranges() == [(0, self.offset)];
        let plain = self.hot_values(Family::Latent).is_none() && self.hot_values(Family::Rope).is_none();
        if batch != 1 || queries < 2 || !spans || !plain || !decode::THROUGH_INDICES.enabled() {
            return Ok(None);
        }
        if q_rope.dtype() != q_latent.dtype() || self.padding_queries(mode, queries) {
            return Ok(None);
        }
        let Some((storage, packing)) = StorageMode::kernel_reads(self.geometry.latent_storage, self.geometry.rope_storage) else {
            return Ok(None);
        };
        let sizes = cuda::mla_decode::Shape {
            batch: queries,
            heads,
            queries: 1,
            positions: k,
            rank: self.geometry.kv_lora_rank,
            rope: self.geometry.rope_head_dim,
            scale,
        };
        let applies = match packing {
            None => cuda::mla_decode::applies(storage, q_latent.dtype(), &sizes),
            Some(packing) => cuda::mla_decode::applies_packed(packing, q_latent.dtype(), &sizes),
        };
        if !applies {
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
        // `padding_queries` above made sure every query sees one). Otherwise every selected
        // position is seen: the whole selection, no bounds (no host array, no mask).
        let ranges = match mode {
            MaskMode::Causal => (0..queries).map(|i| (0, self.offset + 1 + i - queries)).collect(),
            _ => vec![(0, k); queries],
        };
        let latent = match packing {
            None => cuda::mla_decode::Latent::Float(&parts[0]),
            Some(packing) => cuda::mla_decode::Latent::Packed { parts: &parts, packing },
        };
        let pass =
            cuda::mla_decode::Pass { latent, rope: &rope, ranges, causal: false, shared: false, selected: Some(&selected) };
        let out = cuda::mla_decode::attend_passes(&rows(q_latent)?, &rows(q_rope)?, &[pass], scale)?;
        Ok(Some(rows(&out)?))
    }
}
