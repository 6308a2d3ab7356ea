//! Shared prefixes (`share_prefix`, `attach_prefix`, `fork_row`): rows over a prefix read exactly
//! as rows holding copies of it. Attention (dense, causal queries reaching into the prefix, mask
//! arrays, DSA's index scores and selected attention) against the float64 reference over plain
//! vectors and against the same cache copied (`materialized`); the row operations, saves and
//! refusals against the reference model's rows (`rows`).
#[path = "../common/mod.rs"]
mod common;

mod attention;
mod rows;

use common::mlx_helpers::{array, host};
use common::model::Rng;
use latent_cache::{Family, Geometry, LatentCache, LayoutKind};

pub const WIDTHS: [usize; 3] = [32, 16, 24];
pub const PREFIX: usize = 40;

pub fn geometry(layout: LayoutKind) -> Geometry {
    common::mlx_helpers::geometry(WIDTHS, layout)
}

/// Each row's positions of every family as plain vectors (what the rows read).
#[derive(Clone, Debug)]
pub struct Rows(pub Vec<[Vec<f32>; 3]>);

impl Rows {
    pub fn len(&self, b: usize) -> usize {
        self.0[b][0].len() / WIDTHS[0]
    }

    /// Appends `tokens` random positions to every row of `cache` and of the rows.
    pub fn append(&mut self, cache: &mut LatentCache, rng: &mut Rng, tokens: usize) {
        let batch = self.0.len();
        let data: Vec<Vec<f32>> = WIDTHS.iter().map(|&w| rng.uniform(batch * tokens * w, 1.0)).collect();
        let arrays: Vec<_> = WIDTHS.iter().zip(&data).map(|(&w, d)| array(d, &[batch, tokens, w])).collect();
        cache.append(&arrays[0], &arrays[1], Some(&arrays[2])).unwrap();
        for (b, row) in self.0.iter_mut().enumerate() {
            for f in 0..3 {
                let w = WIDTHS[f];
                row[f].extend_from_slice(&data[f][b * tokens * w..(b + 1) * tokens * w]);
            }
        }
    }

    /// Keeps each row's first `keep[b]` positions.
    pub fn truncate(&mut self, keep: &[usize]) {
        for (row, &k) in self.0.iter_mut().zip(keep) {
            for f in 0..3 {
                row[f].truncate(k * WIDTHS[f]);
            }
        }
    }
}

/// A one-row cache holding `PREFIX` random positions, and its row.
pub fn prompt(layout: LayoutKind, rng: &mut Rng) -> (LatentCache, Rows) {
    let mut cache = LatentCache::new(geometry(layout)).unwrap();
    let mut rows = Rows(vec![Default::default()]);
    rows.append(&mut cache, rng, PREFIX);
    (cache, rows)
}

/// Checks every row's positions read back (`read_row`) and the window (`state`) against `rows`.
pub fn assert_rows(cache: &LatentCache, rows: &Rows, what: &str) {
    assert_eq!(cache.batch_size(), rows.0.len(), "{what}: rows");
    let lengths: Vec<usize> = (0..rows.0.len()).map(|b| rows.len(b)).collect();
    assert_eq!(cache.row_offsets(), lengths, "{what}: row_offsets");
    let state = cache.state().unwrap();
    let views = [&state.latent, &state.rope, state.index_keys.as_ref().unwrap()];
    for (f, family) in [Family::Latent, Family::Rope, Family::IndexKeys].into_iter().enumerate() {
        let window = host(views[f]);
        let (t, w) = (cache.offset(), WIDTHS[f]);
        assert_eq!(window.len(), rows.0.len() * t * w, "{what}: window of {family:?}");
        for b in 0..rows.0.len() {
            assert_eq!(cache.read_row(family, b).unwrap(), rows.0[b][f], "{what}: read_row {b} {family:?}");
            let pad = cache.left_pad()[b];
            let got = &window[(b * t + pad) * w..(b * t + pad) * w + rows.0[b][f].len()];
            assert_eq!(got, &rows.0[b][f][..], "{what}: state row {b} {family:?}");
        }
    }
}
