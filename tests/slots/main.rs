//! Hostile tests of slots (continuous batching): rows joining a running batch (`merge_rows` into
//! a cache holding rows), rows leaving it (`filter_rows` in place, moving `first` and `start`),
//! `reserve_rows`, and everything else done to a cache whose rows sit in later slots or past
//! its buffers' first position (appends, growth, trims, rounds with uneven rollbacks, padded
//! prefills, reserves, saves, segments, shared prefixes, composed storage, attention, the set
//! and the C ABI). Every result is checked against the independent reference model
//! (`tests/common/model.rs`), and every refused call must change nothing. Its own binary,
//! one file per concern.
#[path = "../common/mod.rs"]
mod common;

mod random;
mod refused;
mod prefix;
mod composed;
mod segments;
mod corners;
mod later_slots;
mod churn;

use common::composed_ref::Reference;
use common::composed_rule::composed_layer;
use common::core_check::{assert_matches, model_of};
use common::mlx_helpers::{geometry, geometry_in};
use common::model::{Model, Prefill, Rng};
use latent_cache::core::cache::set::{change_all, merge_all};
use latent_cache::core::persist::segment::{load_segments, save_segment_to_bytes, SegmentRange, SegmentSource};
use latent_cache::core::persist::{load_from_bytes, save_to_bytes};
use latent_cache::{ErrorKind, Family, Geometry, LatentCache, LayoutKind, StorageMode};

const LAYOUTS: [LayoutKind; 2] = [LayoutKind::RightJustified, LayoutKind::Ragged];

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

fn data(rng: &mut Rng, widths: [usize; 3], batch: usize, tokens: usize) -> [Vec<f32>; 3] {
    std::array::from_fn(|f| rng.floats(batch * tokens * widths[f]))
}

/// Appends `tokens` positions to every row of `cache` (or `batch` rows of an empty one).
fn append(rng: &mut Rng, cache: &mut LatentCache, model: &mut Model, batch: usize, tokens: usize) {
    let d = data(rng, model.widths, batch, tokens);
    let keys = (model.widths[2] > 0).then_some(d[2].as_slice());
    cache.append_host(batch, tokens, &d[0], &d[1], keys).unwrap();
    model.append(batch, tokens, &d);
}

/// A padded first append of an empty cache.
fn append_padded(rng: &mut Rng, cache: &mut LatentCache, model: &mut Model, pads: &[usize], tokens: usize) {
    let batch = pads.len();
    let d = data(rng, model.widths, batch, tokens);
    let keys = (model.widths[2] > 0).then_some(d[2].as_slice());
    cache.append_host_padded(batch, tokens, pads, &d[0], &d[1], keys).unwrap();
    model.append_padded(batch, tokens, pads, &d);
}

/// A request of `rows` rows: an empty cache for 0, else rows of up to `longest` positions
/// (a padded first append when there are several and `padded`).
fn request(g: Geometry, rng: &mut Rng, rows: usize, longest: usize, padded: bool) -> (LatentCache, Model) {
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = model_of(&g);
    if rows == 0 {
        return (cache, model);
    }
    let tokens = rng.range(1, longest.max(1));
    if padded && rows > 1 {
        let mut pads: Vec<usize> = (0..rows).map(|_| rng.range(0, tokens - 1)).collect();
        pads[rng.range(0, rows - 1)] = 0;
        append_padded(rng, &mut cache, &mut model, &pads, tokens);
    } else {
        append(rng, &mut cache, &mut model, rows, tokens);
    }
    (cache, model)
}

/// Everything a refused call must leave as it was.
#[derive(Debug, PartialEq)]
struct Snapshot {
    batch: usize,
    offset: usize,
    row_offsets: Vec<usize>,
    left_pad: Vec<usize>,
    row_ends: Vec<usize>,
    bytes_in_use: usize,
    byte_length: usize,
    in_round: bool,
    in_prefill: bool,
    max_append_tokens: usize,
    converted: Vec<usize>,
    values: Vec<Vec<u32>>,
}

fn snapshot(cache: &LatentCache) -> Snapshot {
    let mut values = Vec::new();
    for family in Family::ALL {
        if family == Family::IndexKeys && cache.geometry().index_head_dim == 0 {
            continue;
        }
        for row in 0..cache.batch_size() {
            values.push(cache.read_row(family, row).unwrap().iter().map(|v| v.to_bits()).collect());
        }
    }
    Snapshot {
        batch: cache.batch_size(),
        offset: cache.offset(),
        row_offsets: cache.row_offsets(),
        left_pad: cache.left_pad().to_vec(),
        row_ends: cache.row_ends(),
        bytes_in_use: cache.bytes_in_use(),
        byte_length: cache.byte_length(),
        in_round: cache.in_spec_round(),
        in_prefill: cache.in_prefill(),
        max_append_tokens: cache.max_append_tokens(),
        converted: cache.converted_positions(),
        values,
    }
}

/// `result` must be refused with `kind`, and `cache` equal `before`.
fn assert_refused<T: std::fmt::Debug>(
    result: latent_cache::core::error::Result<T>,
    kind: ErrorKind,
    cache: &LatentCache,
    before: &Snapshot,
    what: &str,
) {
    let err = result.expect_err(&format!("{what} should be refused"));
    assert_eq!(err.kind, kind, "{what}: {}", err.message);
    assert_eq!(&snapshot(cache), before, "{what} changed the cache ({})", err.message);
}

/// The filters a running batch sees: from the front, the back, a middle row with the order
/// kept, reversed, two rows swapped, one row, the last row taking a leaver's place, a random
/// subset in random order, and every row in order.
fn filter_shape(rng: &mut Rng, n: usize) -> (Vec<usize>, &'static str) {
    if n == 1 {
        return (vec![0], "identity");
    }
    match rng.range(0, 8) {
        0 => ((rng.range(1, n - 1)..n).collect(), "front"),
        1 => ((0..rng.range(1, n - 1)).collect(), "back"),
        2 => {
            let gone = rng.range(0, n - 1);
            ((0..n).filter(|&b| b != gone).collect(), "middle, order kept")
        }
        3 => ((0..n).rev().collect(), "reversed"),
        4 => {
            let (i, j) = (rng.range(0, n - 1), rng.range(0, n - 1));
            let mut keep: Vec<usize> = (0..n).collect();
            keep.swap(i, j);
            (keep, "swap")
        }
        5 => (vec![rng.range(0, n - 1)], "single"),
        6 => {
            let gone = rng.range(0, n - 1);
            let mut keep: Vec<usize> = (0..n).collect();
            keep[gone] = n - 1;
            keep.truncate(n - 1);
            if gone == n - 1 {
                keep = (0..n - 1).collect();
            }
            (keep, "last takes the leaver's slot")
        }
        7 => {
            let mut keep: Vec<usize> = (0..n).filter(|_| rng.range(0, 2) > 0).collect();
            if keep.is_empty() {
                keep.push(rng.range(0, n - 1));
            }
            for i in (1..keep.len()).rev() {
                keep.swap(i, rng.range(0, i));
            }
            (keep, "random")
        }
        _ => ((0..n).collect(), "identity"),
    }
}

/// A running batch whose rows left from the front (`first > 0`) and dropped padding
/// (`start > 0`), with a free slot.
fn moved_batch(g: Geometry, rng: &mut Rng) -> (LatentCache, Model) {
    let (mut cache, mut model) = batch_of(g, rng, &[40, 5, 12, 9], 5);
    // The longest (row 0) leaves from the front: first moves on, start drops its padding.
    cache.filter_rows(&[1, 2, 3]).unwrap();
    model.filter(&[1, 2, 3]);
    append(rng, &mut cache, &mut model, 3, 2);
    assert_matches(&cache, &model, "moved batch");
    (cache, model)
}

/// One-row requests of the given lengths, merged in order into a batch of `slots` reserved
/// slots (0: as many as rows), with its model.
fn batch_of(g: Geometry, rng: &mut Rng, lengths: &[usize], slots: usize) -> (LatentCache, Model) {
    let reqs: Vec<(LatentCache, Model)> = lengths
        .iter()
        .map(|&n| {
            let mut c = LatentCache::new(g).unwrap();
            let mut m = model_of(&g);
            append(rng, &mut c, &mut m, 1, n);
            (c, m)
        })
        .collect();
    let mut cache = LatentCache::new(g).unwrap();
    cache.reserve_rows(slots).unwrap();
    cache.merge_rows(&reqs.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
    (cache, Model::merge(&reqs.iter().map(|r| &r.1).collect::<Vec<_>>()))
}
