//! Segments after slot moves.
use super::*;

#[test]
fn segments_of_rows_in_moved_slots() {
    for layout in LAYOUTS {
        let g = geometry_in([64, 16, 0], [StorageMode::Bf16; 3], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(11);
        let (mut cache, mut model) = moved_batch(g, &mut rng);
        // Row 2 (a later slot, positions past start) saved in two segments around an append.
        let row = 2;
        let len = model.len(row);
        let (bytes0, _) =
            save_segment_to_bytes(&mut [&mut cache], SegmentRange { row, from: 0, to: len - 3, key: b"k" }).unwrap();
        let (bytes1, _) =
            save_segment_to_bytes(&mut [&mut cache], SegmentRange { row, from: len - 3, to: len, key: b"k" }).unwrap();
        let restored = load_segments(&[SegmentSource::Bytes(&bytes0), SegmentSource::Bytes(&bytes1)]).unwrap();
        assert_matches(&restored[0], &model.extract(row), &format!("{what}: segments of a moved row"));
        // After a join into the free slot and a leave, the chain is forgotten or still right.
        let (j, jm) = request(g, &mut rng, 1, 20, false);
        cache.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        cache.filter_rows(&[3, 2]).unwrap();
        model.filter(&[3, 2]);
        append(&mut rng, &mut cache, &mut model, 2, 3);
        assert_matches(&cache, &model, &format!("{what}: moved again"));
        for row in 0..2 {
            let len = model.len(row);
            match save_segment_to_bytes(&mut [&mut cache], SegmentRange { row, from: 0, to: len, key: b"k" }) {
                Ok((bytes, _)) => {
                    let restored = load_segments(&[SegmentSource::Bytes(&bytes)]).unwrap();
                    assert_matches(&restored[0], &model.extract(row), &format!("{what}: segment of row {row} after moves"));
                }
                Err(e) => panic!("{what}: segment of row {row} from 0 refused: {}", e.message),
            }
        }
        // A continuation from a chain the cache does not hold must be refused.
        let before = snapshot(&cache);
        let r = save_segment_to_bytes(&mut [&mut cache], SegmentRange { row: 0, from: 2, to: 4, key: b"k" });
        if r.is_ok() {
            // Only acceptable if the cache knows it holds row 0's chain of exactly 2 positions.
            panic!("{what}: a continuation at 2 was accepted though no chain of 2 positions was saved");
        }
        assert_eq!(snapshot(&cache), before, "{what}: refused segment changed the cache");
    }
}
