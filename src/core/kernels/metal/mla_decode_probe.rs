//! The Metal decode kernel's check at first use: these machines have no Apple GPU, so before
//! the kernel computes an attention of a new shape it runs on a small problem of that shape and
//! is compared with a float64 computation on the host (`probe`); a kernel that fails to compile,
//! to run or to agree stays off for that shape, and MLX's ops compute it instead.
use std::sync::Mutex;

use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use super::probe_values::Draws;
use crate::core::error::Result;
use crate::core::mlx::ops;

/// What a probe is keyed by: the compiled kernel's template arguments and the storage dtype
/// (dtype, rank, rope, heads, queries, causal, gather).
type ProbeKey = (Dtype, usize, usize, usize, usize, bool, bool);

/// Probes run so far and whether each passed.
static PROBES: Lazy<Mutex<Vec<(ProbeKey, bool)>>> = Lazy::new(|| Mutex::new(Vec::new()));

/// Whether the kernel (`launch`, given by the decode so this check imports nothing of it)
/// passed its probe for `key`, probing it the first time.
pub(super) fn probed(key: ProbeKey, launch: Attend) -> bool {
    let mut probes = PROBES.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(&(_, passed)) = probes.iter().find(|(k, _)| *k == key) {
        return passed;
    }
    let passed = match probe(key, launch) {
        Ok(error) if error <= PROBE_TOLERANCE => true,
        outcome => {
            eprintln!(
                "latent-cache: the Metal decode kernel is off for {key:?} (its check against the host gave {outcome:?}); \
                 MLX's ops compute that attention instead"
            );
            false
        }
    };
    probes.push((key, passed));
    passed
}

/// The probe's bound on the largest difference from the float64 result, relative to the
/// largest output: the kernel computes in float32 from the stored values, so it is off by
/// rounding only; a wrong index or mask is off by far more.
const PROBE_TOLERANCE: f64 = 1e-3;

/// `launch`'s signature: the kernel, or a stand-in in tests.
pub(super) type Attend = fn([&Array; 4], Option<&Array>, &[(usize, usize)], f32, bool) -> Result<Array>;

/// Positions a gathered probe selects in row `b`: 200 distinct of the 300, out of order.
fn probe_selection(b: usize) -> Vec<usize> {
    (0..200).map(|i| (37 * i + 11 + 5 * b) % 300).collect()
}

/// Runs the kernel for `key` (`run`) over a small problem (two rows, one padded and ragged, 300
/// positions in several splits; gathered, 200 of them selected out of order in each row, the
/// second row seeing the stored positions from 7 to 150 only, as a prefill chunk's query sees
/// those before its own) of values exact in every storage dtype, and returns its largest
/// difference from a float64 computation on the host, relative to the largest output.
fn probe((dtype, rank, rope, heads, queries, causal, gather): ProbeKey, run: Attend) -> Result<f64> {
    let (batch, positions) = (2, 300);
    let ranges = match gather {
        true => [(0usize, 300usize), (7, 150)],
        false => [(0, 300), (7, 290)],
    };
    let mut draws = Draws::new(0x9e37_79b9_7f4a_7c15);
    let mut values = |n: usize| draws.exact(n);
    let (ql, qr) = (values(batch * heads * queries * rank), values(batch * heads * queries * rope));
    let (lat, rop) = (values(batch * positions * rank), values(batch * positions * rope));
    let array = |data: &[f32], shape: &[usize]| ops::astype(&ops::from_host(data, shape, "probe")?, dtype);
    let arrays = [
        array(&ql, &[batch, heads, queries, rank])?,
        array(&qr, &[batch, heads, queries, rope])?,
        array(&lat, &[batch, positions, rank])?,
        array(&rop, &[batch, positions, rope])?,
    ];
    let chosen: Vec<i32> = (0..batch).flat_map(probe_selection).map(|p| p as i32).collect();
    let selection = ops::indices(&chosen, &[batch, 1, 200]);
    let out = run(arrays.each_ref(), gather.then_some(&selection), &ranges, 0.125, causal)?;
    let got = ops::to_host(&out)?;
    let (mut worst, mut largest) = (0f64, 0f64);
    for (b, &(lo, hi)) in ranges.iter().enumerate() {
        for row in 0..heads * queries {
            let (q, qi) = (b * heads * queries + row, row % queries);
            let end = if causal { hi - queries + 1 + qi } else { hi };
            let seen: Vec<usize> = match gather {
                true => probe_selection(b).into_iter().filter(|t| (lo..hi).contains(t)).collect(),
                false => (lo..end).collect(),
            };
            let dot = |t: usize| -> f64 {
                let l: f64 = (0..rank).map(|c| ql[q * rank + c] as f64 * lat[(b * positions + t) * rank + c] as f64).sum();
                let r: f64 = (0..rope).map(|c| qr[q * rope + c] as f64 * rop[(b * positions + t) * rope + c] as f64).sum();
                0.125 * (l + r)
            };
            let scores: Vec<f64> = seen.iter().map(|&t| dot(t)).collect();
            let top = scores.iter().cloned().fold(f64::MIN, f64::max);
            let weights: Vec<f64> = scores.iter().map(|s| (s - top).exp()).collect();
            let total: f64 = weights.iter().sum();
            for c in 0..rank {
                let want: f64 =
                    seen.iter().zip(&weights).map(|(&t, w)| w * lat[(b * positions + t) * rank + c] as f64).sum::<f64>() / total;
                worst = worst.max((want - got[q * rank + c] as f64).abs());
                largest = largest.max(want.abs());
            }
        }
    }
    Ok(worst / largest.max(1e-30))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Attention computed on the host in float32 from the inputs' values, over each row's
    /// selected positions where `selection` is given (else its range), with the first `skew`
    /// of them left out (0: right).
    fn host(
        inputs: [&Array; 4],
        selection: Option<&Array>,
        ranges: &[(usize, usize)],
        scale: f32,
        causal: bool,
        skew: usize,
    ) -> Result<Array> {
        let [q_l, q_r, lat, rope] = inputs;
        let read = |a: &Array| ops::to_host(&ops::astype(a, Dtype::Float32)?);
        let (ql, qr, l, r) = (read(q_l)?, read(q_r)?, read(lat)?, read(rope)?);
        let chosen = selection.map(read).transpose()?;
        let (s, t) = (q_l.shape(), lat.shape()[1] as usize);
        let (heads, queries, rank, width) = (s[1] as usize, s[2] as usize, s[3] as usize, q_r.shape()[3] as usize);
        let mut out = Vec::new();
        for (b, &(lo, hi)) in ranges.iter().enumerate() {
            for row in 0..heads * queries {
                let q = b * heads * queries + row;
                let end = if causal { hi - queries + 1 + row % queries } else { hi };
                // Selected: the row's selection, less its first `skew`, within its bounds.
                let seen: Vec<usize> = match &chosen {
                    Some(c) => {
                        let k = c.len() / ranges.len();
                        let row = c[b * k..(b + 1) * k][skew..].iter().map(|&p| p as usize);
                        row.filter(|p| (lo..hi).contains(p)).collect()
                    }
                    None => (lo + skew..end).collect(),
                };
                let dot = |p: usize| -> f32 {
                    let a: f32 = (0..rank).map(|c| ql[q * rank + c] * l[(b * t + p) * rank + c]).sum();
                    a + (0..width).map(|c| qr[q * width + c] * r[(b * t + p) * width + c]).sum::<f32>()
                };
                let w: Vec<f32> = seen.iter().map(|&p| (scale * dot(p)).exp()).collect();
                let total: f32 = w.iter().sum();
                for c in 0..rank {
                    out.push(seen.iter().zip(&w).map(|(&p, w)| w * l[(b * t + p) * rank + c]).sum::<f32>() / total);
                }
            }
        }
        ops::from_host(&out, &[ranges.len(), heads, queries, rank], "host attention")
    }

    fn right(inputs: [&Array; 4], sel: Option<&Array>, r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, sel, r, s, causal, 0)
    }

    fn misses_first(inputs: [&Array; 4], sel: Option<&Array>, r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, sel, r, s, causal, 1)
    }

    fn noncausal(inputs: [&Array; 4], sel: Option<&Array>, r: &[(usize, usize)], s: f32, _: bool) -> Result<Array> {
        host(inputs, sel, r, s, false, 0)
    }

    /// Reads the window's first positions in place of the selected ones.
    fn unselected(inputs: [&Array; 4], _: Option<&Array>, r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, None, r, s, causal, 0)
    }

    /// Reads every selected position, whatever the row's bounds.
    fn unbounded(inputs: [&Array; 4], sel: Option<&Array>, r: &[(usize, usize)], s: f32, causal: bool) -> Result<Array> {
        host(inputs, sel, &vec![(0, usize::MAX); r.len()], s, causal, 0)
    }

    /// The probe passes an attention computed right and fails ones that miss a row's first
    /// position, ignore the causal mask, the selection or a selection's bounds, so a defective kernel is turned
    /// off, a sound one kept.
    #[test]
    fn probe_tells_right_attention_from_wrong() {
        for dtype in [Dtype::Float32, Dtype::Bfloat16, Dtype::Float16] {
            let key = (dtype, 64, 32, 3, 2, true, false);
            assert!(probe(key, right).unwrap() <= PROBE_TOLERANCE, "{dtype:?}: right attention passes");
            assert!(probe(key, misses_first).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: a missed position fails");
            assert!(probe(key, noncausal).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: an ignored mask fails");
            let gathered = (dtype, 64, 32, 3, 1, false, true);
            assert!(probe(gathered, right).unwrap() <= PROBE_TOLERANCE, "{dtype:?}: right selected attention passes");
            assert!(probe(gathered, misses_first).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: a missed selection fails");
            assert!(probe(gathered, unselected).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: an ignored selection fails");
            assert!(probe(gathered, unbounded).unwrap() > 10.0 * PROBE_TOLERANCE, "{dtype:?}: an ignored bound fails");
        }
    }
}
