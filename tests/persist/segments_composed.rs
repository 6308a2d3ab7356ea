//! Segments of composed storage: a 20-turn conversation on a composed DSA layer beside a layer
//! that is not composed, both layouts and several compositions, a segment after each turn. Each
//! segment holds its turn's positions plus the hot row as it stands (bounded by about twice the
//! hot window, whatever the history) and a bounded header; every turn restored from its chain
//! reads, boundaries included, what the independent reference says (`composed_ref`), holds the
//! saved compact parts byte for byte, and then goes on as the saved cache did; extensions take
//! the last segment's hot side.
use std::path::PathBuf;

use crate::common::composed_ref::Reference;
use crate::common::composed_rule::{composed_layer, BLOCK};
use crate::common::core_check::assert_matches;
use crate::common::model::Rng;
use crate::segments::bytes;

use latent_cache::core::persist::segment::{extend_segments, load_segments, save_segment, SegmentRange, SegmentSource};
use latent_cache::{Family, LatentCache, LayoutKind, StorageMode};

fn append(rng: &mut Rng, layers: &mut [LatentCache], refs: &mut [Reference], tokens: usize) {
    for (cache, r) in layers.iter_mut().zip(refs.iter_mut()) {
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(tokens * r.compact.widths[f]));
        cache.append_host(1, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
        r.both(|m| m.append(1, tokens, &data));
        r.settle();
    }
}

/// A composed layer against its reference (boundaries included), one that is not composed
/// against its plain model.
fn check_layer(cache: &LatentCache, r: &Reference, what: &str) {
    match r.g.composed() {
        true => r.check(cache, what),
        false => assert_matches(cache, &r.compact, what),
    }
}

fn check(layers: &[LatentCache], refs: &[Reference], saved: &[LatentCache], what: &str) {
    for (i, (cache, r)) in layers.iter().zip(refs).enumerate() {
        check_layer(cache, r, &format!("{what}, layer {i}"));
        let n = cache.row_offsets()[0];
        for family in Family::ALL {
            let (got, want) =
                (cache.stored_row_parts(family, 0, 0, n).unwrap(), saved[i].stored_row_parts(family, 0, 0, n).unwrap());
            for (g, w) in got.iter().zip(&want) {
                assert!(bytes(g) == bytes(w), "{what}: layer {i} {} stored parts differ", family.name());
            }
        }
    }
}

#[test]
fn composed_conversations_restore_their_hot_side() {
    use StorageMode::*;
    let dir = std::env::temp_dir().join(format!("latent-cache-segments-composed-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut rng = Rng::new(64);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for (window, hot, modes) in [(64, Bf16, [Q8, Bf16, Q4]), (100, F32, [Fp8, Q8, Bf16]), (32, F16, [Q4, Q4, Fp8])] {
            let gs = [composed_layer(128, window, hot, modes, layout), composed_layer(128, 0, F32, [Bf16, Bf16, Q8], layout)];
            let mut layers: Vec<LatentCache> = gs.iter().map(|g| LatentCache::new(*g).unwrap()).collect();
            let mut refs: Vec<Reference> = gs.iter().map(|g| Reference::new(*g)).collect();
            let per_position: usize = layers.iter().map(LatentCache::bytes_per_token).sum();
            // The hot row's bound: about twice a window and a block, plus the last append.
            let hot_bound = (2 * (window + BLOCK) + 40) * (128 + 64 + 128) * 4;
            let (mut paths, mut states): (Vec<PathBuf>, Vec<Vec<Reference>>) = (Vec::new(), Vec::new());
            let mut at = 0;
            for turn in 0..20 {
                let tokens = rng.range(1, 40);
                append(&mut rng, &mut layers, &mut refs, tokens);
                let path = dir.join(format!("{layout:?}-{window}-{turn}.seg"));
                let mut all: Vec<&mut LatentCache> = layers.iter_mut().collect();
                save_segment(&mut all, SegmentRange { row: 0, from: at, to: at + tokens, key: b"k" }, &path).unwrap();
                let size = std::fs::metadata(&path).unwrap().len() as usize;
                let payload = tokens * per_position;
                assert!(size >= payload && size - payload <= hot_bound + (8 << 10), "turn {turn}: {size} bytes for {payload}");
                paths.push(path);
                states.push(refs.clone());
                at += tokens;
            }
            let sources = |k: usize| -> Vec<SegmentSource<'_>> { paths[..=k].iter().map(|p| SegmentSource::Path(p)).collect() };
            for (k, state) in states.iter().enumerate() {
                let what = format!("{layout:?} window {window} turn {k}");
                let mut restored = load_segments(&sources(k)).unwrap();
                check(&restored, state, &layers, &what);
                // It goes on as the saved cache did: boundaries move, the hot side follows.
                let mut r = state.clone();
                for more in [BLOCK, 3] {
                    append(&mut rng, &mut restored, &mut r, more);
                    for (i, (cache, r)) in restored.iter().zip(&r).enumerate() {
                        check_layer(cache, r, &format!("{what}, layer {i}, {more} more"));
                    }
                }
            }
            let mut start = load_segments(&sources(6)).unwrap();
            let all: Vec<SegmentSource<'_>> = paths.iter().map(|p| SegmentSource::Path(p)).collect();
            assert_eq!(extend_segments(&mut start.iter_mut().collect::<Vec<_>>(), &all).unwrap(), 13);
            check(&start, &states[19], &layers, &format!("{layout:?} window {window}: extended"));
        }
    }
}
