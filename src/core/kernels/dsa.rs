//! What the DSA kernels of both backends share: the sizes the index-score kernels
//! (`cuda::dsa_scores`, `metal::dsa_scores`) and the top-k kernels (`cuda::dsa_topk`,
//! `metal::dsa_topk`) take, judged once for both, as `decode` does for the split-K decode.
use mlx_rs::Dtype;

/// Positions a Metal index-score threadgroup scores, one a thread (the CUDA kernel's blocks
/// score more: `cuda::dsa_scores`).
pub(crate) const SCORE_THREADS: usize = 128;

/// The most index heads x width an index-score block holds as float32 queries (24 KiB: beside
/// the CUDA kernel's 16.5 KiB of staged keys, and within Apple's 32 KiB of threadgroup memory;
/// GLM-5.2's 32 heads of 128 take 16 KiB).
const MAX_QUERY_VALUES: usize = 6144;

/// The most positions the Metal top-k kernel selects from: one threadgroup reads a row five
/// times, which at long rows loses to MLX's sort over the whole GPU. Measured with the CUDA
/// kernel of the same algorithm (H200, bf16, one GLM-5.2 layer's DSA decode step, index scores,
/// top-2048, attention; `--attention`): at 16K positions 0.205 ms with it against 0.242 with
/// argpartition (8 rows: 0.257 against 0.284), at 128K 0.507 against 0.359. Above this,
/// `Donor::select` takes argpartition on Apple GPUs. The CUDA kernels (`cuda::dsa_topk`) read a
/// row once in most cases and take rows of any length.
pub const TOPK_MAX_POSITIONS: usize = 32 * 1024;

/// Whether the index-score kernels score `queries` queries of `heads` heads and width `width`
/// over `positions` keys stored in `storage`, for `batch` rows: 16-bit float keys, the queries
/// fitting a block, sizes within a launch.
pub(crate) fn scores_fit(storage: Dtype, batch: usize, heads: usize, queries: usize, width: usize, positions: usize) -> bool {
    matches!(storage, Dtype::Bfloat16 | Dtype::Float16)
        && heads >= 1
        && width >= 1
        && heads * width <= MAX_QUERY_VALUES
        && (1..=65535).contains(&batch)
        && (1..=65535).contains(&queries)
        && positions >= 1
        && positions.div_ceil(SCORE_THREADS) * SCORE_THREADS <= i32::MAX as usize
}

/// Whether the Metal top-k kernel selects `k` of `positions` float32 scores for `batch` rows of
/// `queries` queries: `topk_sizes_fit`, and at most `TOPK_MAX_POSITIONS` positions.
pub(crate) fn topk_fits(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    topk_sizes_fit(scores, batch, queries, positions, k) && positions <= TOPK_MAX_POSITIONS
}

/// Whether a top-k kernel selects `k` of `positions` float32 scores for `batch` rows of
/// `queries` queries: `k` below the positions (the caller attends densely otherwise), sizes
/// within a launch.
pub(crate) fn topk_sizes_fit(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    scores == Dtype::Float32
        && (1..positions).contains(&k)
        && positions <= i32::MAX as usize
        && (1..=65535).contains(&batch)
        && (1..=65535).contains(&queries)
}
