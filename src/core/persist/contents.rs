//! A safetensors file's contents as this library builds and reads them: what a save writes
//! (`Contents`, which `save`, `hot` and `mlx_lm` add to) and a read tensor's extents as counts
//! (never narrowed). Apart from `save` and `load` so the formats' parts import neither.
use mlx_rs::Array;

use crate::core::error::Result;
use crate::core::persist::safetensors::Tensor;

/// What a save writes: tensors and metadata strings.
#[derive(Default)]
pub(super) struct Contents {
    pub(super) tensors: Vec<Tensor>,
    pub(super) metadata: Vec<(String, String)>,
    /// mlx-lm's scalar table: (tensor name, "scalar" | "string" | "none").
    pub(super) scalars: Vec<(String, &'static str)>,
}

impl Contents {
    /// Adds a tensor as it is (a view of the stored buffers): its checksum and the writer read
    /// it where it lies.
    pub(super) fn tensor(&mut self, name: String, a: Array) -> Result<()> {
        let shape = a.shape().to_vec();
        self.tensor_as(name, a, shape)
    }

    /// Adds a tensor the file holds under `shape` (a reshape keeping its row-major order).
    pub(super) fn tensor_as(&mut self, name: String, array: Array, shape: Vec<i32>) -> Result<()> {
        self.tensors.push(Tensor { name, array, shape });
        Ok(())
    }

    pub(super) fn scalar(&mut self, name: String, a: Array, kind: &'static str) -> Result<()> {
        self.scalars.push((name.clone(), kind));
        self.tensor(name, a)
    }
}

/// An array's extents as counts (MLX's are int32, never negative).
pub(super) fn extents(a: &Array) -> Vec<usize> {
    a.shape().iter().map(|&d| usize::try_from(d).unwrap_or(usize::MAX)).collect()
}
