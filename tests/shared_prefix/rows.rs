//! Row operations, saves and refusals on caches over a shared prefix, against the rows as plain
//! vectors: writes never reach a shared position, and anything that would is refused with the
//! cache unchanged.
use crate::common::model::Rng;
use crate::{assert_rows, geometry, prompt, Rows, PREFIX};
use latent_cache::core::persist;
use latent_cache::core::persist::segment::{extend_segments, load_segments, save_segment_to_bytes, SegmentRange, SegmentSource};
use latent_cache::{ErrorKind, Geometry, LatentCache, LayoutKind, StorageMode};

fn attached(layout: LayoutKind, rng: &mut Rng, rows: usize, own: usize) -> (LatentCache, Rows, LatentCache) {
    let (source, first) = prompt(layout, rng);
    let prefix = source.share_prefix(0, PREFIX).unwrap();
    let mut cache = LatentCache::new(*source.geometry()).unwrap();
    cache.attach_prefix(&prefix, rows).unwrap();
    let mut model = Rows(vec![first.0[0].clone(); rows]);
    if own > 0 {
        model.append(&mut cache, rng, own);
    }
    (cache, model, source)
}

#[test]
fn writes_stay_above_the_prefix_and_refusals_change_nothing() {
    for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
        let mut rng = Rng::new(21);
        let (mut cache, mut rows, _) = attached(layout, &mut rng, 2, 4);
        assert_rows(&cache, &rows, "attached");
        let err = cache.trim(5, false).unwrap_err();
        assert_eq!(err.kind, ErrorKind::OutOfRange, "{}", err.message);
        assert!(err.message.contains("shared prefix"), "{}", err.message);
        assert_rows(&cache, &rows, "after a refused trim");
        cache.trim(4, false).unwrap();
        rows.truncate(&[PREFIX, PREFIX]);
        assert_rows(&cache, &rows, "trimmed to the prefix");
        rows.append(&mut cache, &mut rng, 3);
        cache.spec_round_begin().unwrap();
        rows.append(&mut cache, &mut rng, 2);
        cache.spec_round_rollback(&[0, 2]).unwrap();
        rows.truncate(&[PREFIX + 3, PREFIX + 5]);
        assert_rows(&cache, &rows, "rolled back unequally");
        // Filter, extract and merge keep the prefix shared.
        let extracted = cache.extract_row(1).unwrap();
        assert!(extracted.shared_prefix().unwrap().same_as(cache.shared_prefix().unwrap()));
        assert_rows(&extracted, &Rows(vec![rows.0[1].clone()]), "extracted");
        let mut merged = LatentCache::new(*cache.geometry()).unwrap();
        merged.merge_rows(&[&cache, &extracted]).unwrap();
        assert!(merged.shared_prefix().unwrap().same_as(cache.shared_prefix().unwrap()));
        assert_rows(&merged, &Rows(vec![rows.0[0].clone(), rows.0[1].clone(), rows.0[1].clone()]), "merged");
        cache.filter_rows(&[1, 0]).unwrap();
        let rows = Rows(vec![rows.0[1].clone(), rows.0[0].clone()]);
        assert_rows(&cache, &rows, "filtered");
        // Rows over another prefix (equal values, other arrays) do not merge.
        let (other, _, _) = attached(layout, &mut Rng::new(21), 1, 1);
        let mut refused = LatentCache::new(*cache.geometry()).unwrap();
        let err = refused.merge_rows(&[&cache, &other]).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument, "{}", err.message);
        assert_eq!((refused.batch_size(), refused.shared_positions()), (0, 0), "a refused merge leaves the destination empty");
        // A save writes the rows as they read; the load holds them contiguous.
        let loaded = persist::load_from_bytes(&persist::save_to_bytes(&[&cache]).unwrap()).unwrap();
        assert_eq!(loaded[0].shared_positions(), 0);
        assert_rows(&loaded[0], &rows, "saved and loaded");
        // A row over a prefix snapshotted turn by turn: a segment inside the prefix, one across
        // its end, one of positions appended after; the chain restores the row bit for bit, and
        // extends a cache holding its first segments.
        let mut one = cache.extract_row(0).unwrap();
        let mut row = Rows(vec![rows.0[0].clone()]);
        let save = |one: &mut LatentCache, from: usize, to: usize, key: &[u8]| {
            save_segment_to_bytes(&mut [one], SegmentRange { row: 0, from, to, key }).unwrap().0
        };
        let first = save(&mut one, 0, PREFIX - 10, b"a");
        let end = one.offset();
        let second = save(&mut one, PREFIX - 10, end, b"b");
        row.append(&mut one, &mut rng, 2);
        let now = one.offset();
        let third = save(&mut one, end, now, b"c");
        let chain = [SegmentSource::Bytes(&first), SegmentSource::Bytes(&second), SegmentSource::Bytes(&third)];
        let restored = load_segments(&chain).unwrap();
        assert_eq!(restored[0].shared_positions(), 0);
        assert_rows(&restored[0], &row, "restored from its segments");
        let mut partial = load_segments(&chain[..2]).unwrap();
        assert_eq!(extend_segments(&mut [&mut partial[0]], &chain[2..]).unwrap(), 1);
        assert_rows(&partial[0], &row, "extended by its last segment");
        cache.reset();
        assert_eq!((cache.batch_size(), cache.shared_positions()), (0, 0));
    }
}

#[test]
fn attach_and_fork_check_what_they_are_given() {
    let mut rng = Rng::new(22);
    let (mut cache, rows, source) = attached(LayoutKind::RightJustified, &mut rng, 1, 2);
    let prefix = source.share_prefix(0, PREFIX).unwrap();
    let err = cache.attach_prefix(&prefix, 1).unwrap_err();
    assert_eq!(err.kind, ErrorKind::State, "{}", err.message);
    assert_rows(&cache, &rows, "after a refused attach");
    let mut empty = LatentCache::new(*cache.geometry()).unwrap();
    assert_eq!(empty.attach_prefix(&prefix, 0).unwrap_err().kind, ErrorKind::InvalidArgument);
    let other = Geometry { kv_lora_rank: 64, ..*cache.geometry() };
    assert_eq!(LatentCache::new(other).unwrap().attach_prefix(&prefix, 1).unwrap_err().kind, ErrorKind::InvalidArgument);
    // Room under max_tokens: a prefix of 40 leaves 10 of 50.
    let mut limited = LatentCache::new(Geometry { max_tokens: 50, ..*cache.geometry() }).unwrap();
    let limited_prefix = {
        let mut s = LatentCache::new(Geometry { max_tokens: 50, ..*cache.geometry() }).unwrap();
        Rows(vec![Default::default()]).append(&mut s, &mut rng, PREFIX);
        s.share_prefix(0, PREFIX).unwrap()
    };
    limited.attach_prefix(&limited_prefix, 1).unwrap();
    assert_eq!(limited.max_append_tokens(), 10);
    let part = |w: usize, n: usize| crate::common::mlx_helpers::array(&vec![0.5; n * w], &[1, n, w]);
    let err = limited.append(&part(32, 11), &part(16, 11), Some(&part(24, 11))).unwrap_err();
    assert_eq!(err.kind, ErrorKind::Capacity, "{}", err.message);
    assert_eq!(limited.row_offsets(), vec![PREFIX]);
    // Fork: out-of-range rows, composed storage and open rounds are refused.
    assert_eq!(cache.fork_row(1, 2).unwrap_err().kind, ErrorKind::OutOfRange);
    cache.spec_round_begin().unwrap();
    assert_eq!(cache.fork_row(0, 2).unwrap_err().kind, ErrorKind::State);
    cache.spec_round_commit().unwrap();
    let composed = Geometry { latent_storage: StorageMode::Bf16, hot_window: 16, ..geometry(LayoutKind::RightJustified) };
    let mut c = LatentCache::new(composed).unwrap();
    Rows(vec![Default::default()]).append(&mut c, &mut rng, 20);
    assert_eq!(c.fork_row(0, 2).unwrap_err().kind, ErrorKind::InvalidArgument);
    assert_eq!(c.row_offsets(), vec![20]);
    // Rows holding nothing of their own yet: a round rolled back, a prefill's right padding
    // (refused: it would reach the prefix), an empty row's fork (refused).
    let mut forked = cache.extract_row(0).unwrap();
    forked.fork_row(0, 2).unwrap();
    let before = forked.row_offsets();
    forked.spec_round_begin().unwrap();
    forked.spec_round_rollback(&[0, 0]).unwrap();
    forked.prefill_prepare(None, None, Some(&[1, 0])).unwrap();
    assert_eq!(forked.prefill_finalize().unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(forked.row_offsets(), before);
    let mut empty_row = LatentCache::new(*cache.geometry()).unwrap();
    let part = |w: usize| crate::common::mlx_helpers::array(&vec![0.5; 4 * w], &[2, 2, w]);
    empty_row.append_with(Some(&[2, 0]), &part(32), &part(16), Some(&part(24)), false).unwrap();
    assert_eq!(empty_row.row_offsets(), vec![0, 2]);
    assert_eq!(empty_row.fork_row(0, 2).unwrap_err().kind, ErrorKind::OutOfRange);
    assert_eq!(empty_row.row_offsets(), vec![0, 2]);
    // A prefix shorter than the row's shared part cuts a piece without copying.
    let short = cache.share_prefix(0, 10).unwrap();
    assert_eq!(short.positions(), 10);
    let mut on_short = LatentCache::new(*cache.geometry()).unwrap();
    on_short.attach_prefix(&short, 1).unwrap();
    let mut want =
        Rows(vec![[rows.0[0][0][..10 * 32].to_vec(), rows.0[0][1][..10 * 16].to_vec(), rows.0[0][2][..10 * 24].to_vec()]]);
    want.append(&mut on_short, &mut rng, 2);
    assert_rows(&on_short, &want, "over a cut prefix");
}

/// A prefix cut inside another's piece is a view of that piece's buffer: it reports the bytes
/// that buffer holds (what keeping the prefix keeps alive), not none.
#[test]
fn a_prefix_cut_inside_a_piece_reports_the_buffer_it_keeps() {
    let mut rng = Rng::new(23);
    let (cache, _, source) = attached(LayoutKind::RightJustified, &mut rng, 1, 2);
    let whole = source.share_prefix(0, PREFIX).unwrap();
    let cut = cache.share_prefix(0, PREFIX - 1).unwrap();
    assert!(whole.held_bytes() > 0);
    assert_eq!(cut.held_bytes(), whole.held_bytes(), "the cut keeps the piece's buffer");
}

/// What the header says of trims and attaches over a prefix: a trim into the prefix is
/// OUT_OF_RANGE outside a round and, inside one with bypass, INVALID_STATE (the round's rule
/// comes first); an attach inside an open round is INVALID_STATE. Nothing changes.
#[test]
fn trims_and_attaches_refused_with_the_documented_statuses() {
    let mut rng = Rng::new(5);
    let (mut cache, rows, _) = attached(LayoutKind::RightJustified, &mut rng, 2, 3);
    assert_eq!(cache.trim(4, false).unwrap_err().kind, ErrorKind::OutOfRange, "into the prefix");
    assert_eq!(cache.trim(4, true).unwrap_err().kind, ErrorKind::OutOfRange, "into the prefix, bypass");
    cache.spec_round_begin().unwrap();
    assert_eq!(cache.trim(4, true).unwrap_err().kind, ErrorKind::State, "into the prefix inside a round");
    assert_eq!(cache.trim(1, true).unwrap_err().kind, ErrorKind::State, "past what the round appended");
    assert_rows(&cache, &rows, "after refused trims");
    let (source, _) = prompt(LayoutKind::RightJustified, &mut rng);
    let prefix = source.share_prefix(0, PREFIX).unwrap();
    let mut empty = LatentCache::new(*source.geometry()).unwrap();
    empty.spec_round_begin().unwrap();
    assert_eq!(empty.attach_prefix(&prefix, 1).unwrap_err().kind, ErrorKind::State, "attach inside a round");
    assert_eq!(empty.batch_size(), 0);
}
