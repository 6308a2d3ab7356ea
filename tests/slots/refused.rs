//! Refused calls change nothing.
use super::*;

#[test]
fn refused_calls_change_nothing() {
    for layout in LAYOUTS {
        let g = Geometry { max_tokens: 200, ..geometry([8, 4, 6], layout) };
        let mut rng = Rng::new(77);
        let (mut cache, mut model) = moved_batch(g, &mut rng);
        let what = format!("{layout:?}");
        let (joiner, joiner_model) = request(g, &mut rng, 1, 10, false);

        // Geometry mismatches: widths, storage, layout, max_tokens, role.
        let others = [
            geometry([8, 4, 0], layout),
            Geometry { max_tokens: 0, ..g },
            Geometry { latent_storage: StorageMode::Bf16, ..g },
            Geometry { layout: if layout == LayoutKind::Ragged { LayoutKind::RightJustified } else { LayoutKind::Ragged }, ..g },
            Geometry { kv_lora_rank: 16, ..g },
        ];
        for (i, other) in others.into_iter().enumerate() {
            let (src, src_model) = request(other, &mut rng, 1, 5, false);
            let before = snapshot(&cache);
            assert_refused(
                cache.merge_rows(&[&joiner, &src]),
                ErrorKind::InvalidArgument,
                &cache,
                &before,
                &format!("{what}: join of geometry {i}"),
            );
            assert_matches(&src, &src_model, "refused source unchanged");
            assert_matches(&joiner, &joiner_model, "refused joiner unchanged");
            // Through the set too.
            assert_refused(
                merge_all(&mut [&mut cache], &[vec![&src]]),
                ErrorKind::InvalidArgument,
                &cache,
                &before,
                &format!("{what}: set join of geometry {i}"),
            );
        }

        // Zero sources.
        let before = snapshot(&cache);
        assert_refused(cache.merge_rows(&[]), ErrorKind::InvalidArgument, &cache, &before, "join of no sources");

        // Filters: duplicates, out of range, empty.
        for keep in [vec![0, 0], vec![2, 1, 2], vec![3], vec![0, 1, 2, 3], vec![]] {
            let kind = if keep.iter().any(|&r| r >= 3) { ErrorKind::OutOfRange } else { ErrorKind::InvalidArgument };
            assert_refused(cache.filter_rows(&keep), kind, &cache, &before, &format!("{what}: filter {keep:?}"));
            assert_refused(
                change_all(&mut [&mut cache], |l| l.prepare_filter(&keep)),
                kind,
                &cache,
                &before,
                &format!("{what}: set filter {keep:?}"),
            );
        }

        // Mid-round: join and filter refused; the round goes on as before.
        cache.spec_round_begin().unwrap();
        model.begin();
        append(&mut rng, &mut cache, &mut model, 3, 3);
        let before = snapshot(&cache);
        assert_refused(cache.merge_rows(&[&joiner]), ErrorKind::State, &cache, &before, "join mid-round");
        assert_refused(merge_all(&mut [&mut cache], &[vec![&joiner]]), ErrorKind::State, &cache, &before, "set join mid-round");
        assert_refused(cache.filter_rows(&[1, 0]), ErrorKind::State, &cache, &before, "filter mid-round");
        cache.spec_round_rollback(&[1, 3, 0]).unwrap();
        model.rollback(&[1, 3, 0]);
        assert_matches(&cache, &model, &format!("{what}: rollback after refusals"));

        // Mid-prefill: join refused (the destination), then finalize works.
        cache.prefill_prepare(None, None, Some(&[1, 0, 2])).unwrap();
        model.prefill = Some(Prefill { lengths: None, left: None, right: Some(vec![1, 0, 2]), base: model.row_offsets() });
        append(&mut rng, &mut cache, &mut model, 3, 3);
        let before = snapshot(&cache);
        assert_refused(cache.merge_rows(&[&joiner]), ErrorKind::State, &cache, &before, "join mid-prefill");
        assert_refused(merge_all(&mut [&mut cache], &[vec![&joiner]]), ErrorKind::State, &cache, &before, "set join mid-prefill");
        cache.prefill_finalize().unwrap();
        for (row, r) in [1, 0, 2].into_iter().enumerate() {
            let len = model.len(row);
            model.truncate_row(row, len - r);
        }
        model.prefill = None;
        assert_matches(&cache, &model, &format!("{what}: finalize after a refused join"));

        // reserve_rows past INT32_MAX, and past memory: refused, nothing changes.
        let before = snapshot(&cache);
        assert_refused(
            cache.reserve_rows(i32::MAX as usize + 1),
            ErrorKind::Capacity,
            &cache,
            &before,
            "reserve_rows INT32_MAX+1",
        );
        let huge = cache.reserve_rows(1 << 30);
        assert!(huge.is_err(), "{what}: reserving 2^30 rows should not fit");
        assert_eq!(snapshot(&cache), before, "{what}: refused reserve_rows(2^30) changed the cache");
        // A join of a row that reaches max_tokens exactly works; the cache then refuses to grow.
        let (long, long_model) = {
            let mut c = LatentCache::new(g).unwrap();
            let mut m = model_of(&g);
            append(&mut rng, &mut c, &mut m, 1, 200);
            (c, m)
        };
        cache.merge_rows(&[&long]).unwrap();
        model = Model::merge(&[&model, &long_model]);
        assert_matches(&cache, &model, &format!("{what}: join of a row at max_tokens"));
        let before = snapshot(&cache);
        let d = data(&mut rng, model.widths, 4, 1);
        assert_refused(
            cache.append_host(4, 1, &d[0], &d[1], Some(&d[2])),
            ErrorKind::Capacity,
            &cache,
            &before,
            "append past max_tokens",
        );
        // The cache works on: the long row leaves from the back, the rest append.
        cache.filter_rows(&[0, 1, 2]).unwrap();
        model.filter(&[0, 1, 2]);
        append(&mut rng, &mut cache, &mut model, 3, 4);
        assert_matches(&cache, &model, &format!("{what}: after refusals"));
    }
}
