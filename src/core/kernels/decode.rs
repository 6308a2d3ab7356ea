//! The split-K decode's sizes, as each backend's kernel (`cuda::mla_decode`,
//! `metal::mla_decode`) judges whether it applies: one type for both, so that callers describe
//! an attention once whichever GPU computes it; and the switch of both kernels' reading of a
//! DSA selection through its indices.

use crate::core::kernels::launch::Switch;

/// Whether the decode kernels read a DSA decode step's selected positions through the indices
/// (on by default); off, each stored part's selected positions are gathered first and the kernel
/// reads the gathered copy (the earlier path, which benchmarks compare with).
pub static THROUGH_INDICES: Switch = Switch::new();

/// An attention's sizes and scale, as the decode kernels' `applies` judge them.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    pub batch: usize,
    pub heads: usize,
    pub queries: usize,
    /// Window positions (the stored offset).
    pub positions: usize,
    pub rank: usize,
    pub rope: usize,
    /// The scores' scale: compiled into the CUDA kernel (see its `SCALES`), an input of Metal's.
    pub scale: f32,
}
