//! DSA's top-k selection on MLX's CUDA backend: the `k` window positions with the highest
//! index scores per query, by radix select, in two operations where MLX's `argpartition` sorts
//! every row (a sort on MLX's CUDA backend) and the selection then takes a slice and a cast. MLX's
//! operations remain the fallback and the reference (`Donor::select`).
//!
//! - `hist`: blocks of 4096 positions count every row's keys (the scores' order-preserving
//!   unsigned form) by their top 11 bits, summed into one histogram per (row, query).
//! - `select`: one block per (row, query) finds the bin of the k-th largest key in it and reads
//!   the row once: keys above that bin go to a bitmap of positions (a word of 32 a ballot), the
//!   bin's keys to a list in shared memory (at most `CAP`), where the remaining 21 bits are
//!   selected among them alone. Where the bin holds more than `CAP` keys, the block first narrows
//!   it by the next digits, a read of the row each (the earlier kernel read every row five
//!   times in one block, which at 128K positions lost to `argpartition`).
//!
//! The result is the positions above the k-th largest score in order, then the first ties at
//! it in order (read off the bitmaps): a function of the scores alone.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, apply_zeroed, kernel};
use crate::core::kernels::dsa::{top_k_in_two, topk_sizes_fit};
use crate::core::kernels::launch::{Source, Switch};

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// The most keys of the k-th largest key's bin that `select` lists in shared memory (beside its
/// 8 KiB histogram: 40 KiB in all, within a block's static shared memory).
const CAP: i32 = 4096;

/// Whether the kernels select `k` of `positions` float32 scores for `batch` rows of `queries`
/// queries: on CUDA, `k` below the positions (the caller attends densely otherwise), sizes
/// within a launch. Rows of any length: a row's extra reads are the bins' doing, not its
/// length's.
pub fn applies(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    KERNEL.enabled() && launch::on_cuda() && topk_sizes_fit(scores, batch, queries, positions, k)
}

const HEADER: &str = include_str!("src/dsa_topk.cuh");

/// Input `scores [B, Lq, T]` float32 (a view, any strides); output `hist [B, Lq, 2048]` uint32.
static HIST_KERNEL: Source = Source {
    name: "latent_cache_dsa_topk_hist",
    inputs: &["scores"],
    outputs: &["hist"],
    header: HEADER,
    body: include_str!("src/dsa_topk_hist.cu"),
    contiguous: false,
};

/// Template `K`, `CAP`. Inputs `scores` (as `hist`'s) and its `hist`; outputs `top [B, Lq, K]`
/// int32 and `bits [B, Lq, 2 * ceil(T / 32)]` uint32 (the bitmaps, scratch).
static SELECT_KERNEL: Source = Source {
    name: "latent_cache_dsa_topk",
    inputs: &["scores", "hist"],
    outputs: &["top", "bits"],
    header: HEADER,
    body: include_str!("src/dsa_topk.cu"),
    contiguous: false,
};

/// The `k` positions of highest score per query, `[B, Lq, k]` int32, lazily; where the scores'
/// histogram is already `counted` (`dsa_scores::index_scores` with `counted`), the second kernel
/// alone. Callers check `applies` first.
pub(crate) fn top_k(scores: &Array, counted: Option<&Array>, k: usize) -> Result<Array> {
    let out = top_k_in_two(
        scores,
        counted,
        k,
        CAP,
        |inputs, launch| apply_zeroed(kernel(&HIST_KERNEL, 0)?, inputs, launch),
        |inputs, launch| apply(kernel(&SELECT_KERNEL, 0)?, inputs, launch),
    )?;
    KERNEL.launched();
    Ok(out)
}
