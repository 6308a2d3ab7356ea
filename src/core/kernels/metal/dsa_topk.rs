//! DSA's top-k selection on MLX's Metal backend (Apple GPUs): `kernels::cuda::dsa_topk`'s radix
//! select in the same two kernels, threadgroups and SIMD groups in place of blocks and warps.
//! `hist` counts every row's keys by their top 11 bits in threadgroups of 4096 positions
//! (device atomics into a zeroed histogram); `select`, one threadgroup per row and query, finds
//! the k-th largest key's bin and reads the row once where that bin holds at most `CAP` keys
//! (2048 here: Apple GPUs give a threadgroup 32 KiB), into bitmaps of positions (a scratch
//! output) and a list of the bin's keys in threadgroup memory. The same positions as the CUDA
//! kernels: those above the k-th largest score in order, then the first ties at it in order.
//!
//! **Untested on Apple hardware** (these machines have none): its source runs in the C++
//! emulation of Metal (`tests/attention/metal_emulation.rs`) against a host reference, and before
//! a process first selects with a given `k` it runs on a small problem with ties and unseen
//! positions and is compared with the host's selection (`probed`); a kernel that fails to
//! compile, to run or to agree stays off for that `k`, and MLX's `argpartition` selects.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use super::probe_values::Draws;
use crate::core::error::Result;
use crate::core::kernels::dsa::{top_k_in_two, topk_sizes_fit};
use crate::core::kernels::launch::{Source, Switch};
use crate::core::kernels::metal::launch::{apply, apply_zeroed, kernel, on_metal};
use crate::core::mlx::ops;

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// The most keys of the k-th largest key's bin that `select` lists in threadgroup memory (beside
/// its 8 KiB histogram: 24 KiB in all, within Apple GPUs' 32 KiB).
const CAP: i32 = 2048;

const HEADER: &str = include_str!("src/dsa_topk.h.metal");

/// Input `scores [B, Lq, T]` float32 (a view, any strides); output `hist [B, Lq, 2048]` uint32.
static HIST_KERNEL: Source = Source {
    name: "latent_cache_dsa_topk_hist_metal",
    inputs: &["scores"],
    outputs: &["hist"],
    header: HEADER,
    body: include_str!("src/dsa_topk_hist.metal"),
    contiguous: false,
};

/// Template `K`, `CAP`. Inputs `scores` (as `hist`'s) and its `hist`; outputs `top [B, Lq, K]`
/// int32 and `bits [B, Lq, 2 * ceil(T / 32)]` uint32 (the bitmaps, scratch).
static SELECT_KERNEL: Source = Source {
    name: "latent_cache_dsa_topk_metal",
    inputs: &["scores", "hist"],
    outputs: &["top", "bits"],
    header: HEADER,
    body: include_str!("src/dsa_topk.metal"),
    contiguous: false,
};

/// Whether the kernels select `k` of `positions` float32 scores for `batch` rows of `queries`
/// queries: an Apple GPU, the sizes both backends take (`dsa::topk_sizes_fit`, rows of any
/// length), and the kernels having passed their probe for `k`.
pub fn applies(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    KERNEL.enabled() && on_metal() && topk_sizes_fit(scores, batch, queries, positions, k) && probed(k)
}

/// The `k` positions of highest score per query, `[B, Lq, k]` int32, lazily; where the scores'
/// histogram is already `counted` (`dsa_scores::index_scores` with `counted`), the second kernel
/// alone. Callers check `applies` first.
pub(crate) fn top_k(scores: &Array, counted: Option<&Array>, k: usize) -> Result<Array> {
    let out = launch(scores, counted, k)?;
    KERNEL.launched();
    Ok(out)
}

fn launch(scores: &Array, counted: Option<&Array>, k: usize) -> Result<Array> {
    top_k_in_two(
        scores,
        counted,
        k,
        CAP,
        |inputs, launch| apply_zeroed(kernel(&HIST_KERNEL)?, inputs, launch),
        |inputs, launch| apply(kernel(&SELECT_KERNEL)?, inputs, launch),
    )
}

/// The values of `k` probed so far and whether each passed.
static PROBES: Lazy<Mutex<Vec<(usize, bool)>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// Whether the kernel compiled for `k` passed its probe, probing it the first time: two rows of
/// `k + 1000` scores from a few levels (ties at the k-th), some -inf, selected on the GPU and
/// compared with the host's selection position for position.
fn probed(k: usize) -> bool {
    let mut probes = PROBES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&(_, passed)) = probes.iter().find(|(n, _)| *n == k) {
        return passed;
    }
    let positions = k + 1000;
    let mut draws = Draws::new(0x2545_f491_4f6c_dd1d);
    let scores: Vec<f32> = (0..2 * positions)
        .map(|_| match draws.next() % 17 {
            0 => f32::NEG_INFINITY,
            r => r as f32 - 8.0,
        })
        .collect();
    let want: Vec<i32> = scores.chunks(positions).flat_map(|row| host_top_k(row, k)).collect();
    let got = ops::from_host(&scores, &[2, 1, positions], "probe scores")
        .and_then(|s| launch(&s, None, k))
        .and_then(|top| ops::to_host_i64(&top));
    let passed = matches!(&got, Ok(got) if got.iter().map(|&p| p as i32).eq(want.iter().copied()));
    if !passed {
        eprintln!("latent-cache: the Metal top-k kernel is off for k = {k} (its check against the host failed); MLX's argpartition selects instead");
    }
    probes.push((k, passed));
    passed
}

/// The kernel's selection on the host: positions above the k-th largest score in order, then
/// the first ties at it.
fn host_top_k(row: &[f32], k: usize) -> Vec<i32> {
    let mut sorted = row.to_vec();
    sorted.sort_by(|x, y| y.total_cmp(x));
    let kth = sorted[k - 1];
    let above = row.iter().filter(|&&s| s > kth).count();
    let over = (0..row.len()).filter(|&p| row[p] > kth);
    let ties = (0..row.len()).filter(|&p| row[p] == kth).take(k - above);
    over.chain(ties).map(|p| p as i32).collect()
}

#[cfg(test)]
mod tests {
    use super::host_top_k;

    #[test]
    fn the_host_selection_takes_the_first_ties() {
        let row = [1.0, 3.0, 2.0, 2.0, f32::NEG_INFINITY, 2.0, 5.0];
        assert_eq!(host_top_k(&row, 4), vec![1, 6, 2, 3]);
        assert_eq!(host_top_k(&row, 1), vec![6]);
        assert_eq!(host_top_k(&row, 7), vec![0, 1, 2, 3, 5, 6, 4]);
    }
}
