//! The independent reference for composed storage that `tests/storage/composed.rs` and
//! `tests/storage/composed_hostile.rs` check against: two plain models given the same operations, one
//! holding what the compact modes read back and one what the hot mode reads back, and each row's
//! boundary from the documented rule (`composed_rule::boundary` of the row's settled length:
//! inside a round what it held when the round began, inside a padded prefill its positions that
//! cannot be right padding), never past the row's end. After every step each row reads, bit for
//! bit, the compact model below its boundary and the hot model from it on.
#![allow(dead_code)]

use latent_cache::{Family, Geometry, LatentCache, LayoutKind};
use mlx_rs::Dtype;

use super::composed_rule::{boundary, BLOCK};
use super::core_check::widths;
use super::model::Model;
use latent_cache::core::mlx::ops;

pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}

/// Bit-for-bit equality, reported as the first difference (rows are thousands of values).
pub fn assert_bits(got: &[u32], want: &[u32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i] != want[i]) {
        let count = (0..got.len()).filter(|&i| got[i] != want[i]).count();
        let (g, w) = (f32::from_bits(got[i]), f32::from_bits(want[i]));
        panic!("{what}: {count} values differ, first at {i}: got {g:e} want {w:e}");
    }
}

/// The reference: what every row reads, from two plain models and the documented boundaries.
#[derive(Clone)]
pub struct Reference {
    pub g: Geometry,
    pub compact: Model,
    pub hot: Model,
    pub converted: Vec<usize>,
    pub maintaining: bool,
    /// An open padded prefill's right padding (prefill_prepare until prefill_finalize).
    pub right: Option<Vec<usize>>,
    /// An open padded prefill's prompt ends (its `base + lengths` per row), when given: they
    /// bound what is settled instead of the right padding.
    pub prompt_ends: Option<Vec<usize>>,
}

impl Reference {
    pub fn new(g: Geometry) -> Self {
        let modes = [g.latent_storage, g.rope_storage, g.index_storage];
        let mut compact = Model::with_modes(widths(&g), modes);
        let mut hot = Model::with_modes(widths(&g), [g.hot_storage; 3]);
        compact.ragged = g.layout == LayoutKind::Ragged;
        hot.ragged = compact.ragged;
        Reference { g, compact, hot, converted: Vec::new(), maintaining: false, right: None, prompt_ends: None }
    }

    pub fn both(&mut self, f: impl Fn(&mut Model)) {
        f(&mut self.compact);
        f(&mut self.hot);
    }

    pub fn rows(&self) -> usize {
        self.compact.rows.len()
    }

    pub fn lengths(&self) -> Vec<usize> {
        self.compact.row_offsets()
    }

    /// Row `b`'s settled length were it `len` long: less the right padding an open padded
    /// prefill will drop, and inside a round no more than it held when the round began.
    pub fn settled_at(&self, b: usize, len: usize) -> usize {
        let valid = self.valid_at(b, len);
        match &self.compact.round {
            Some(start) => valid.min(start.get(b).copied().unwrap_or(0)),
            None => valid,
        }
    }

    /// Row `b`'s positions that are its prompt's were it `len` long: with the prompts' lengths,
    /// up to its prompt's end; otherwise all but its right padding.
    pub fn valid_at(&self, b: usize, len: usize) -> usize {
        match (&self.prompt_ends, &self.right) {
            (Some(ends), _) => len.min(ends[b]),
            (None, Some(right)) => len.saturating_sub(right[b]),
            (None, None) => len,
        }
    }

    /// The documented rule after every step: never past the row's end, and at least where the
    /// settled length puts it.
    pub fn settle(&mut self) {
        let lengths = self.lengths();
        self.converted.resize(lengths.len(), 0);
        for (b, &len) in lengths.iter().enumerate() {
            let settled = self.settled_at(b, len);
            self.converted[b] = self.converted[b].min(len).max(boundary(settled, self.g.hot_window));
        }
    }

    /// Whether a trim of `n` without bypass keeps every row what a fresh prefill holds.
    pub fn reusable_trim(&self, n: usize) -> bool {
        let lengths = self.lengths();
        n == 0 || self.converted.iter().zip(lengths).all(|(&c, len)| c == 0 || boundary(len - n, self.g.hot_window) >= c)
    }

    /// Row `b`'s positions that leave with it mid-prefill (its prompt, without right padding).
    pub fn valid_len(&self, b: usize) -> usize {
        self.valid_at(b, self.compact.len(b))
    }

    /// The reference of one row leaving mid-prefill: its prompt, with its boundary.
    pub fn extract(&self, b: usize) -> Reference {
        let mut out = Reference::new(self.g);
        let keep = self.valid_len(b);
        out.compact = self.compact.extract(b);
        out.hot = self.hot.extract(b);
        out.both(|m| m.truncate_row(0, keep));
        out.converted = vec![self.converted[b].min(keep)];
        out.settle();
        out
    }

    /// A fresh cache's reference holding every row of `sources` (one empty row per empty source).
    pub fn merge(sources: &[&Reference]) -> Reference {
        let mut out = Reference::new(sources[0].g);
        let (mut compacts, mut hots) = (Vec::new(), Vec::new());
        for s in sources {
            if s.rows() == 0 {
                compacts.push(s.compact.empty_like());
                hots.push(s.hot.empty_like());
                out.converted.push(0);
            }
            for b in 0..s.rows() {
                let one = s.extract(b);
                compacts.push(one.compact);
                hots.push(one.hot);
                out.converted.push(one.converted[0]);
            }
        }
        // `Model::merge` gives an empty source one empty row, as the cache does.
        out.compact = Model::merge(&compacts.iter().collect::<Vec<_>>());
        out.hot = Model::merge(&hots.iter().collect::<Vec<_>>());
        out.settle();
        out
    }

    pub fn check(&self, cache: &LatentCache, step: &str) {
        assert_eq!(cache.batch_size(), self.rows(), "batch after {step}");
        assert_eq!(cache.row_offsets(), self.lengths(), "row_offsets after {step}");
        assert_eq!(cache.left_pad(), self.compact.left_pad().as_slice(), "left_pad after {step}");
        assert_eq!(cache.converted_positions(), self.converted, "boundaries after {step}");
        self.check_limits(cache, step);
        if self.rows() == 0 {
            return;
        }
        // The whole window as `state` returns it, each row's valid positions read from it.
        let state = cache.state().unwrap();
        let (offset, ends) = (cache.offset(), cache.row_ends().to_vec());
        for (f, family) in Family::ALL.into_iter().enumerate() {
            let w = self.compact.widths[f];
            let composed = self.g.is_composed(family);
            let view = state.get(family).unwrap();
            // A family that is not composed reads as a view of its buffer, which may be longer
            // than the window: laid out first.
            let window = ops::to_host(&ops::contiguous(&ops::astype(view, Dtype::Float32).unwrap()).unwrap()).unwrap();
            for row in 0..self.rows() {
                let got = bits(&cache.read_row(family, row).unwrap());
                let lo = (row * offset + cache.left_pad()[row]) * w;
                let from_state = bits(&window[lo..(row * offset + ends[row]) * w]);
                assert_bits(&from_state, &got, &format!("{} row {row} of state after {step}", family.name()));
                let split = if composed { self.converted[row] * w } else { usize::MAX };
                let cold = &self.compact.rows[row].families[f];
                let warm = &self.hot.rows[row].families[f];
                let want: Vec<u32> = (0..cold.len()).map(|i| if i < split { cold[i] } else { warm[i] }.to_bits()).collect();
                assert_bits(&got, &want, &format!("{} row {row} after {step}", family.name()));
            }
        }
    }

    /// `max_append_tokens` and `minimum_reusable_offset` against brute force over the rule.
    pub fn check_limits(&self, cache: &LatentCache, step: &str) {
        let (lengths, hw) = (self.lengths(), self.g.hot_window);
        let in_round = self.compact.round.is_some();
        // Inside a padded prefill see `max_append_tokens_inside_a_padded_prefill`.
        if !in_round && self.right.is_none() && self.rows() > 0 {
            // The most positions an append may add and move no row's boundary.
            let most = (0..self.rows())
                .map(|b| {
                    let moves = |n: usize| boundary(self.settled_at(b, lengths[b] + n), hw) > self.converted[b];
                    // No move within far more than a window and a block: no limit (max_tokens 0).
                    let cap = lengths[b] + hw + 4 * BLOCK;
                    match (0..cap).take_while(|&n| !moves(n + 1)).last().map_or(0, |n| n + 1) {
                        n if n == cap => usize::MAX,
                        n => n,
                    }
                })
                .min()
                .unwrap();
            assert_eq!(cache.max_append_tokens(), most, "max_append_tokens after {step}");
        }
        if !in_round && self.right.is_none() && self.converted.iter().any(|&c| c > 0) {
            let shortest = lengths.iter().copied().min().unwrap();
            let most = (0..=shortest).take_while(|&n| self.reusable_trim(n)).last().unwrap();
            assert_eq!(cache.minimum_reusable_offset(), cache.offset() - most, "minimum_reusable_offset after {step}");
        }
    }
}
