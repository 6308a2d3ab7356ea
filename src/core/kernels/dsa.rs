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

/// The most positions the top-k kernels select from: one block reads a row, on one
/// multiprocessor, which at long rows loses to MLX's sort over the whole GPU. H200, bf16, one
/// GLM-5.2 layer's DSA decode step (index scores, top-2048, attention; `--attention`): at 16K
/// positions 0.205 ms with the kernel against 0.242 with argpartition (8 rows: 0.257 against
/// 0.284), at 128K 0.507 against 0.359. Above this, `Donor::select` takes argpartition (the
/// crossing, from those two points, is near 38K). The Metal kernel reads a row in one
/// threadgroup likewise and takes the same limit.
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

/// Whether the top-k kernels select `k` of `positions` float32 scores for `batch` rows of
/// `queries` queries: `k` below the positions (the caller attends densely otherwise), at most
/// `TOPK_MAX_POSITIONS` positions, sizes within a launch.
pub(crate) fn topk_fits(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    scores == Dtype::Float32
        && (1..positions).contains(&k)
        && positions <= TOPK_MAX_POSITIONS
        && (1..=65535).contains(&batch)
        && (1..=65535).contains(&queries)
}
