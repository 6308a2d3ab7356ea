//! Attention over rows that lie in several runs of slots (`layout::slots`: a batch whose
//! requests joined and left in any order). Attention never mixes rows, so each run is a donor of
//! its own, read in place (one view per run, our kernels included), given its rows of every
//! batched input; the outputs are joined along the batch, which copies the outputs only
//! (`[B, H, Lq, kv_lora_rank]`, `[B, Lq, T]` scores), never the stored positions.
use mlx_rs::Array;

use super::Donor;
use crate::core::cache::LatentCache;
use crate::core::error::Result;
use crate::core::mlx::{math, ops};
use crate::core::model::families::Families;
use crate::core::storage::buffers::RunParts;
use crate::core::storage::hot::HotCapture;

impl Donor {
    /// One donor per run of `cache`'s rows, each over its run's views (`runs`, per family, in
    /// the same runs); none where the rows lie in one run.
    pub(super) fn run_donors(&self, cache: &LatentCache, runs: Families<Vec<RunParts>>) -> Result<Vec<(usize, Donor)>> {
        let bounds: Vec<(usize, usize)> = runs.latent.iter().map(|r| (r.row, r.rows)).collect();
        if bounds.len() < 2 {
            return Ok(Vec::new());
        }
        let mut per_run: Vec<Families<Vec<Array>>> = Vec::with_capacity(bounds.len());
        let mut runs = runs.map(|_, runs| runs.into_iter());
        for _ in &bounds {
            per_run.push(runs.as_mut().map(|_, it| it.next().expect("every family reads the same runs").parts));
        }
        bounds
            .into_iter()
            .zip(per_run)
            .map(|((row, rows), parts)| {
                let span = row..row + rows;
                let hot = match &self.hot {
                    None => None,
                    Some(hot) => Some(HotCapture {
                        bases: hot.bases[span.clone()].to_vec(),
                        starts: hot.starts[span.clone()].to_vec(),
                        values: hot
                            .values
                            .iter()
                            .map(|(f, v)| Ok((*f, ops::rows(v, row, row + rows)?)))
                            .collect::<Result<_>>()?,
                    }),
                };
                let donor = Donor {
                    geometry: self.geometry,
                    offset: self.offset,
                    left_pad: self.left_pad[span.clone()].to_vec(),
                    row_ends: self.row_ends[span].to_vec(),
                    parts,
                    hot,
                    alignment: Default::default(),
                    shared: cache.shared_prefix().map(|p| p.pieces().iter().map(|p| Donor::piece(self.geometry, p)).collect()),
                    runs: Vec::new(),
                };
                Ok((row, donor))
            })
            .collect()
    }

    /// `attention` of each run's donor over its rows of `inputs` (each `[B, ..]`, or `[1, ..]`
    /// broadcast over the rows, or absent), joined along the batch; `None` where the rows lie
    /// in one run (the caller attends them itself).
    pub(super) fn by_runs(
        &self,
        inputs: &[Option<&Array>],
        attention: impl Fn(&Donor, &[Option<Array>]) -> Result<Array>,
    ) -> Result<Option<Array>> {
        if self.runs.is_empty() {
            return Ok(None);
        }
        let batch = self.batch_size() as i32;
        let mut outs = Vec::with_capacity(self.runs.len());
        for (row, run) in &self.runs {
            let rows_of = |a: &Array| match a.shape()[0] == batch {
                true => ops::rows(a, *row, row + run.batch_size()),
                false => Ok(a.clone()),
            };
            let inputs = inputs.iter().map(|a| a.map(rows_of).transpose()).collect::<Result<Vec<_>>>()?;
            outs.push(attention(run, &inputs)?);
        }
        math::concatenate(&outs.iter().collect::<Vec<_>>(), 0).map(Some)
    }
}
