//! Segments: a 20-turn conversation saved turn by turn in every storage mode and both layouts,
//! each segment's size its turn's positions plus a bounded header; every turn restored from its
//! chain equal to the reference model (host reads bit for bit, stored parts byte for byte) and
//! appended to afterwards; extensions; a named row of a padded batch; and every refusal (gaps,
//! overlaps, reordering, broken links, damaged bytes, another geometry, another key) leaving
//! everything as it was.
use std::path::{Path, PathBuf};

use crate::common::core_check::{assert_matches, model_of, widths};
use crate::common::mlx_helpers::geometry_in;
use crate::common::model::{Model, Rng};

use latent_cache::core::mlx::{eval::eval, ops};
use latent_cache::core::persist::segment::{
    extend_segments, load_segments, read_segment_header, save_segment, save_segment_to_bytes, SegmentRange, SegmentSource,
};
use latent_cache::core::persist::tensor_bytes::for_each_run;
use latent_cache::{ErrorKind, Family, Geometry, LatentCache, LayoutKind, Role, StorageMode};

/// A segment's header is at most this many bytes beyond its positions (3 layers' metadata).
const HEADER_BOUND: usize = 8 << 10;

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("latent-cache-segments-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A model's layers: a DSA target layer, a target layer without index keys, the MTP layer;
/// every family in `mode` (the rope in bfloat16 under FP8, whose blocks are 128 wide).
fn geometries(mode: StorageMode, layout: LayoutKind) -> Vec<Geometry> {
    let rope = if mode == StorageMode::Fp8 { StorageMode::Bf16 } else { mode };
    let mtp = Geometry { role: Role::Mtp, ..geometry_in([128, 64, 0], [mode, rope, mode], layout) };
    vec![geometry_in([128, 64, 128], [mode, rope, mode], layout), geometry_in([128, 64, 0], [mode, rope, mode], layout), mtp]
}

struct Set {
    layers: Vec<LatentCache>,
    models: Vec<Model>,
}

impl Set {
    fn new(gs: &[Geometry]) -> Set {
        Set { layers: gs.iter().map(|g| LatentCache::new(*g).unwrap()).collect(), models: gs.iter().map(model_of).collect() }
    }

    fn refs(&mut self) -> Vec<&mut LatentCache> {
        self.layers.iter_mut().collect()
    }

    /// Appends `tokens` random positions to every row of every layer and model.
    fn append(&mut self, rng: &mut Rng, batch: usize, tokens: usize) {
        for (layer, model) in self.layers.iter_mut().zip(&mut self.models) {
            let w = widths(layer.geometry());
            let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * w[f]));
            let keys = (w[2] > 0).then_some(data[2].as_slice());
            layer.append_host(batch, tokens, &data[0], &data[1], keys).unwrap();
            model.append(batch, tokens, &data);
        }
    }

    fn bytes_per_position(&self) -> usize {
        self.layers.iter().map(LatentCache::bytes_per_token).sum()
    }
}

fn assert_set(layers: &[LatentCache], models: &[Model], what: &str) {
    assert_eq!(layers.len(), models.len(), "{what}: layers");
    for (i, (layer, model)) in layers.iter().zip(models).enumerate() {
        assert_matches(layer, model, &format!("{what}, layer {i}"));
    }
}

/// An array's bytes as stored.
pub(crate) fn bytes(a: &mlx_rs::Array) -> Vec<u8> {
    let a = ops::contiguous(a).unwrap();
    eval([&a]).unwrap();
    let mut out = Vec::new();
    for_each_run(&a, |run| {
        out.extend_from_slice(run);
        Ok(())
    })
    .unwrap();
    out
}

/// Every stored part of `restored` (one row) is byte for byte row `row`'s first positions of
/// `saved`'s.
fn assert_same_parts(restored: &[LatentCache], saved: &[LatentCache], row: usize, what: &str) {
    for (i, (r, s)) in restored.iter().zip(saved).enumerate() {
        let n = r.row_offsets()[0];
        for family in Family::ALL.into_iter().filter(|&f| r.geometry().width(f).is_some()) {
            let got = r.stored_row_parts(family, 0, 0, n).unwrap();
            let want = s.stored_row_parts(family, row, 0, n).unwrap();
            for (k, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.dtype(), w.dtype(), "{what}: layer {i} {} part {k} dtype", family.name());
                assert!(bytes(g) == bytes(w), "{what}: layer {i} {} part {k} differs", family.name());
            }
        }
    }
}

fn sources(paths: &[PathBuf]) -> Vec<SegmentSource<'_>> {
    paths.iter().map(|p| SegmentSource::Path(p)).collect()
}

fn range(from: usize, to: usize, key: &[u8]) -> SegmentRange<'_> {
    SegmentRange { row: 0, from, to, key }
}

fn save(set: &mut Set, from: usize, to: usize, key: &[u8], path: &Path) {
    save_segment(&mut set.refs(), range(from, to, key), path).unwrap();
}

#[test]
fn a_conversation_saved_turn_by_turn_restores_any_turn_bit_for_bit() {
    let dir = scratch("turns");
    let mut rng = Rng::new(20);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for mode in StorageMode::ALL {
            let gs = geometries(mode, layout);
            let mut set = Set::new(&gs);
            let (mut paths, mut models, mut ends) = (Vec::new(), Vec::new(), Vec::new());
            let mut headers = Vec::new();
            for turn in 0..20 {
                let from = ends.last().copied().unwrap_or(0);
                let tokens = rng.range(1, 40);
                set.append(&mut rng, 1, tokens);
                let path = dir.join(format!("{layout:?}-{}-{turn}.seg", mode.name()));
                let key = format!("turn {turn}");
                save(&mut set, from, from + tokens, key.as_bytes(), &path);
                // Its turn's positions, and a header that does not grow with the history.
                let size = std::fs::metadata(&path).unwrap().len() as usize;
                let payload = tokens * set.bytes_per_position();
                assert!(size >= payload && size - payload <= HEADER_BOUND, "{mode:?} turn {turn}: {size} bytes for {payload}");
                headers.push(size - payload);
                let h = read_segment_header(SegmentSource::Path(&path)).unwrap();
                assert_eq!((h.from, h.to, h.key.as_slice()), (from, from + tokens, key.as_bytes()), "{mode:?} turn {turn}");
                paths.push(path);
                models.push(set.models.clone());
                ends.push(from + tokens);
            }
            // Headers differ only by the digits of ranges, shapes and offsets (and their padding
            // to 8), not by the history before them.
            let spread = headers.iter().max().unwrap() - headers.iter().min().unwrap();
            assert!(spread <= 256, "{mode:?}: headers vary by {spread} bytes over the conversation");
            for k in 0..20 {
                let what = format!("{layout:?} {} turn {k}", mode.name());
                let mut restored = load_segments(&sources(&paths[..=k])).unwrap();
                assert_set(&restored, &models[k], &what);
                assert_same_parts(&restored, &set.layers, 0, &what);
                assert_eq!(restored[0].chain().map(|m| m.positions), Some(ends[k]), "{what}: chain mark");
                // The restored cache goes on as the saved one did.
                let mut next = Set { layers: std::mem::take(&mut restored), models: models[k].clone() };
                let more = rng.range(1, 9);
                next.append(&mut rng, 1, more);
                assert_set(&next.layers, &next.models, &format!("{what}, appended to"));
            }
            // Extensions: the whole chain onto a restored start, and a continuation alone.
            for (start, given) in [(9, 0), (9, 10), (0, 0)] {
                let what = format!("{layout:?} {} extend from turn {start} with {given}..", mode.name());
                let mut layers = load_segments(&sources(&paths[..=start])).unwrap();
                let appended = extend_segments(&mut layers.iter_mut().collect::<Vec<_>>(), &sources(&paths[given..])).unwrap();
                assert_eq!(appended, 19 - start, "{what}");
                assert_set(&layers, &models[19], &what);
                assert_same_parts(&layers, &set.layers, 0, &what);
            }
            // An empty set extends from the chain's start.
            let mut empty = Set::new(&gs);
            extend_segments(&mut empty.refs(), &sources(&paths)).unwrap();
            assert_set(&empty.layers, &models[19], "an empty set extended");
        }
    }
}

#[test]
fn a_named_row_of_a_padded_batch_is_saved_to_files_and_bytes_alike() {
    let dir = scratch("rows");
    let mut rng = Rng::new(7);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        for mode in [StorageMode::Bf16, StorageMode::Q4, StorageMode::Fp8] {
            let gs = geometries(mode, layout);
            let mut set = Set::new(&gs);
            let pads = [2, 0, 5];
            for (layer, model) in set.layers.iter_mut().zip(&mut set.models) {
                let w = widths(layer.geometry());
                let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(3 * 12 * w[f]));
                let keys = (w[2] > 0).then_some(data[2].as_slice());
                layer.append_host_padded(3, 12, &pads, &data[0], &data[1], keys).unwrap();
                model.append_padded(3, 12, &pads, &data);
            }
            set.append(&mut rng, 3, 4);
            let row = 2; // 11 positions after 5 of padding
            let a = dir.join(format!("{layout:?}-{}-a.seg", mode.name()));
            let b = dir.join(format!("{layout:?}-{}-b.seg", mode.name()));
            let saved = save_segment(&mut set.refs(), SegmentRange { row, from: 0, to: 6, key: b"row" }, &a).unwrap();
            let (bytes0, again) =
                save_segment_to_bytes(&mut set.refs(), SegmentRange { row, from: 0, to: 6, key: b"row" }).unwrap();
            assert!(std::fs::read(&a).unwrap() == bytes0, "{mode:?}: the file and the bytes differ");
            assert_eq!(saved, again);
            let (bytes1, _) = save_segment_to_bytes(&mut set.refs(), SegmentRange { row, from: 6, to: 11, key: b"" }).unwrap();
            std::fs::write(&b, &bytes1).unwrap();
            let want: Vec<Model> = set.models.iter().map(|m| m.extract(row)).collect();
            let from_files = load_segments(&sources(&[a.clone(), b.clone()])).unwrap();
            assert_set(&from_files, &want, &format!("{layout:?} {mode:?} row {row} from files"));
            assert_same_parts(&from_files, &set.layers, row, &format!("{layout:?} {mode:?} row {row}"));
            let from_bytes = load_segments(&[SegmentSource::Bytes(&bytes0), SegmentSource::Bytes(&bytes1)]).unwrap();
            assert_set(&from_bytes, &want, &format!("{layout:?} {mode:?} row {row} from bytes"));
            let h = read_segment_header(SegmentSource::Bytes(&bytes1)).unwrap();
            assert_eq!((h.from, h.to, h.previous, h.key.len()), (6, 11, saved.digest, 0));
        }
    }
}

/// What a layer is (rows, every family's values, the chain it knows), to compare before and
/// after a refused call.
type Snapshot = (Vec<usize>, Vec<Vec<f32>>, Option<latent_cache::core::cache::ChainMark>);

fn snapshot(layers: &[LatentCache]) -> Vec<Snapshot> {
    layers
        .iter()
        .map(|l| {
            let reads =
                Family::ALL.into_iter().filter(|&f| l.geometry().width(f).is_some()).map(|f| l.read(f).unwrap()).collect();
            (l.row_offsets(), reads, l.chain())
        })
        .collect()
}

fn refused(result: latent_cache::core::Result<impl Sized>, kind: ErrorKind, what: &str) {
    match result {
        Ok(_) => panic!("{what}: accepted"),
        Err(e) => assert_eq!(e.kind, kind, "{what}: {}", e.message),
    }
}

#[test]
fn broken_chains_are_refused_and_change_nothing() {
    let dir = scratch("refusals");
    let mut rng = Rng::new(3);
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let gs = geometries(StorageMode::Q8, layout);
        let mut set = Set::new(&gs);
        let p = |name: &str| dir.join(format!("{layout:?}-{name}.seg"));
        let mut chain = Vec::new();
        for (k, n) in [5, 7, 4, 6].into_iter().enumerate() {
            let from = set.layers[0].row_offsets().first().copied().unwrap_or(0);
            set.append(&mut rng, 1, n);
            save(&mut set, from, from + n, b"a", &p(&format!("a{k}")));
            chain.push(p(&format!("a{k}")));
        }
        // Another split of the same positions: [0, 8), [8, 22).
        save(&mut set, 0, 8, b"b", &p("b0"));
        save(&mut set, 8, 22, b"b", &p("b1"));
        // Another state of the same split: [0, 5), [5, 12) of other values.
        let mut other = Set::new(&gs);
        other.append(&mut rng, 1, 12);
        save(&mut other, 0, 5, b"a", &p("c0"));
        save(&mut other, 5, 12, b"a", &p("c1"));
        // The same positions as a1 under another key, after the same a0 (saved again from a set
        // restored from a0 and a1: the same bytes, so the same digest): a2 does not follow it.
        let mut keyed = Set { layers: load_segments(&sources(&chain[..2])).unwrap(), models: Vec::new() };
        save(&mut keyed, 0, 5, b"a", &p("k0"));
        assert!(std::fs::read(p("k0")).unwrap() == std::fs::read(&chain[0]).unwrap(), "a segment saved again differs");
        save(&mut keyed, 5, 12, b"another key", &p("k1"));
        let a1 = std::fs::read(&chain[1]).unwrap();
        // A damaged copy of a1: one byte of its positions changed, and one of its header.
        let mut flipped = a1.clone();
        let last = flipped.len() - 3;
        flipped[last] ^= 0x10;
        std::fs::write(p("data"), &flipped).unwrap();
        let mut flipped = a1.clone();
        let field = b"segment.to\":\"";
        let at = a1.windows(field.len()).position(|w| w == field).unwrap() + field.len();
        flipped[at] ^= 0x01;
        std::fs::write(p("head"), &flipped).unwrap();
        // A segment of another geometry at the same place.
        let mut bf16 = Set::new(&geometries(StorageMode::Bf16, layout));
        bf16.append(&mut rng, 1, 12);
        save(&mut bf16, 0, 5, b"a", &p("g0"));
        save(&mut bf16, 5, 12, b"a", &p("g1"));

        let cases: Vec<(&str, Vec<PathBuf>)> = vec![
            ("a gap", vec![chain[0].clone(), chain[2].clone()]),
            ("an overlap", vec![p("b0"), chain[1].clone()]),
            ("a reordered chain", vec![chain[1].clone(), chain[0].clone()]),
            ("a reordered tail", vec![chain[0].clone(), chain[2].clone(), chain[1].clone()]),
            ("a broken link", vec![chain[0].clone(), p("c1")]),
            ("another key before", vec![chain[0].clone(), p("k1"), chain[2].clone()]),
            ("a changed byte of positions", vec![chain[0].clone(), p("data")]),
            ("a changed byte of the header", vec![chain[0].clone(), p("head")]),
            ("another geometry", vec![chain[0].clone(), p("g1")]),
            ("a first segment of another geometry", vec![p("g0"), chain[1].clone()]),
        ];
        let whole = load_segments(&sources(&chain[..1])).unwrap();
        let mut holder = Set { layers: whole, models: Vec::new() };
        let before = snapshot(&holder.layers);
        for (what, list) in &cases {
            refused(load_segments(&sources(list)), ErrorKind::InvalidArgument, &format!("{layout:?} load: {what}"));
            refused(extend_segments(&mut holder.refs(), &sources(list)), ErrorKind::InvalidArgument, &format!("extend: {what}"));
            assert!(snapshot(&holder.layers) == before, "{layout:?} {what}: the set changed");
        }
        // Truncated anywhere, or not a segment at all: refused, never a crash. A whole-set file
        // is not a segment, and a segment is not a whole-set file.
        for cut in [0, 7, 8, 9, 64, a1.len() / 2, a1.len() - 1] {
            std::fs::write(p("cut"), &a1[..cut]).unwrap();
            let list = [chain[0].clone(), p("cut")];
            refused(load_segments(&sources(&list)), ErrorKind::InvalidArgument, &format!("cut at {cut}"));
            refused(
                extend_segments(&mut holder.refs(), &sources(&list)),
                ErrorKind::InvalidArgument,
                &format!("extend, cut at {cut}"),
            );
        }
        latent_cache::core::persist::save(&set.layers.iter().collect::<Vec<_>>(), &p("whole")).unwrap();
        refused(read_segment_header(SegmentSource::Path(&p("whole"))), ErrorKind::InvalidArgument, "a whole-set file");
        refused(load_segments(&sources(&[p("whole")])), ErrorKind::InvalidArgument, "a whole-set file as a chain");
        refused(latent_cache::core::persist::load(&chain[0]), ErrorKind::InvalidArgument, "a segment as a whole set");
        assert!(snapshot(&holder.layers) == before, "{layout:?} damaged files: the set changed");
        // A chain that does not hold the set's (another split of the same positions).
        refused(extend_segments(&mut holder.refs(), &sources(&[p("b0"), p("b1")])), ErrorKind::InvalidArgument, "another chain");
        assert!(snapshot(&holder.layers) == before, "{layout:?} another chain: the set changed");
        // A set with positions its chain does not hold, or several rows, extends nothing.
        let mut longer = Set { layers: load_segments(&sources(&chain[..1])).unwrap(), models: Vec::new() };
        for l in &mut longer.layers {
            l.append_host(1, 1, &vec![0.5; 128], &[0.5; 64], (l.geometry().index_head_dim > 0).then_some(&[0.5; 128][..]))
                .unwrap();
        }
        let unsaved = snapshot(&longer.layers);
        refused(extend_segments(&mut longer.refs(), &sources(&chain)), ErrorKind::State, "positions not saved");
        assert!(snapshot(&longer.layers) == unsaved, "{layout:?} positions not saved: the set changed");
        let mut two = Set::new(&gs);
        two.append(&mut rng, 2, 5);
        refused(extend_segments(&mut two.refs(), &sources(&chain)), ErrorKind::State, "two rows");
        // A filter may reorder rows: the chain a row was saved in is forgotten.
        save_segment(&mut two.refs(), SegmentRange { row: 1, from: 0, to: 5, key: b"" }, &p("row1")).unwrap();
        for l in &mut two.layers {
            l.filter_rows(&[1, 0]).unwrap();
        }
        two.append(&mut rng, 2, 2);
        let after = SegmentRange { row: 1, from: 5, to: 7, key: b"" };
        refused(save_segment(&mut two.refs(), after, &p("never")), ErrorKind::State, "a chain after a filter");
        // The same chain whole still loads, and extends the holder.
        assert_set(&load_segments(&sources(&chain)).unwrap(), &set.models, "the whole chain");
        assert_eq!(extend_segments(&mut holder.refs(), &sources(&chain)).unwrap(), 3);
        assert_set(&holder.layers, &set.models, "the holder extended");

        // Saves the set cannot link are refused, nothing written.
        let target = p("never");
        refused(save_segment(&mut set.refs(), range(3, 9, b""), &target), ErrorKind::State, "a save off the chain");
        refused(save_segment(&mut set.refs(), range(22, 40, b""), &target), ErrorKind::OutOfRange, "a save past the row");
        refused(
            save_segment(&mut set.refs(), SegmentRange { row: 1, from: 0, to: 2, key: b"" }, &target),
            ErrorKind::OutOfRange,
            "row 1",
        );
        refused(save_segment(&mut set.refs(), range(0, 4, &[0; 4097]), &target), ErrorKind::InvalidArgument, "a long key");
        assert!(!target.exists());
        // A round rolled back above the chain's end keeps it; a trim below it forgets it, even
        // once the row is longer again.
        for (l, m) in set.layers.iter_mut().zip(&mut set.models) {
            l.spec_round_begin().unwrap();
            m.begin();
        }
        set.append(&mut rng, 1, 3);
        for (l, m) in set.layers.iter_mut().zip(&mut set.models) {
            l.spec_round_rollback(&[1]).unwrap();
            m.rollback(&[1]);
        }
        save(&mut set, 22, 23, b"", &p("b2"));
        set.append(&mut rng, 1, 2);
        for (l, m) in set.layers.iter_mut().zip(&mut set.models) {
            l.trim(3, false).unwrap();
            m.trim(3);
        }
        set.append(&mut rng, 1, 4);
        refused(save_segment(&mut set.refs(), range(23, 26, b""), &target), ErrorKind::State, "a trimmed chain");
        refused(save_segment(&mut set.refs(), range(26, 26, b""), &target), ErrorKind::OutOfRange, "an empty range");
        save(&mut set, 0, 26, b"", &p("fresh"));
        assert_set(&load_segments(&sources(&[p("fresh")])).unwrap(), &set.models, "a fresh chain after a trim");
        // A composed layer saves its hot side as it stands: only a row's newest positions.
        let composed = Geometry { hot_window: 64, hot_storage: StorageMode::Bf16, ..gs[0] };
        let mut c = Set::new(&[composed]);
        c.append(&mut rng, 1, 3);
        refused(save_segment(&mut c.refs(), range(0, 2, b""), &target), ErrorKind::InvalidArgument, "composed, not the newest");
        assert!(!target.exists());
    }
}
