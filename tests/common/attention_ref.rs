//! The float64 reference for the absorbed MLA attention and DSA's index scores, on plain vectors
//! (no MLX): what the donor's `attend`, `attend_selected` and `index_scores` must compute over the
//! values a row holds (position-major, `width` values a position, as the reference model or
//! `read_row` gives them). Rows are indexed by row position: a window position is the row's
//! position plus its left padding.
#![allow(dead_code)]

/// How many of a row's `len` positions query `i` of `queries` sees: all of them, or under the
/// causal mask those up to its own (query `i` is the row's position `len - queries + i`; in a
/// row shorter than the queries, the first ones come before the row and see none).
pub fn seen(len: usize, queries: usize, i: usize, causal: bool) -> usize {
    if causal {
        (len + i + 1).saturating_sub(queries)
    } else {
        len
    }
}

/// The row positions query `i` of `queries` sees (`seen` of them, from the first).
pub fn visible(len: usize, queries: usize, i: usize, causal: bool) -> Vec<usize> {
    (0..seen(len, queries, i, causal)).collect()
}

/// One query's attention over `positions` of a row:
/// `softmax(scale * (q_latent . latent_j + q_rope . rope_j) + mask(j)) . latent`, with the
/// widths `q_latent.len()` and `q_rope.len()`. `mask` is an additive mask by row position (0.0
/// for none); `positions` are all the query sees (`visible`) or the ones DSA selected. A query
/// that sees nothing (no positions, or every one masked with -inf) gives zeros.
pub fn attention(
    latent: &[f32],
    rope: &[f32],
    q_latent: &[f32],
    q_rope: &[f32],
    scale: f64,
    positions: &[usize],
    mask: impl Fn(usize) -> f64,
) -> Vec<f64> {
    let (r, p) = (q_latent.len(), q_rope.len());
    let dot = |q: &[f32], v: &[f32], w: usize, j: usize| (0..w).map(|c| q[c] as f64 * v[j * w + c] as f64).sum::<f64>();
    let scores: Vec<f64> =
        positions.iter().map(|&j| scale * (dot(q_latent, latent, r, j) + dot(q_rope, rope, p, j)) + mask(j)).collect();
    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    if max == f64::NEG_INFINITY {
        return vec![0.0; r];
    }
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    (0..r).map(|c| positions.iter().zip(&weights).map(|(&j, w)| w / total * latent[j * r + c] as f64).sum()).collect()
}

/// DSA's index score of each of a row's first `seen` positions for one query: the sum over index
/// heads of `weights[h] * relu(queries[h] . key_j)`, the keys `queries[h].len()` wide.
pub fn index_scores(keys: &[f32], queries: &[&[f32]], weights: &[f32], seen: usize) -> Vec<f64> {
    (0..seen)
        .map(|j| {
            queries
                .iter()
                .zip(weights)
                .map(|(q, &w)| {
                    let x = q.len();
                    let dot: f64 = q.iter().zip(&keys[j * x..][..x]).map(|(a, c)| *a as f64 * *c as f64).sum();
                    w as f64 * dot.max(0.0)
                })
                .sum()
        })
        .collect()
}
