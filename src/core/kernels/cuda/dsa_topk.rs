//! DSA's top-k selection in one operation on MLX's CUDA backend: the `k` window positions with
//! the highest index scores per query, by radix select, where MLX's `argpartition` sorts every
//! row (it is a sort on MLX's CUDA backend) and the selection then takes a slice and a cast:
//! three graph operations. MLX's operations remain the fallback and the reference
//! (`Donor::select`), and take rows longer than `dsa::TOPK_MAX_POSITIONS`.
//!
//! One block per (row, query) reads the scores five times: three passes count the keys by 11,
//! 11 and 10 bits of their order-preserving unsigned form and find the k-th largest exactly;
//! two more, each warp over its own stretch, count and write the positions above it and the
//! first ties by position. The result is the positions above the k-th largest score in order,
//! then the ties at it in order: a function of the scores alone.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, kernel};
use crate::core::kernels::dsa::topk_fits;
use crate::core::kernels::launch::{Launch, Source, Switch};

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Threads per block (as in the source): 1024 asks more registers than a multiprocessor has.
const THREADS: i32 = 512;

/// Whether the kernel selects `k` of `positions` float32 scores for `batch` rows of `queries`
/// queries: on CUDA, `k` below the positions (the caller attends densely otherwise), at most
/// `dsa::TOPK_MAX_POSITIONS` positions, sizes within a launch (`dsa::topk_fits`).
pub fn applies(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    KERNEL.enabled() && launch::on_cuda() && topk_fits(scores, batch, queries, positions, k)
}

/// Template `K`. Input `scores [B, Lq, T]` float32 (a view, any strides); output `top [B, Lq,
/// K]` int32.
const TOPK: &str = include_str!("src/dsa_topk.cu");

static TOPK_KERNEL: Source =
    Source { name: "latent_cache_dsa_topk", inputs: &["scores"], outputs: &["top"], header: "", body: TOPK, contiguous: false };

/// The `k` positions of highest score per query, `[B, Lq, k]` int32, lazily. Callers check
/// `applies` first.
pub(crate) fn top_k(scores: &Array, k: usize) -> Result<Array> {
    let s = scores.shape();
    let (batch, queries) = (s[0], s[1]);
    let out = apply(
        kernel(&TOPK_KERNEL, 0)?,
        &[scores],
        Launch {
            outputs: &[(&[batch, queries, k as i32], Dtype::Int32)],
            grid: [THREADS, queries, batch],
            block: [THREADS, 1, 1],
            ints: &[("K", k as i32)],
            bools: &[],
        },
    )?;
    KERNEL.launched();
    Ok(out.into_iter().next().expect("one output"))
}
