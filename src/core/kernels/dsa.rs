//! What the DSA kernels of both backends share: the sizes the index-score kernels
//! (`cuda::dsa_scores`, `metal::dsa_scores`) and the top-k kernels (`cuda::dsa_topk`,
//! `metal::dsa_topk`) take, judged once for both, as `decode` does for the split-K decode.
//! Both backends' top-k kernels take rows of any length (the earlier one-kernel form, five
//! reads of a row in one block, lost to MLX's sort past about 38K positions on the H200).
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::launch::Launch;

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
/// within a launch (the kernels' position arithmetic in 32-bit integers runs up to two
/// histogram blocks past the row; the histogram's grid, a sixteenth of that, fits with it).
pub(crate) fn topk_sizes_fit(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    scores == Dtype::Float32
        && (1..positions).contains(&k)
        && positions <= i32::MAX as usize - 2 * HIST_POSITIONS
        && (1..=65535).contains(&batch)
        && (1..=65535).contains(&queries)
}

/// Positions a top-k `hist` block (threadgroup) counts: 256 threads, 16 each.
const HIST_POSITIONS: usize = 4096;
const HIST_THREADS: i32 = 256;
/// Threads of a top-k `select` block (threadgroup), as in both backends' sources.
const SELECT_THREADS: i32 = 512;

/// The top-k's two launches, as both backends' kernels take them: `hist` (applied with its
/// output zeroed) counts each row's keys of `scores [B, Lq, T]` by their top digit into `[B, Lq,
/// 2048]` uint32; `select` (template `K`, `CAP`: the most keys of a bin it lists) reads the
/// scores and that histogram into `top [B, Lq, k]` int32 and its bitmaps (`[B, Lq, 2 ceil(T /
/// 32)]` uint32, scratch). Each backend applies them with its own kernels. Where the histogram is
/// already `counted` (the counting index-score kernels give it with the scores), `hist` is not
/// launched.
pub(crate) fn top_k_in_two(
    scores: &Array,
    counted: Option<&Array>,
    k: usize,
    cap: i32,
    hist: impl FnOnce(&[&Array], Launch) -> Result<Vec<Array>>,
    select: impl FnOnce(&[&Array], Launch) -> Result<Vec<Array>>,
) -> Result<Array> {
    let s = scores.shape();
    let (batch, queries, positions) = (s[0], s[1], s[2] as usize);
    let launched;
    let counts = match counted {
        Some(counts) => counts,
        None => {
            launched = hist(
                &[scores],
                Launch {
                    outputs: &[(&[batch, queries, 2048], Dtype::Uint32)],
                    grid: [positions.div_ceil(HIST_POSITIONS) as i32 * HIST_THREADS, queries, batch],
                    block: [HIST_THREADS, 1, 1],
                    ints: &[],
                    bools: &[],
                },
            )?;
            &launched[0]
        }
    };
    let words = positions.div_ceil(32) as i32;
    let out = select(
        &[scores, counts],
        Launch {
            outputs: &[(&[batch, queries, k as i32], Dtype::Int32), (&[batch, queries, 2 * words], Dtype::Uint32)],
            grid: [SELECT_THREADS, queries, batch],
            block: [SELECT_THREADS, 1, 1],
            ints: &[("K", k as i32), ("CAP", cap)],
            bools: &[],
        },
    )?;
    Ok(out.into_iter().next().expect("the selection and its bitmaps"))
}
