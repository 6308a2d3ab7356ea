//! DSA's top-k selection on MLX's Metal backend (Apple GPUs): a radix select (one threadgroup
//! per row and query, three counting passes, then each SIMD group's stretch counted and
//! written), so a selection costs a few reads of the scores where MLX's `argpartition` sorts
//! every row. The same positions as the CUDA kernels (`kernels::cuda::dsa_topk`, which count
//! the top digit in parallel blocks and then read a row once in most cases): those above the
//! k-th largest score in order, then the first ties at it in order.
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
use crate::core::kernels::dsa::topk_fits;
use crate::core::kernels::launch::{Launch, Source, Switch};
use crate::core::kernels::metal::launch::{apply, kernel, on_metal};
use crate::core::mlx::ops;

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Threads per threadgroup (as in the source).
const THREADS: i32 = 512;

static TOPK_KERNEL: Source = Source {
    name: "latent_cache_dsa_topk_metal",
    inputs: &["scores"],
    outputs: &["top"],
    header: include_str!("src/dsa_topk.h.metal"),
    body: include_str!("src/dsa_topk.metal"),
    contiguous: false,
};

/// Whether the kernel selects `k` of `positions` float32 scores for `batch` rows of `queries`
/// queries: an Apple GPU, the sizes `dsa::topk_fits` takes (at most `dsa::TOPK_MAX_POSITIONS`
/// positions: one threadgroup reads a row five times), and the kernel having passed its probe
/// for `k`.
pub fn applies(scores: Dtype, batch: usize, queries: usize, positions: usize, k: usize) -> bool {
    KERNEL.enabled() && on_metal() && topk_fits(scores, batch, queries, positions, k) && probed(k)
}

/// The `k` positions of highest score per query, `[B, Lq, k]` int32, lazily. Callers check
/// `applies` first.
pub(crate) fn top_k(scores: &Array, k: usize) -> Result<Array> {
    let out = launch(scores, k)?;
    KERNEL.launched();
    Ok(out)
}

fn launch(scores: &Array, k: usize) -> Result<Array> {
    let s = scores.shape();
    let out = apply(
        kernel(&TOPK_KERNEL)?,
        &[scores],
        Launch {
            outputs: &[(&[s[0], s[1], k as i32], Dtype::Int32)],
            grid: [THREADS, s[1], s[0]],
            block: [THREADS, 1, 1],
            ints: &[("K", k as i32)],
            bools: &[],
        },
    )?;
    Ok(out.into_iter().next().expect("one output"))
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
        .and_then(|s| launch(&s, k))
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
