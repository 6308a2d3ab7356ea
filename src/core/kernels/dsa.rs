//! What the DSA kernels of both backends share: the sizes the index-score kernels
//! (`cuda::dsa_scores`, `metal::dsa_scores`) and the top-k kernels (`cuda::dsa_topk`,
//! `metal::dsa_topk`) take, judged once for both, as `decode` does for the split-K decode.
//! Both backends' top-k kernels take rows of any length (the earlier one-kernel form, five
//! reads of a row in one block, lost to MLX's sort past about 38K positions on the H200).
use mlx_rs::Dtype;

/// Positions a Metal index-score threadgroup scores, one a thread (the CUDA kernel's blocks
/// score more: `cuda::dsa_scores`).
pub(crate) const SCORE_THREADS: usize = 128;

/// The most index heads x width an index-score block holds as float32 queries (24 KiB: beside
/// the CUDA kernel's 16.5 KiB of staged keys, and within Apple's 32 KiB of threadgroup memory;
/// GLM-5.2's 32 heads of 128 take 16 KiB).
const MAX_QUERY_VALUES: usize = 6144;

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
