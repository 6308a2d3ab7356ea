//! DSA index scores in one operation on MLX's Metal backend (Apple GPUs): `kernels::cuda::
//! dsa_scores`' formula (for each query and stored position, the sum over index heads of weight
//! x ReLU(query . key), positions the query does not see at -inf), read straight from 16-bit
//! stored keys, where MLX's operations take eight graph operations and a float32 copy of every
//! stored key. One thread scores one position for every head, the threadgroup's queries and
//! weights in threadgroup memory. Its counting form (`index_scores` with `counted`, for
//! `Donor::index_select`) also counts the top-k's histogram of its scores in threadgroup memory,
//! added into the zeroed output, so the selection is two operations, not three; its probe also
//! checks that histogram against the host's count of the scores it returned.
//!
//! **Untested on Apple hardware** (these machines have none): its source runs in the C++
//! emulation of Metal (`tests/attention/metal_emulation.rs`) against a float64 computation, and
//! before a process first uses it for a given compiled form it runs on a small problem (two rows,
//! one padded, causal queries where the form is causal) and is compared with the host's
//! computation (`probed`); one that fails to compile, to run or to agree stays off for that form
//! and MLX's operations score.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use super::probe_values::Draws;
use crate::core::error::{fail, Result};
use crate::core::kernels::dsa::{scores_fit, SCORE_THREADS};
use crate::core::kernels::launch::{Launch, Source, Switch};
use crate::core::kernels::metal::launch::{apply, apply_zeroed, kernel, on_metal};
use crate::core::mlx::ops;

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

static SCORES_KERNEL: Source = Source {
    name: "latent_cache_dsa_index_scores_metal",
    inputs: &["q_index", "weights", "keys", "ranges"],
    outputs: &["scores"],
    header: "",
    body: include_str!("src/dsa_scores.metal"),
    contiguous: false,
};

/// The kernel that also counts its scores' top-k histogram (`dsa_topk`'s first kernel's output,
/// `hist [B, Lq, 2048]` uint32, zeroed by MLX first), as the CUDA one does.
static COUNTED_KERNEL: Source = Source {
    name: "latent_cache_dsa_index_scores_counted_metal",
    inputs: &["q_index", "weights", "keys", "ranges"],
    outputs: &["scores", "hist"],
    header: concat!(include_str!("src/dsa_scores_counted.h.metal"), include_str!("src/dsa_topk.h.metal")),
    body: include_str!("src/dsa_scores.metal"),
    contiguous: false,
};

/// What a compiled form is: the keys', queries' and weights' dtypes, heads, width, queries,
/// whether it reads ranges and masks causally, and whether it counts the histogram.
type Form = (Dtype, Dtype, Dtype, usize, usize, usize, bool, bool, bool);

/// Threadgroup memory a threadgroup of the counting kernel takes: the queries and weights in
/// float32 and its histogram, within Apple GPUs' 32 KiB.
fn counted_fits(heads: usize, width: usize) -> bool {
    (heads * width + heads + 2048) * 4 <= 32 * 1024
}

/// Whether the kernel scores `queries` queries (`q`, `weights` dtypes) of `heads` heads and
/// width `width` over `positions` keys stored in `storage`, for `batch` rows: an Apple GPU,
/// 16-bit float keys (as the CUDA kernel), the queries fitting threadgroup memory, sizes within a
/// launch, and the kernel having passed its probe for this form (with `counted`, the form that
/// also counts the top-k histogram, its histogram in threadgroup memory too).
#[allow(clippy::too_many_arguments)]
pub fn applies(
    storage: Dtype,
    (q, w): (Dtype, Dtype),
    batch: usize,
    heads: usize,
    queries: usize,
    width: usize,
    positions: usize,
    (ranges, causal, counted): (bool, bool, bool),
) -> bool {
    let fits = KERNEL.enabled() && on_metal() && scores_fit(storage, batch, heads, queries, width, positions);
    let memory = !counted || counted_fits(heads, width);
    fits && memory && probed((storage, q, w, heads, width, queries, ranges, causal && queries > 1, counted))
}

/// The index scores `[B, Lq, T]` float32, lazily, and with `counted` their top-k histogram (the
/// CUDA kernel's arguments). Callers check `applies` first.
pub(crate) fn index_scores(
    q_index: &Array,
    weights: &Array,
    keys: &Array,
    ranges: &[(usize, usize)],
    causal: bool,
    counted: bool,
) -> Result<(Array, Option<Array>)> {
    let mut out = launch_with(q_index, weights, keys, ranges, causal, counted)?.into_iter();
    KERNEL.launched();
    Ok((out.next().expect("the scores"), out.next()))
}

fn launch(q_index: &Array, weights: &Array, keys: &Array, ranges: &[(usize, usize)], causal: bool) -> Result<Array> {
    let out = launch_with(q_index, weights, keys, ranges, causal, false)?;
    Ok(out.into_iter().next().expect("one output"))
}

/// The counting kernel's scores, its histogram checked against the host's count of them (the
/// probe's stand-in for `launch`).
fn launch_counted(q_index: &Array, weights: &Array, keys: &Array, ranges: &[(usize, usize)], causal: bool) -> Result<Array> {
    let mut out = launch_with(q_index, weights, keys, ranges, causal, true)?.into_iter();
    let (scores, counts) = (out.next().expect("the scores"), out.next().expect("their histogram"));
    let got = ops::to_host(&ops::astype(&counts, Dtype::Float32)?)?;
    let host = ops::to_host(&scores)?;
    let mut want = vec![0f32; got.len()];
    for (row, values) in host.chunks(keys.shape()[1] as usize).enumerate() {
        for &v in values {
            want[row * 2048 + (order_key(v) >> 21) as usize] += 1.0;
        }
    }
    match got == want {
        true => Ok(scores),
        false => fail!(Backend, "the counted histogram differs from the host's count of the scores"),
    }
}

/// The top-k kernels' order key of a score (`lc_order_key` in `dsa_topk.h.metal`).
fn order_key(score: f32) -> u32 {
    let u = if score.to_bits() == 0x8000_0000 { 0 } else { score.to_bits() };
    let k = if u & 0x8000_0000 != 0 { !u } else { u | 0x8000_0000 };
    k.max(1)
}

fn launch_with(
    q_index: &Array,
    weights: &Array,
    keys: &Array,
    ranges: &[(usize, usize)],
    causal: bool,
    counted: bool,
) -> Result<Vec<Array>> {
    let qs = q_index.shape();
    let (batch, heads, queries, width) = (qs[0], qs[1], qs[2], qs[3]);
    let positions = keys.shape()[1];
    let whole = ranges.iter().all(|&(lo, hi)| lo == 0 && hi == positions as usize);
    // Padded to 8 values: MLX passes smaller inputs in another address space (a kernel compiled
    // apart from the probed one), as the decode kernel's ranges.
    let mut bounds: Vec<i32> = ranges.iter().flat_map(|&(lo, hi)| [lo as i32, hi as i32]).collect();
    bounds.resize(bounds.len().max(8), 0);
    let bounds = ops::indices(&bounds, &[bounds.len()]);
    let scores = (&[batch, queries, positions][..], Dtype::Float32);
    let counts = (&[batch, queries, 2048][..], Dtype::Uint32);
    let (run, source, outputs): (fn(_, _, _) -> _, _, &[_]) = match counted {
        true => (apply_zeroed, &COUNTED_KERNEL, &[scores, counts]),
        false => (apply, &SCORES_KERNEL, &[scores]),
    };
    run(
        kernel(source)?,
        &[q_index, weights, keys, &bounds],
        Launch {
            outputs,
            grid: [(positions as usize).div_ceil(SCORE_THREADS) as i32 * SCORE_THREADS as i32, queries, batch],
            block: [SCORE_THREADS as i32, 1, 1],
            ints: &[("HI", heads), ("W", width), ("LQ", queries)],
            bools: &[("RANGES", !whole), ("CAUSAL", causal && queries > 1)],
        },
    )
}

/// The forms probed so far and whether each passed.
static PROBES: Lazy<Mutex<Vec<(Form, bool)>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// The probe's bound on the largest difference from the float64 scores, relative to the largest:
/// 16-bit keys and queries multiplied in float32 are off by rounding only.
const PROBE_TOLERANCE: f64 = 1e-3;

/// Whether the kernel compiled for `form` passed its probe, probing it the first time: two rows
/// of 300 positions (the second visible over [7, 290) where the form reads ranges), values exact
/// in 16 bits, against the host's float64 scores, every masked position -inf.
fn probed(form: Form) -> bool {
    let mut probes = PROBES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&(_, passed)) = probes.iter().find(|(f, _)| *f == form) {
        return passed;
    }
    let passed = matches!(probe(form, if form.8 { launch_counted } else { launch }), Ok(true));
    if !passed {
        eprintln!("latent-cache: the Metal index-score kernel is off for {form:?} (its check against the host failed); MLX's operations score instead");
    }
    probes.push((form, passed));
    passed
}

/// `launch`'s signature: the kernel, or a stand-in in tests.
type Score = fn(&Array, &Array, &Array, &[(usize, usize)], bool) -> Result<Array>;

fn probe((storage, q_dtype, w_dtype, heads, width, queries, ranged, causal, _): Form, run: Score) -> Result<bool> {
    let (batch, positions) = (2usize, 300usize);
    let ranges = match ranged {
        true => vec![(0, positions), (7, 290)],
        false => vec![(0, positions); batch],
    };
    let mut draws = Draws::new(0x5851_f42d_4c95_7f2d);
    let mut values = |n: usize| draws.exact(n);
    let (q, w, k) = (values(batch * heads * queries * width), values(batch * queries * heads), values(batch * positions * width));
    let array = |data: &[f32], shape: &[usize], dtype| ops::astype(&ops::from_host(data, shape, "probe")?, dtype);
    let got = run(
        &array(&q, &[batch, heads, queries, width], q_dtype)?,
        &array(&w, &[batch, queries, heads], w_dtype)?,
        &array(&k, &[batch, positions, width], storage)?,
        &ranges,
        causal,
    )?;
    let got = ops::to_host(&got)?;
    let (mut worst, mut largest) = (0f64, 1e-30f64);
    for (b, &(lo, hi)) in ranges.iter().enumerate() {
        for qi in 0..queries {
            let end = if causal { hi - (queries - 1 - qi) } else { hi };
            for t in 0..positions {
                let at = (b * queries + qi) * positions + t;
                if t < lo || t >= end {
                    if got[at] != f32::NEG_INFINITY {
                        return Ok(false);
                    }
                    continue;
                }
                let want: f64 = (0..heads)
                    .map(|h| {
                        let dot: f64 = (0..width)
                            .map(|c| {
                                q[((b * heads + h) * queries + qi) * width + c] as f64 * k[(b * positions + t) * width + c] as f64
                            })
                            .sum();
                        w[(b * queries + qi) * heads + h] as f64 * dot.max(0.0)
                    })
                    .sum();
                worst = worst.max((want - got[at] as f64).abs());
                largest = largest.max(want.abs());
            }
        }
    }
    Ok(worst / largest <= PROBE_TOLERANCE)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Index scores computed on the host in float32 from the inputs' values: `relu` false
    /// leaves out the ReLU, `masked` false writes every position.
    fn host(inputs: [&Array; 3], ranges: &[(usize, usize)], causal: bool, relu: bool, masked: bool) -> Result<Array> {
        let [q, w, k] = inputs;
        let read = |a: &Array| ops::to_host(&ops::astype(a, Dtype::Float32)?);
        let (qv, wv, kv) = (read(q)?, read(w)?, read(k)?);
        let s = q.shape();
        let (batch, heads, queries, width, positions) =
            (s[0] as usize, s[1] as usize, s[2] as usize, s[3] as usize, k.shape()[1] as usize);
        let mut out = Vec::new();
        for (b, &(lo, hi)) in ranges.iter().enumerate().take(batch) {
            for qi in 0..queries {
                let end = if causal { hi - (queries - 1 - qi) } else { hi };
                for t in 0..positions {
                    if masked && (t < lo || t >= end) {
                        out.push(f32::NEG_INFINITY);
                        continue;
                    }
                    let score: f32 = (0..heads)
                        .map(|h| {
                            let dot: f32 = (0..width)
                                .map(|c| qv[((b * heads + h) * queries + qi) * width + c] * kv[(b * positions + t) * width + c])
                                .sum();
                            wv[(b * queries + qi) * heads + h] * if relu { dot.max(0.0) } else { dot }
                        })
                        .sum();
                    out.push(score);
                }
            }
        }
        ops::from_host(&out, &[batch, queries, positions], "host scores")
    }

    fn right(q: &Array, w: &Array, k: &Array, r: &[(usize, usize)], causal: bool) -> Result<Array> {
        host([q, w, k], r, causal, true, true)
    }

    fn no_relu(q: &Array, w: &Array, k: &Array, r: &[(usize, usize)], causal: bool) -> Result<Array> {
        host([q, w, k], r, causal, false, true)
    }

    fn unmasked(q: &Array, w: &Array, k: &Array, r: &[(usize, usize)], causal: bool) -> Result<Array> {
        host([q, w, k], r, causal, true, false)
    }

    fn noncausal(q: &Array, w: &Array, k: &Array, r: &[(usize, usize)], _: bool) -> Result<Array> {
        host([q, w, k], r, false, true, true)
    }

    /// The probe passes scores computed right and fails ones without the ReLU, without the
    /// rows' masks or without the causal band, so a defective kernel is turned off.
    #[test]
    fn probe_tells_right_scores_from_wrong() {
        for dtype in [Dtype::Bfloat16, Dtype::Float16] {
            let form = (dtype, dtype, Dtype::Float32, 3, 16, 2, true, true, false);
            assert!(probe(form, right).unwrap(), "{dtype:?}: right scores pass");
            assert!(!probe(form, no_relu).unwrap(), "{dtype:?}: scores without the ReLU fail");
            assert!(!probe(form, unmasked).unwrap(), "{dtype:?}: unmasked positions fail");
            assert!(!probe(form, noncausal).unwrap(), "{dtype:?}: an ignored causal band fails");
        }
    }
}
