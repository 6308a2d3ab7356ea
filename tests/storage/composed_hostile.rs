//! Hostile tests of composed storage: sequences chosen to stress the hot side's bookkeeping
//! (each row's hot base and boundary, rebuilds and in-place moves) against the same independent
//! reference as `tests/storage/composed.rs`: two plain models (the compact modes and the hot mode) and
//! each row's boundary from the documented rule `floor((settled - hot_window) / 64) * 64` (the
//! settled length: inside a round what the row held when it began, inside a padded prefill its
//! positions that cannot be right padding), never past the row's end. Covered: trims with
//! bypass below the boundary followed by appends, rounds and more trims; ragged rows ending
//! apart with uneven rollbacks; right-justified rows shifting left in place; filter / extract /
//! merge of rows with different boundaries (none hot, all hot, empty sources, sources
//! mid-prefill); padded prefills with maintenance and rounds; reserve and reset; extreme hot
//! windows; float and FP8 families under every hot mode; long decodes and the hot side's size;
//! the views an append returns; saves and loads; donor attention and DSA selection over
//! composed rows; and `max_append_tokens` / `minimum_reusable_offset` against brute force over
//! the rule (inside padded prefills too).
use crate::common::attention_ref::{attention, index_scores, seen, visible};
use crate::common::composed_ref::{assert_bits, bits, Reference};

use crate::common::composed_rule::{composed_layer, BLOCK};

use crate::common::core_check::widths;
use crate::common::mlx_helpers::{array, host};
use crate::common::model::Rng;
use latent_cache::core::attention::MaskMode;
use latent_cache::core::mlx::{math, ops};

use latent_cache::StorageMode::{Bf16, Fp8, F16, F32, Q4, Q8};
use latent_cache::{ErrorKind, Family, Geometry, LatentCache, LayoutKind, StorageMode};
use mlx_rs::Array;

const RJ: LayoutKind = LayoutKind::RightJustified;
const RAGGED: LayoutKind = LayoutKind::Ragged;
const LAYOUTS: [LayoutKind; 2] = [RJ, RAGGED];

fn geometry(hot_window: usize, hot: StorageMode, modes: [StorageMode; 3], layout: LayoutKind) -> Geometry {
    composed_layer(128, hot_window, hot, modes, layout)
}

/// A composed cache, its reference and the random source of its inputs.
struct Harness {
    cache: LatentCache,
    r: Reference,
    rng: Rng,
    /// Inputs are `Rng::floats` times this (small values keep attention's softmax smooth).
    scale: f32,
    /// A cache of the compact modes alone given every append, trim and round (for sizes).
    shadow: Option<LatentCache>,
}

impl Harness {
    fn new(g: Geometry, seed: u64) -> Self {
        Harness { cache: LatentCache::new(g).unwrap(), r: Reference::new(g), rng: Rng::new(seed), scale: 1.0, shadow: None }
    }

    /// `new` with a shadow cache of the compact modes alone.
    fn shadowed(g: Geometry, seed: u64) -> Self {
        let shadow = LatentCache::new(Geometry { hot_window: 0, ..g }).unwrap();
        Harness { shadow: Some(shadow), ..Harness::new(g, seed) }
    }

    /// Bytes the hot side holds: the composed cache's less its shadow's.
    fn hot_bytes(&self) -> usize {
        self.cache.bytes_in_use() - self.shadow.as_ref().unwrap().bytes_in_use()
    }

    fn data(&mut self, batch: usize, tokens: usize) -> [Vec<f32>; 3] {
        let w = self.r.compact.widths;
        let scale = self.scale;
        std::array::from_fn(|f| self.rng.floats(batch * tokens * w[f]).into_iter().map(|v| v * scale).collect())
    }

    fn append(&mut self, tokens: usize) {
        let batch = self.r.rows().max(1);
        let data = self.data(batch, tokens);
        self.cache.append_host(batch, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.append_host(batch, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
        }
        self.r.both(|m| m.append(batch, tokens, &data));
        self.r.settle();
    }

    /// The first append of an empty cache, row `b` padded by `pads[b]`.
    fn append_padded(&mut self, pads: &[usize], tokens: usize) {
        let batch = pads.len();
        let data = self.data(batch, tokens);
        self.cache.append_host_padded(batch, tokens, pads, &data[0], &data[1], Some(&data[2])).unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.append_host_padded(batch, tokens, pads, &data[0], &data[1], Some(&data[2])).unwrap();
        }
        self.r.both(|m| m.append_padded(batch, tokens, pads, &data));
        self.r.settle();
    }

    /// A trim; returns whether the cache took it (checked against the rule either way).
    fn trim(&mut self, n: usize, bypass: bool) -> bool {
        let before = self.r.clone();
        match self.cache.trim(n, bypass) {
            Ok(_) => {
                assert!(bypass || self.r.reusable_trim(n), "trim {n} without bypass should be refused");
                if let Some(shadow) = &mut self.shadow {
                    shadow.trim(n, true).unwrap();
                }
                self.r.both(|m| m.trim(n));
                self.r.settle();
                true
            }
            Err(e) => {
                let refusable = !bypass && !self.r.reusable_trim(n);
                assert!(refusable || n > *self.r.lengths().iter().min().unwrap_or(&0), "trim {n}: {}", e.message);
                if refusable {
                    assert_eq!(e.kind, ErrorKind::State, "{}", e.message);
                }
                before.check(&self.cache, &format!("refused trim {n}"));
                false
            }
        }
    }

    fn begin(&mut self) {
        self.cache.spec_round_begin().unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.spec_round_begin().unwrap();
        }
        self.r.both(|m| m.begin());
    }

    fn rollback(&mut self, keep: &[usize]) {
        self.cache.spec_round_rollback(keep).unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.spec_round_rollback(keep).unwrap();
        }
        self.r.both(|m| m.rollback(keep));
        self.r.settle();
    }

    fn commit(&mut self) {
        self.cache.spec_round_commit().unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.spec_round_commit().unwrap();
        }
        self.r.both(|m| m.round = None);
        self.r.settle();
    }

    fn filter(&mut self, keep: &[usize]) {
        self.cache.filter_rows(keep).unwrap();
        if let Some(shadow) = &mut self.shadow {
            shadow.filter_rows(keep).unwrap();
        }
        self.r.both(|m| m.filter(keep));
        self.r.converted = keep.iter().map(|&b| self.r.converted[b]).collect();
        if let Some(right) = &mut self.r.right {
            *right = keep.iter().map(|&b| right[b]).collect();
        }
        if let Some(ends) = &mut self.r.prompt_ends {
            *ends = keep.iter().map(|&b| ends[b]).collect();
        }
        self.r.settle();
    }

    fn maintain(&mut self) {
        self.cache.prefill_begin().unwrap();
        self.r.maintaining = true;
    }

    fn end_maintenance(&mut self) {
        self.cache.prefill_end().unwrap();
        self.r.maintaining = false;
        self.r.settle();
    }

    /// `prefill_commit(rows)`: boundaries already follow settled lengths, so nothing moves.
    fn commit_rows(&mut self, rows: &[usize]) {
        self.cache.prefill_commit(rows).unwrap();
    }

    fn prepare(&mut self, right: &[usize]) {
        self.cache.prefill_prepare(None, None, Some(right)).unwrap();
        self.r.right = Some(right.to_vec());
    }

    /// `prepare` on an empty cache, with the first append's left padding.
    fn prepare_padded(&mut self, left: &[usize], right: &[usize]) {
        self.cache.prefill_prepare(None, Some(left), Some(right)).unwrap();
        self.r.right = Some(right.to_vec());
    }

    fn finalize(&mut self) {
        self.cache.prefill_finalize().unwrap();
        let right = self.r.right.take().unwrap();
        self.r.prompt_ends = None;
        for (b, &drop) in right.iter().enumerate() {
            let len = self.r.compact.len(b);
            self.r.both(|m| m.truncate_row(b, len - drop));
        }
        self.r.settle();
    }

    /// Row `b` extracted into a cache of its own, with its reference.
    fn extract(&self, b: usize) -> Harness {
        let cache = self.cache.extract_row(b).unwrap();
        Harness { cache, r: self.r.extract(b), rng: Rng::new(b as u64 + 1000), scale: self.scale, shadow: None }
    }

    /// A fresh cache merging `sources`, with its reference.
    fn merge(sources: &[&Harness], seed: u64) -> Harness {
        let mut cache = LatentCache::new(sources[0].r.g).unwrap();
        cache.merge_rows(&sources.iter().map(|h| &h.cache).collect::<Vec<_>>()).unwrap();
        let r = Reference::merge(&sources.iter().map(|h| &h.r).collect::<Vec<_>>());
        // The shadows merge alike when every source has one.
        let shadows: Option<Vec<&LatentCache>> = sources.iter().map(|h| h.shadow.as_ref()).collect();
        let shadow = shadows.map(|shadows| {
            let mut merged = LatentCache::new(*shadows[0].geometry()).unwrap();
            merged.merge_rows(&shadows).unwrap();
            merged
        });
        Harness { cache, r, rng: Rng::new(seed), scale: sources[0].scale, shadow }
    }

    fn reset(&mut self) {
        self.cache.reset();
        if let Some(shadow) = &mut self.shadow {
            shadow.reset();
        }
        self.r = Reference::new(self.r.g);
    }

    fn check(&self, step: &str) {
        self.r.check(&self.cache, step);
    }
}

/// Every layout with several hot windows: `f(layout, hot_window)`.
fn each(hot_windows: &[usize], mut f: impl FnMut(LayoutKind, usize)) {
    for layout in LAYOUTS {
        for &hw in hot_windows {
            f(layout, hw);
        }
    }
}

fn standard(hw: usize, layout: LayoutKind) -> Geometry {
    geometry(hw, F32, [Q8, Bf16, Fp8], layout)
}

/// Trims with bypass that cut below boundaries (rows with no hot position left), then
/// appends of every size, rounds, trims without bypass and more bypass trims.
#[test]
fn bypass_trims_below_the_boundary_then_appends() {
    each(&[1, 10, 64, 100], |layout, hw| {
        for pads in [vec![0], vec![0, 37, 150]] {
            let what = format!("{layout:?} hot {hw} rows {}", pads.len());
            let mut h = Harness::new(standard(hw, layout), hw as u64);
            h.append_padded(&pads, 400);
            h.check(&format!("{what}: prefill"));
            for (i, n) in [120usize, 3, 180].into_iter().enumerate() {
                assert!(h.trim(n, true));
                h.check(&format!("{what}: bypass trim {i}"));
                for tokens in [1, 70, 1, 130] {
                    h.append(tokens);
                    h.check(&format!("{what}: append {tokens} after bypass trim {i}"));
                }
            }
            // A round whose rollback drops unevenly, then a trim at the reusable limit.
            h.begin();
            h.append(5);
            let keep: Vec<usize> = (0..pads.len()).map(|b| b % 3 + 1).collect();
            h.rollback(&keep);
            h.check(&format!("{what}: uneven rollback"));
            let n = h.cache.offset() - h.cache.minimum_reusable_offset();
            assert!(h.trim(n, false), "{what}: trim to minimum_reusable_offset");
            h.check(&format!("{what}: trim to the minimum"));
            if h.r.converted.iter().any(|&c| c > 0) {
                assert!(!h.trim(1, false), "{what}: one past the minimum");
            }
            // Down to one position per shortest row, then grow again.
            let shortest = *h.r.lengths().iter().min().unwrap();
            assert!(h.trim(shortest - 1, true));
            h.check(&format!("{what}: deep bypass trim"));
            for _ in 0..3 {
                h.append(BLOCK);
            }
            h.append(300);
            h.check(&format!("{what}: regrown"));
        }
    });
}

/// Ragged rows ending far apart (a merge of different lengths), rounds with uneven rollbacks,
/// and appends that move some rows' boundaries and not others.
#[test]
fn ragged_rows_ending_apart_with_uneven_rollbacks() {
    for hw in [1, 30, 200] {
        let g = standard(hw, RAGGED);
        let mut parts: Vec<Harness> = Vec::new();
        for (i, len) in [700usize, 5, 333].into_iter().enumerate() {
            let mut h = Harness::new(g, i as u64);
            h.append(len);
            parts.push(h);
        }
        let mut h = Harness::merge(&parts.iter().collect::<Vec<_>>(), hw as u64);
        h.check(&format!("hot {hw}: merged"));
        for step in 0..40 {
            h.begin();
            let tokens = 1 + step % 7;
            h.append(tokens);
            let keep: Vec<usize> = (0..3).map(|b| (step + b * 5) % (tokens + 1)).collect();
            h.rollback(&keep);
            h.check(&format!("hot {hw} step {step}: rollback {keep:?}"));
            h.append(1 + step % 3 * 31);
            h.check(&format!("hot {hw} step {step}: append"));
        }
    }
}

/// A merge whose sources include a cache without rows: that source gives one empty row.
#[test]
fn merge_with_an_empty_source() {
    for layout in LAYOUTS {
        let g = standard(10, layout);
        let mut full = Harness::new(g, 1);
        full.append(200);
        let empty = Harness::new(g, 2);
        let h = Harness::merge(&[&full, &empty], 3);
        h.check(&format!("{layout:?}: merged with an empty source"));
        let h = Harness::merge(&[&empty], 4);
        h.check(&format!("{layout:?}: merged from an empty source alone"));
    }
}

/// Rows with different boundaries (none hot after a bypass trim; all hot; in between) moved by
/// filter, extract and merge, then appended to.
#[test]
fn row_moves_carry_different_boundaries() {
    each(&[1, 50, 300], |layout, hw| {
        let what = format!("{layout:?} hot {hw}");
        let g = standard(hw, layout);
        // Row 0 long, row 1 short (all hot), row 2 in between.
        let mut h = Harness::new(g, hw as u64);
        h.append_padded(&[0, 500, 200], 600);
        // Rows whose boundary this trim passes keep no hot position; the others keep some.
        assert!(h.trim(90, true));
        h.check(&format!("{what}: bypass"));
        h.append(2);
        h.check(&format!("{what}: append"));
        let single = h.extract(2);
        single.check(&format!("{what}: extract 2"));
        let mut merged = Harness::merge(&[&single, &h, &single], 9);
        merged.check(&format!("{what}: merge"));
        merged.filter(&[3, 1, 0]);
        merged.check(&format!("{what}: filter"));
        for tokens in [1, 64, 5] {
            merged.append(tokens);
            merged.check(&format!("{what}: append {tokens} after filter"));
        }
        // A filter keeping every row in order rebuilds in place.
        merged.filter(&[0, 1, 2]);
        merged.check(&format!("{what}: identity filter"));
        merged.filter(&[1]);
        merged.append(70);
        merged.check(&format!("{what}: filtered to one row"));
    });
}

/// A source mid-prefill (right padding appended, not dropped) gives its rows' prompts.
#[test]
fn merging_a_cache_mid_prefill() {
    each(&[1, 20], |layout, hw| {
        let what = format!("{layout:?} hot {hw}");
        let g = standard(hw, layout);
        let mut h = Harness::new(g, 5);
        h.append(150);
        h.prepare(&[30]);
        h.append(90);
        let mut p = Harness::new(g, 6);
        p.prepare_padded(&[0, 40], &[70, 0]);
        p.append_padded(&[0, 40], 200);
        p.append(3);
        p.check(&format!("{what}: mid-prefill"));
        let merged = Harness::merge(&[&p, &h], 7);
        merged.check(&format!("{what}: merged mid-prefill"));
        let one = p.extract(0);
        one.check(&format!("{what}: extracted mid-prefill"));
        p.finalize();
        h.finalize();
        p.check(&format!("{what}: finalized"));
        h.check(&format!("{what}: finalized"));
    });
}

/// Padded prefills inside maintenance, with rounds before and after, commits and chunks.
#[test]
fn padded_prefill_inside_maintenance_with_rounds() {
    each(&[1, 70, 200], |layout, hw| {
        let what = format!("{layout:?} hot {hw}");
        let mut h = Harness::new(standard(hw, layout), 8);
        h.maintain();
        h.prepare_padded(&[0, 100, 30], &[0, 40, 150]);
        h.append_padded(&[0, 100, 30], 200);
        for tokens in [37, 1, 150] {
            h.append(tokens);
            h.check(&format!("{what}: chunk {tokens}"));
        }
        h.finalize();
        h.check(&format!("{what}: finalized inside maintenance"));
        h.commit_rows(&[1]);
        h.check(&format!("{what}: commit row 1"));
        h.append(65);
        h.check(&format!("{what}: append inside maintenance"));
        h.end_maintenance();
        h.check(&format!("{what}: maintenance ended"));
        h.begin();
        h.append(4);
        h.rollback(&[0, 4, 2]);
        h.check(&format!("{what}: rollback"));
        // A second prefill on the rows, finalized by uneven drops.
        h.prepare(&[5, 0, 64]);
        h.append(80);
        h.finalize();
        h.check(&format!("{what}: second prefill"));
        for _ in 0..70 {
            h.append(1);
        }
        h.check(&format!("{what}: decoded"));
    });
}

/// Reserve, reset and reuse, in both layouts, with a different batch after the reset.
#[test]
fn reserve_reset_and_reuse() {
    each(&[1, 100], |layout, hw| {
        let what = format!("{layout:?} hot {hw}");
        let mut h = Harness::new(standard(hw, layout), 10);
        h.cache.reserve(1000).unwrap();
        h.append_padded(&[3, 0], 300);
        h.cache.reserve(5000).unwrap();
        h.check(&format!("{what}: reserved"));
        h.append(700);
        h.check(&format!("{what}: grown"));
        h.begin();
        h.append(3);
        h.reset();
        assert!(!h.cache.in_spec_round());
        h.check(&format!("{what}: reset"));
        h.append_padded(&[0, 5, 9], 100);
        h.check(&format!("{what}: reused"));
        h.cache.reserve(10).unwrap();
        h.append(200);
        h.reset();
        h.append(1);
        h.check(&format!("{what}: reused with one row"));
    });
}

/// A hot window of one position, and one larger than everything appended.
#[test]
fn extreme_hot_windows() {
    each(&[1, 100_000], |layout, hw| {
        let what = format!("{layout:?} hot {hw}");
        let mut h = Harness::new(standard(hw, layout), 11);
        h.append_padded(&[0, 63, 64], 130);
        for tokens in [1, 62, 1, 1, 200] {
            h.append(tokens);
            h.check(&format!("{what}: append {tokens}"));
        }
        h.begin();
        h.append(3);
        h.rollback(&[3, 0, 1]);
        h.check(&format!("{what}: rollback"));
        assert!(h.trim(5, true));
        h.check(&format!("{what}: bypass trim"));
        h.filter(&[2, 0]);
        h.check(&format!("{what}: filter"));
    });
}

/// A short sequence touching every path (padded prefill, growth, round, trims, filter, merge).
fn exercise(g: Geometry, what: &str) {
    let mut h = Harness::new(g, 12);
    h.append_padded(&[0, 80, 7], 260);
    h.check(&format!("{what}: prefill"));
    for tokens in [1, 64, 200] {
        h.append(tokens);
    }
    h.check(&format!("{what}: appends"));
    h.begin();
    h.append(6);
    h.rollback(&[6, 1, 3]);
    h.check(&format!("{what}: rollback"));
    assert!(h.trim(100, true));
    h.append(3);
    h.check(&format!("{what}: bypass trim and append"));
    let one = h.extract(1);
    let mut merged = Harness::merge(&[&h, &one], 13);
    merged.filter(&[3, 0]);
    merged.append(90);
    merged.check(&format!("{what}: filter and merge"));
}

/// 16-bit and 8-bit float compact families under a float32 hot mode, and a bfloat16 hot mode
/// over the affine modes.
#[test]
fn float_compact_families_and_a_bfloat16_hot_mode() {
    let cases =
        [(F32, [F16, Bf16, Fp8]), (F32, [Bf16, F16, Q4]), (F32, [Q4, Q8, F16]), (Bf16, [Q8, Q4, Q8]), (F16, [Q4, Q8, Q4])];
    for (hot, modes) in cases {
        for layout in LAYOUTS {
            for hw in [1, 90] {
                exercise(geometry(hw, hot, modes, layout), &format!("hot {hot:?} {modes:?} {layout:?} window {hw}"));
            }
        }
    }
}

/// FP8 below a 16-bit hot mode: a compact position reads what a cache of FP8 alone reads.
#[test]
fn fp8_below_a_16_bit_hot_mode() {
    for hot in [Bf16, F16] {
        let g = geometry(1, hot, [Fp8, Q8, Q8], RJ);
        let mut composed = Harness::new(g, 21);
        composed.append(130);
        assert_eq!(composed.cache.converted_positions(), vec![128]);
        // The same values in a cache of the compact modes alone.
        let mut alone = Harness::new(Geometry { hot_window: 0, ..g }, 21);
        alone.append(130);
        let w = g.kv_lora_rank;
        let got = bits(&composed.cache.read_row(Family::Latent, 0).unwrap()[..128 * w]);
        let want = bits(&alone.cache.read_row(Family::Latent, 0).unwrap()[..128 * w]);
        assert_bits(&got, &want, &format!("hot {hot:?}: compact positions"));
    }
}

/// FP8, Q8 and Q4 below a 16-bit hot mode through the whole sequence (FP8 only under float32).
#[test]
fn affine_modes_below_16_bit_hot_modes_and_fp8_below_float32() {
    for hot in [Bf16, F16] {
        exercise(geometry(5, hot, [Q4, Q8, Q8], RJ), &format!("hot {hot:?} over q4/q8"));
    }
    exercise(geometry(5, F32, [Fp8, Q8, Fp8], RAGGED), "hot f32 over fp8");
}

/// The hot side's bytes beyond a cache of the compact modes alone, against a bound of about
/// the window per row (growth doubles: twice the window plus two blocks, or the minimum).
fn assert_hot_side_bounded(h: &Harness, what: &str) {
    let g = h.r.g;
    let per_position: usize = Family::ALL
        .into_iter()
        .zip(widths(&g))
        .filter(|&(f, _)| g.is_composed(f))
        .map(|(_, w)| w * if g.hot_storage == F32 { 4 } else { 2 })
        .sum();
    let bound = h.r.rows() * 2 * (g.hot_window + 2 * BLOCK + 256) * per_position;
    let hot = h.hot_bytes();
    assert!(hot <= bound, "{what}: hot side {hot} bytes, bound {bound} (rows {:?})", h.r.lengths());
}

/// Thousands of single-position appends (each boundary move and every hot-side rebuild), with
/// rounds and trims in between: state stays the reference's and the hot side stays small.
#[test]
fn long_decode_with_rounds_and_trims_stays_bounded() {
    for layout in LAYOUTS {
        for hw in [1, 100] {
            let what = format!("{layout:?} hot {hw}");
            let mut h = Harness::shadowed(standard(hw, layout), 14);
            h.append_padded(&[0, 300], 2000);
            for step in 1..=3000 {
                h.append(1);
                if step % 97 == 0 {
                    h.begin();
                    h.append(3);
                    h.rollback(&[1, 3]);
                }
                if step % 211 == 0 {
                    h.trim(2 * BLOCK, true);
                }
                if step % 389 == 0 {
                    let n = h.cache.offset() - h.cache.minimum_reusable_offset();
                    assert!(h.trim(n, false), "{what} step {step}: trim to the minimum");
                }
                if step % 500 == 0 {
                    h.check(&format!("{what}: step {step}"));
                }
                assert_hot_side_bounded(&h, &format!("{what} step {step}"));
            }
        }
    }
}

/// Ragged rows of very different lengths (a merge): rows end far apart in the window, and the
/// hot side should still hold about the window per row.
#[test]
fn ragged_rows_ending_apart_keep_the_hot_side_bounded() {
    let g = standard(100, RAGGED);
    let mut long = Harness::shadowed(g, 15);
    long.append(4000);
    let mut short = Harness::shadowed(g, 16);
    short.append(10);
    let mut h = Harness::merge(&[&long, &short], 17);
    for step in 1..=1000 {
        h.append(1);
        if step % 250 == 0 {
            h.check(&format!("step {step}"));
        }
    }
    // Checked after the decode: the short row's boundary has moved on by then.
    let compact = h.shadow.as_ref().unwrap().bytes_in_use();
    assert_hot_side_bounded(&h, &format!("after 1000 steps (compact modes alone: {compact} bytes)"));
}

/// Small values for queries: softmax over them stays smooth.
fn queries(rng: &mut Rng, n: usize) -> Vec<f32> {
    rng.floats(n).into_iter().map(|v| v / 8192.0).collect()
}

fn close(got: f64, want: f64, tolerance: f64, what: &str) {
    assert!((got - want).abs() <= tolerance * (1.0 + want.abs()), "{what}: {got} vs {want}");
}

/// Quantized families are read by MLX's quantized matmul from bfloat16 scales.
fn tolerance_of(g: &Geometry) -> f64 {
    let gpu = matches!(mlx_rs::Device::default().get_type(), Ok(mlx_rs::DeviceType::Gpu));
    let quantized = [g.latent_storage, g.rope_storage].iter().any(|m| matches!(m, Q8 | Q4));
    if quantized || gpu {
        1e-2
    } else {
        1e-4
    }
}

/// Row `b`'s values of `family` as attention reads them: `read_row`'s, except that the affine
/// modes' (Q8, Q4) compact positions are `code * scale + bias` computed from the stored codes,
/// scales and biases (in float64, then float32), not MLX's `dequantize`, which reads use and
/// which rounds each value to bfloat16. The codes are unpacked exactly by `dequantize` with
/// scale 1 and bias 0.
fn attention_row(cache: &LatentCache, family: Family, b: usize) -> Vec<f32> {
    let mut row = cache.read_row(family, b).unwrap();
    let (g, mode) = (cache.geometry(), cache.geometry().storage(family));
    if !matches!(mode, Q8 | Q4) {
        return row;
    }
    let width = g.width(family).unwrap();
    let parts = cache.stored_parts(family).unwrap();
    let window = parts[0].shape()[1] as usize;
    let groups: Vec<usize> = parts[1].shape().iter().map(|&d| d as usize).collect();
    let ones = math::add(&ops::zeros(&groups, mlx_rs::Dtype::Float32).unwrap(), &ops::scalar(1.0)).unwrap();
    let zeros = ops::zeros(&groups, mlx_rs::Dtype::Float32).unwrap();
    let bits = if mode == Q8 { 8 } else { 4 };
    let codes = host(&ops::dequantize(&parts[0], &ones, &zeros, 64, bits).unwrap());
    let (scales, biases) = (host(&parts[1]), host(&parts[2]));
    // Valid position `j` of the row sits at window position `left_pad + j`; the first
    // `converted` of them are read compact where the family is composed, all of them otherwise.
    let compact = if g.is_composed(family) { cache.converted_positions()[b] } else { row.len() / width };
    let pad = cache.left_pad()[b];
    for j in 0..compact {
        for c in 0..width {
            let at = (b * window + pad + j) * width + c;
            let group = at / 64;
            row[j * width + c] = (codes[at] as f64 * scales[group] as f64 + biases[group] as f64) as f32;
        }
    }
    row
}

/// Donor attention over the cache's rows against float64 over the values `read_row` gives.
fn check_attention(h: &mut Harness, mode: MaskMode, what: &str) {
    let g = h.r.g;
    let donor = h.cache.capture_donor_rows().unwrap();
    let (batch, heads, lq) = (h.r.rows(), 2, 2);
    let (r, p) = (g.kv_lora_rank, g.rope_head_dim);
    let q_latent = queries(&mut h.rng, batch * heads * lq * r);
    let q_rope = queries(&mut h.rng, batch * heads * lq * p);
    let scale = 0.5;
    let out = donor
        .attend(&array(&q_latent, &[batch, heads, lq, r]), &array(&q_rope, &[batch, heads, lq, p]), scale, mode, None)
        .unwrap();
    let got = host(&out);
    let tolerance = tolerance_of(&g);
    for b in 0..batch {
        let rows = [h.cache.read_row(Family::Latent, b).unwrap(), h.cache.read_row(Family::Rope, b).unwrap()];
        let len = h.r.lengths()[b];
        for hd in 0..heads {
            for i in 0..lq {
                let at = (b * heads + hd) * lq + i;
                let positions = visible(len, lq, i, mode == MaskMode::Causal);
                let want =
                    attention(&rows[0], &rows[1], &q_latent[at * r..][..r], &q_rope[at * p..][..p], 0.5, &positions, |_| 0.0);
                for c in 0..r {
                    close(got[at * r + c] as f64, want[c], tolerance, &format!("{what}: row {b} head {hd} query {i} ch {c}"));
                }
            }
        }
    }
}

/// Donor attention over composed rows whose boundaries differ (all hot, none hot after a bypass
/// trim, in between), in both layouts, with a float and a quantized latent.
#[test]
fn donor_attention_over_composed_rows() {
    for modes in [[Q4, Bf16, Q8], [F16, Bf16, Fp8], [Fp8, Q8, Q8]] {
        each(&[1, 40], |layout, hw| {
            let what = format!("{modes:?} {layout:?} hot {hw}");
            let mut h = Harness::new(geometry(hw, F32, modes, layout), 18);
            h.scale = 1.0 / 8192.0;
            h.append_padded(&[0, 250, 120], 300);
            h.append(70);
            check_attention(&mut h, MaskMode::None, &format!("{what}: prefilled"));
            assert!(h.trim(60, true));
            h.append(2);
            check_attention(&mut h, MaskMode::Causal, &format!("{what}: after a bypass trim"));
            h.begin();
            h.append(4);
            h.rollback(&[4, 0, 2]);
            check_attention(&mut h, MaskMode::Causal, &format!("{what}: after an uneven rollback"));
            h.filter(&[2, 0]);
            h.append(1);
            check_attention(&mut h, MaskMode::None, &format!("{what}: after a filter"));
            // One row: the fused single-row path where the latent is a float mode.
            h.filter(&[1]);
            check_attention(&mut h, MaskMode::Causal, &format!("{what}: one row"));
        });
    }
}

/// DSA over composed rows: index scores against float64 over the index keys `read_row` gives,
/// the selection's top-k, and attention over the selected positions.
#[test]
fn dsa_selection_over_composed_rows() {
    for modes in [[Q8, Bf16, Q8], [Bf16, F16, Fp8], [Q4, Q4, Bf16]] {
        each(&[1, 30], |layout, hw| {
            let what = format!("{modes:?} {layout:?} hot {hw}");
            let mut h = Harness::new(geometry(hw, F32, modes, layout), 19);
            h.scale = 1.0 / 8192.0;
            h.append_padded(&[0, 150, 40], 200);
            assert!(h.trim(10, true));
            h.append(75);
            check_dsa(&mut h, MaskMode::None, &what);
            check_dsa(&mut h, MaskMode::Causal, &what);
        });
    }
}

fn check_dsa(h: &mut Harness, mode: MaskMode, what: &str) {
    let g = h.r.g;
    let donor = h.cache.capture_donor_rows().unwrap();
    let (batch, heads, lq, k) = (h.r.rows(), 2, 2, 40);
    let (r, p, x) = (g.kv_lora_rank, g.rope_head_dim, g.index_head_dim);
    // Positive weights and |query| so that scores rarely tie; ReLU still cuts negative products.
    let q_index = queries(&mut h.rng, batch * heads * lq * x);
    let weights: Vec<f32> = queries(&mut h.rng, batch * lq * heads).iter().map(|v| v.abs() + 0.1).collect();
    let scores =
        donor.index_scores(&array(&q_index, &[batch, heads, lq, x]), &array(&weights, &[batch, lq, heads]), mode).unwrap();
    let got_scores = host(&scores);
    let indices = donor.select(&scores, k).unwrap().expect("more positions than k");
    let got_indices = host(&indices);
    let q_latent = queries(&mut h.rng, batch * heads * lq * r);
    let q_rope = queries(&mut h.rng, batch * heads * lq * p);
    let out = donor
        .attend_selected(&array(&q_latent, &[batch, heads, lq, r]), &array(&q_rope, &[batch, heads, lq, p]), 0.5, mode, &indices)
        .unwrap();
    let got_out = host(&out);
    let (t, pads) = (donor.offset(), h.cache.left_pad().to_vec());
    let tolerance = tolerance_of(&g).max(1e-3);
    for b in 0..batch {
        let keys = attention_row(&h.cache, Family::IndexKeys, b);
        let rows = [attention_row(&h.cache, Family::Latent, b), attention_row(&h.cache, Family::Rope, b)];
        let len = h.r.lengths()[b];
        for i in 0..lq {
            let seen = seen(len, lq, i, mode == MaskMode::Causal);
            let q: Vec<&[f32]> = (0..heads).map(|hd| &q_index[((b * heads + hd) * lq + i) * x..][..x]).collect();
            let want = index_scores(&keys, &q, &weights[(b * lq + i) * heads..][..heads], seen);
            for j in 0..seen {
                close(
                    got_scores[(b * lq + i) * t + pads[b] + j] as f64,
                    want[j],
                    tolerance,
                    &format!("{what}: score {b},{i},{j}"),
                );
            }
            // Attention over the selected positions the query sees, as selected.
            let js: Vec<usize> = got_indices[(b * lq + i) * k..][..k]
                .iter()
                .map(|&v| v as usize)
                .filter(|&pos| pos >= pads[b] && pos - pads[b] < seen)
                .map(|pos| pos - pads[b])
                .collect();
            assert_eq!(js.len(), k.min(seen), "{what}: visible selected of row {b} query {i}");
            let weakest = js.iter().map(|&j| want[j]).fold(f64::MAX, f64::min);
            let unselected = (0..seen).filter(|j| !js.contains(j)).map(|j| want[j]).fold(f64::MIN, f64::max);
            assert!(weakest + 1e-3 * (1.0 + weakest.abs()) >= unselected, "{what}: top-{k} of row {b} query {i}");
            for hd in 0..heads {
                let at = (b * heads + hd) * lq + i;
                let want = attention(&rows[0], &rows[1], &q_latent[at * r..][..r], &q_rope[at * p..][..p], 0.5, &js, |_| 0.0);
                for c in 0..r {
                    close(got_out[at * r + c] as f64, want[c], tolerance, &format!("{what}: selected out {b},{hd},{i},{c}"));
                }
            }
        }
    }
}

/// Runs a call that must be refused with `kind`, and checks the cache against the reference.
fn refused(h: &mut Harness, call: &str, kind: ErrorKind, f: impl FnOnce(&mut LatentCache) -> latent_cache::core::Result<()>) {
    let err = f(&mut h.cache).unwrap_err();
    assert_eq!(err.kind, kind, "{call}: {}", err.message);
    h.check(&format!("refused {call}"));
}

/// Every rejected call returns an error and leaves the cache as it was (boundaries included),
/// in states where the hot side is mid-flight: after a bypass trim, mid-round, mid-prefill.
#[test]
fn rejected_calls_change_nothing() {
    each(&[1, 100], |layout, hw| {
        let g = standard(hw, layout);
        let w = widths(&g);
        let half = |n: usize| vec![0.5f32; n];
        let mut h = Harness::new(g, 20);
        h.append_padded(&[0, 200, 90], 400);
        assert!(h.trim(150, true));
        h.append(1);
        refused(&mut h, "trim past the shortest row", ErrorKind::OutOfRange, |c| c.trim(1000, true).map(drop));
        refused(&mut h, "rollback outside a round", ErrorKind::State, |c| c.spec_round_rollback(&[0, 0, 0]));
        refused(&mut h, "filter listing a row twice", ErrorKind::InvalidArgument, |c| c.filter_rows(&[0, 0]));
        refused(&mut h, "filter past the rows", ErrorKind::OutOfRange, |c| c.filter_rows(&[3]));
        refused(&mut h, "append of another batch", ErrorKind::Shape, |c| {
            c.append_host(2, 1, &half(2 * w[0]), &half(2 * w[1]), Some(&half(2 * w[2])))
        });
        refused(&mut h, "padded append on rows", ErrorKind::State, |c| {
            c.append_host_padded(3, 1, &[0, 0, 0], &half(3 * w[0]), &half(3 * w[1]), Some(&half(3 * w[2])))
        });
        refused(&mut h, "commit without maintenance", ErrorKind::State, |c| c.prefill_commit(&[0]));
        refused(&mut h, "left padding on rows", ErrorKind::State, |c| c.prefill_prepare(None, Some(&[0, 1, 2]), None));
        let other = LatentCache::new(standard(if hw == 1 { 100 } else { 1 }, layout)).unwrap();
        refused(&mut h, "merge of another geometry into rows", ErrorKind::InvalidArgument, |c| c.merge_rows(&[&other]));
        h.append(BLOCK);
        if h.r.converted.iter().any(|&c| c > 0) {
            let n = h.cache.offset() - h.cache.minimum_reusable_offset();
            assert!(!h.trim(n + 1, false), "one past minimum_reusable_offset");
        }
        // Mid-round.
        h.begin();
        h.append(3);
        refused(&mut h, "rollback keeping too many", ErrorKind::OutOfRange, |c| c.spec_round_rollback(&[4, 0, 0]));
        refused(&mut h, "trim in a round without bypass", ErrorKind::State, |c| c.trim(1, false).map(drop));
        refused(&mut h, "trim past the round's appends", ErrorKind::State, |c| c.trim(4, true).map(drop));
        refused(&mut h, "filter in a round", ErrorKind::State, |c| c.filter_rows(&[0]));
        h.rollback(&[1, 2, 3]);
        // Mid-prefill: a finalize before the prompts' lengths are reached.
        h.cache.prefill_prepare(Some(&[3, 4, 2]), None, Some(&[1, 0, 2])).unwrap();
        h.r.right = Some(vec![1, 0, 2]);
        h.r.prompt_ends = Some(h.r.lengths().iter().zip([3, 4, 2]).map(|(len, prompt)| len + prompt).collect());
        h.append(3);
        refused(&mut h, "finalize short of the lengths", ErrorKind::InvalidArgument, |c| c.prefill_finalize());
        h.append(1);
        h.finalize();
        h.check("finalized");
    });
}

/// One random step on `h`; returns what it did (for messages), or `None` when it did nothing.
fn random_step(h: &mut Harness) -> Option<String> {
    let rows = h.r.rows();
    let in_round = h.r.compact.round.is_some();
    let in_prefill = h.r.right.is_some();
    let lengths = h.r.lengths();
    let shortest = lengths.iter().copied().min().unwrap_or(0);
    let pick = h.rng.range(0, 15);
    Some(match pick {
        0..=3 if rows > 0 => {
            let tokens = match h.rng.range(0, 4) {
                0 => h.rng.range(60, 300),
                _ => h.rng.range(1, 12),
            };
            h.append(tokens);
            format!("append {tokens}")
        }
        4 if rows > 0 => {
            // A bypass trim anywhere the layout allows (inside a round: its appends only).
            let most = match in_round {
                true => (0..rows).map(|b| h.r.compact.appended_in_round(b)).min().unwrap(),
                false => shortest,
            };
            let n = h.rng.range(0, most);
            h.trim(n, true);
            format!("bypass trim {n}")
        }
        5 if rows > 0 && !in_round => {
            let n = h.rng.range(0, shortest);
            let took = h.trim(n, false);
            format!("trim {n} (taken: {took})")
        }
        6 if rows > 0 && !in_round && !in_prefill => {
            h.begin();
            let tokens = h.rng.range(1, 9);
            h.append(tokens);
            format!("begin, append {tokens}")
        }
        7 if in_round => {
            let keep: Vec<usize> = (0..rows).map(|b| h.rng.range(0, h.r.compact.appended_in_round(b))).collect();
            h.rollback(&keep);
            format!("rollback {keep:?}")
        }
        8 if in_round => {
            h.commit();
            "commit".into()
        }
        9 if rows > 1 && !in_round => {
            let mut keep: Vec<usize> = (0..rows).filter(|_| h.rng.range(0, 2) > 0).collect();
            if keep.is_empty() {
                keep.push(h.rng.range(0, rows - 1));
            }
            if h.rng.range(0, 1) == 0 {
                keep.reverse();
            }
            h.filter(&keep);
            format!("filter {keep:?}")
        }
        10 if rows > 0 && rows < 6 && !in_round => {
            // Rows out (mid-prefill too) and merged back around the cache.
            let (a, b) = (h.rng.range(0, rows - 1), h.rng.range(0, rows - 1));
            let (first, last) = (h.extract(a), h.extract(b));
            let seed = h.rng.next();
            let merged = Harness::merge(&[&first, &*h, &last], seed);
            *h = merged;
            format!("merge [{a}, all, {b}]")
        }
        11 if rows > 0 => match h.r.maintaining {
            true if !in_round && !in_prefill && h.rng.range(0, 1) == 0 => {
                let pick: Vec<usize> = (0..rows).filter(|_| h.rng.range(0, 1) == 0).collect();
                h.commit_rows(&pick);
                format!("prefill_commit {pick:?}")
            }
            true => {
                h.end_maintenance();
                "prefill_end".into()
            }
            false => {
                h.maintain();
                "prefill_begin".into()
            }
        },
        12 if rows > 0 && !in_round && !in_prefill => {
            // A padded prefill on the rows, in chunks, finalized.
            let right: Vec<usize> = (0..rows).map(|_| h.rng.range(0, 20)).collect();
            h.prepare(&right);
            let chunks = h.rng.range(1, 3);
            for _ in 0..chunks {
                let tokens = h.rng.range(1, 40);
                h.append(tokens);
            }
            let most = *right.iter().max().unwrap();
            let total = h.r.lengths().iter().zip(&lengths).map(|(now, was)| now - was).min().unwrap();
            if total < most {
                h.append(most - total);
            }
            h.check("mid-prefill");
            h.finalize();
            format!("padded prefill, right {right:?}")
        }
        13 if h.rng.range(0, 3) == 0 => {
            h.reset();
            let batch = h.rng.range(1, 4);
            let mut pads: Vec<usize> = (0..batch).map(|_| h.rng.range(0, 150)).collect();
            pads[h.rng.range(0, batch - 1)] = 0;
            let tokens = pads.iter().max().unwrap() + h.rng.range(1, 200);
            h.append_padded(&pads, tokens);
            format!("reset, padded append {pads:?} x {tokens}")
        }
        14 if rows > 0 => {
            let tokens = h.rng.range(0, 2000);
            h.cache.reserve(tokens).unwrap();
            format!("reserve {tokens}")
        }
        _ => return None,
    })
}

fn fuzz(seed: u64, g: Geometry, steps: usize) {
    let mut h = Harness::new(g, seed);
    // Row 0 (the longest prompt) unpadded, the others padded at random.
    let mut pads = vec![0; h.rng.range(1, 3)];
    for pad in pads.iter_mut().skip(1) {
        *pad = h.rng.range(0, 100);
    }
    h.append_padded(&pads, 120);
    for i in 0..steps {
        let Some(step) = random_step(&mut h) else { continue };
        if std::env::var_os("HOSTILE_TRACE").is_some() {
            eprintln!("seed {seed} step {i}: {step}; lengths {:?} converted {:?}", h.r.lengths(), h.r.converted);
        }
        h.check(&format!("step {i} ({step}), seed {seed}, {:?} hot {}", g.layout, g.hot_window));
    }
}

fn random_hostile_sequences(layout: LayoutKind) {
    for seed in 0..16u64 {
        let hw = [1, 7, 64, 65, 150, 5000][seed as usize % 6];
        fuzz(seed, geometry(hw, F32, [Q8, Bf16, Fp8], layout), 50);
        fuzz(seed + 500, geometry(hw, Bf16, [Q4, Bf16, Q8], layout), 35);
        fuzz(seed + 900, geometry(hw, F32, [F16, Q4, Bf16], layout), 35);
    }
}

#[test]
fn random_hostile_sequences_ragged() {
    random_hostile_sequences(RAGGED);
}

/// Random sequences in both layouts (set HOSTILE_TRACE to print each step).
#[test]
fn random_hostile_sequences_right_justified() {
    random_hostile_sequences(RJ);
}

/// Inside a padded prefill `max_append_tokens` counts the positions before a boundary moves:
/// positions that are right padding (past the prompt's end, or the row's last right-padding
/// ones) move none.
#[test]
fn max_append_tokens_inside_a_padded_prefill() {
    let g = standard(1, RJ);
    // With the prompts' lengths: once the prompt is in, no append moves the boundary.
    let mut h = Harness::new(g, 22);
    h.cache.prefill_prepare(Some(&[100]), None, None).unwrap();
    h.append(100);
    assert_eq!(h.cache.converted_positions(), vec![64]);
    assert_eq!(h.cache.max_append_tokens(), usize::MAX, "appends past the prompt are padding");
    // With right padding only: the first 50 positions of a 30-position row are padding.
    let mut h = Harness::new(g, 23);
    h.cache.prefill_prepare(None, None, Some(&[50])).unwrap();
    h.append(30);
    // Settled after n more: 30 + n - 50; the boundary (64) moves at a settled length of 65.
    assert_eq!(h.cache.max_append_tokens(), 84);
}

/// `append_latent`'s returned views equal `state` after the append, across hot-side rebuilds
/// (growth, and writes below the hot storage after a bypass trim).
#[test]
fn append_views_equal_the_state_after() {
    each(&[1, 70], |layout, hw| {
        let g = standard(hw, layout);
        let mut h = Harness::new(g, 24);
        h.append_padded(&[0, 90], 300);
        let mut rng = Rng::new(25);
        for (i, tokens) in [1usize, 300, 2, 1, 64, 600].into_iter().enumerate() {
            if i == 3 {
                assert!(h.trim(150, true));
            }
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * widths(&g)[f]));
            let arrays: Vec<Array> = (0..3).map(|f| array(&data[f], &[2, tokens, widths(&g)[f]])).collect();
            let views = h.cache.append_latent(&arrays[0], &arrays[1], Some(&arrays[2])).unwrap();
            h.r.both(|m| m.append(2, tokens, &data));
            h.r.settle();
            let what = format!("{layout:?} hot {hw}: append {tokens}");
            h.check(&what);
            let state = h.cache.state().unwrap();
            for family in Family::ALL {
                let (a, b) = (host(views.get(family).unwrap()), host(state.get(family).unwrap()));
                // Positions outside rows are unspecified: compare each row's valid span.
                let (w, offset) = (widths(&g)[family as usize], h.cache.offset());
                for row in 0..2 {
                    let lo = (row * offset + h.cache.left_pad()[row]) * w;
                    let hi = (row * offset + h.cache.row_ends()[row]) * w;
                    assert_bits(&bits(&a[lo..hi]), &bits(&b[lo..hi]), &format!("{what}: {} row {row}", family.name()));
                }
            }
        }
    });
}

/// Saves and loads of composed caches in states that stress the hot side (boundaries cut by a
/// bypass trim, ragged rows ending apart, after an uneven rollback): the loaded cache reads the
/// same and goes on as the saved one.
#[test]
fn saved_and_loaded_composed_caches_go_on_alike() {
    each(&[1, 60], |layout, hw| {
        let g = standard(hw, layout);
        let mut parts = Vec::new();
        for (i, len) in [500usize, 3, 200].into_iter().enumerate() {
            let mut h = Harness::new(g, 30 + i as u64);
            h.append(len);
            parts.push(h);
        }
        let mut h = Harness::merge(&parts.iter().collect::<Vec<_>>(), 33);
        let reload = |h: &mut Harness, what: &str| {
            let bytes = latent_cache::core::persist::save_to_bytes(&[&h.cache]).unwrap();
            h.cache = latent_cache::core::persist::load_from_bytes(&bytes).unwrap().remove(0);
            h.check(&format!("{layout:?} hot {hw}: loaded {what}"));
            h.append(65);
            h.check(&format!("{layout:?} hot {hw}: appended after loading {what}"));
        };
        reload(&mut h, "merged rows");
        // Row 1 (68 positions) loses its hot ones; the others keep some.
        assert!(h.trim(40, true));
        reload(&mut h, "after a bypass trim");
        h.begin();
        h.append(5);
        h.rollback(&[5, 0, 3]);
        reload(&mut h, "after an uneven rollback");
    });
}

/// Right-justified rows that shift left in place (an uneven rollback or finalize, where a
/// padded row drops less than the longest) keep their hot values.
#[test]
fn right_justified_rows_shifting_left_keep_their_hot_values() {
    let g = standard(64, RJ);
    // A rollback: row 1 (padded, all hot) keeps one more position than row 0.
    let mut h = Harness::new(g, 34);
    h.append_padded(&[0, 50], 100);
    h.begin();
    h.append(3);
    h.rollback(&[0, 1]);
    h.check("uneven rollback");
    // A finalize: row 1 drops less right padding than row 0.
    let mut h = Harness::new(g, 35);
    h.append_padded(&[0, 68], 127);
    h.prepare(&[16, 8]);
    h.append(94);
    h.check("mid-prefill");
    h.finalize();
    h.check("finalized");
}
