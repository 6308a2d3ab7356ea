//! Shared prefixes with joins and filters.
use super::*;

#[test]
fn joins_and_filters_over_a_shared_prefix() {
    for layout in LAYOUTS {
        let g = geometry([8, 4, 6], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(5);
        let (base, base_model) = request(g, &mut rng, 1, 30, false);
        let positions = base_model.len(0).min(17);
        let prefix = base.share_prefix(0, positions).unwrap();
        let mut pm = base_model.extract(0);
        pm.truncate_row(0, positions);

        // The batch: 2 rows over the prefix, 4 slots.
        let mut cache = LatentCache::new(g).unwrap();
        cache.attach_prefix(&prefix, 2).unwrap();
        let mut model = Model::merge(&[&pm, &pm]);
        cache.reserve_rows(4).unwrap();
        append(&mut rng, &mut cache, &mut model, 2, 5);
        assert_matches(&cache, &model, &format!("{what}: two rows over a prefix"));

        // A request over the same prefix joins (in a free slot), one with no own positions too.
        let over = |rng: &mut Rng, tokens: usize| {
            let mut c = LatentCache::new(g).unwrap();
            c.attach_prefix(&prefix, 1).unwrap();
            let mut m = pm.clone();
            if tokens > 0 {
                append(rng, &mut c, &mut m, 1, tokens);
            }
            (c, m)
        };
        // (Shorter than the rows there: a longer right-justified row would move `start`
        // back, and it is 0, so that join rebuilds.)
        let (a, am) = over(&mut rng, 4);
        let (b, bm) = over(&mut rng, 0);
        let held = cache.bytes_in_use();
        cache.merge_rows(&[&a, &b]).unwrap();
        model = Model::merge(&[&model, &am, &bm]);
        assert_matches(&cache, &model, &format!("{what}: joins over the prefix"));
        assert_eq!(cache.bytes_in_use(), held, "{what}: the joins took free slots");
        append(&mut rng, &mut cache, &mut model, 4, 2);
        assert_matches(&cache, &model, &format!("{what}: appends after joins over the prefix"));

        // Leaves of every shape, each followed by a join.
        for (i, keep) in [vec![1, 2, 3], vec![2, 1], vec![0], vec![0, 1, 2]].into_iter().enumerate() {
            if keep.iter().any(|&r| r >= model.rows.len()) {
                continue;
            }
            cache.filter_rows(&keep).unwrap();
            model.filter(&keep);
            assert_matches(&cache, &model, &format!("{what}: filter {keep:?} over the prefix"));
            let (j, jm) = over(&mut rng, 1 + 7 * i);
            cache.merge_rows(&[&j]).unwrap();
            model = Model::merge(&[&model, &jm]);
            assert_matches(&cache, &model, &format!("{what}: join after filter {keep:?} over the prefix"));
            let batch = model.rows.len();
            append(&mut rng, &mut cache, &mut model, batch, 1);
            assert_matches(&cache, &model, &format!("{what}: append after join {i}"));
        }

        // Rows holding nothing of their own (their buffers empty) take a join and a leave.
        let mut bare = LatentCache::new(g).unwrap();
        bare.attach_prefix(&prefix, 2).unwrap();
        let (c, cm) = over(&mut rng, 3);
        bare.merge_rows(&[&b, &c]).unwrap();
        let mut bare_model = Model::merge(&[&pm, &pm, &bm, &cm]);
        assert_matches(&bare, &bare_model, &format!("{what}: join into rows of no own positions"));
        bare.filter_rows(&[3, 1]).unwrap();
        bare_model.filter(&[3, 1]);
        append(&mut rng, &mut bare, &mut bare_model, 2, 2);
        assert_matches(&bare, &bare_model, &format!("{what}: filter and append after"));
        let mut bare2 = LatentCache::new(g).unwrap();
        bare2.attach_prefix(&prefix, 3).unwrap();
        bare2.filter_rows(&[2, 0]).unwrap();
        bare2.merge_rows(&[&b]).unwrap();
        let mut bare2_model = Model::merge(&[&pm, &pm, &bm]);
        append(&mut rng, &mut bare2, &mut bare2_model, 3, 1);
        assert_matches(&bare2, &bare2_model, &format!("{what}: filter and join of bare rows"));

        // Rows over another prefix (the same values, shared again), or none: refused.
        let again = base.share_prefix(0, positions).unwrap();
        let mut other = LatentCache::new(g).unwrap();
        other.attach_prefix(&again, 1).unwrap();
        let (plain, _) = request(g, &mut rng, 1, 5, false);
        let before = snapshot(&cache);
        assert_refused(cache.merge_rows(&[&other]), ErrorKind::InvalidArgument, &cache, &before, "join over another prefix");
        assert_refused(cache.merge_rows(&[&plain]), ErrorKind::InvalidArgument, &cache, &before, "join without the prefix");
        // And the other way: a plain batch refuses rows over a prefix.
        let (mut plain_batch, plain_model) = moved_batch(g, &mut rng);
        let before_plain = snapshot(&plain_batch);
        assert_refused(
            plain_batch.merge_rows(&[&a]),
            ErrorKind::InvalidArgument,
            &plain_batch,
            &before_plain,
            "join of a row over a prefix into a plain batch",
        );
        assert_matches(&plain_batch, &plain_model, "plain batch after the refusal");

        // Save/load of the moved batch over the prefix reads the same.
        let bytes = save_to_bytes(&[&cache]).unwrap();
        let loaded = load_from_bytes(&bytes).unwrap().pop().unwrap();
        assert_matches(&loaded, &model, &format!("{what}: loaded over the prefix"));

        // Extract a row of a moved batch over the prefix.
        let last = model.rows.len() - 1;
        assert_matches(&cache.extract_row(last).unwrap(), &model.extract(last), &format!("{what}: extract over prefix"));

        // A row of the moved batch becomes a prefix; rows over it join each other.
        let row = model.rows.len() - 1;
        let len = model.len(row);
        let deeper = cache.share_prefix(row, len).unwrap();
        let mut dm = model.extract(row);
        dm.truncate_row(0, len);
        let mut forked = LatentCache::new(g).unwrap();
        forked.attach_prefix(&deeper, 2).unwrap();
        let mut fm = Model::merge(&[&dm, &dm]);
        append(&mut rng, &mut forked, &mut fm, 2, 3);
        let mut j = LatentCache::new(g).unwrap();
        j.attach_prefix(&deeper, 1).unwrap();
        let mut jm = dm.clone();
        append(&mut rng, &mut j, &mut jm, 1, 6);
        forked.merge_rows(&[&j]).unwrap();
        fm = Model::merge(&[&fm, &jm]);
        assert_matches(&forked, &fm, &format!("{what}: join over a prefix taken from a moved batch"));

        // fork_row of a moved batch: the rows over the fork join and leave.
        let row = 1.min(model.rows.len() - 1);
        let mut fork_model = model.extract(row);
        let n = 3;
        cache.fork_row(row, n).unwrap();
        model = Model::merge(&vec![&fork_model; n]);
        assert_matches(&cache, &model, &format!("{what}: fork_row of a moved batch"));
        append(&mut rng, &mut cache, &mut model, n, 2);
        let fork_prefix = cache.shared_prefix().unwrap().clone();
        let mut k = LatentCache::new(g).unwrap();
        k.attach_prefix(&fork_prefix, 1).unwrap();
        append(&mut rng, &mut k, &mut fork_model, 1, 4);
        cache.merge_rows(&[&k]).unwrap();
        model = Model::merge(&[&model, &fork_model]);
        assert_matches(&cache, &model, &format!("{what}: join after fork_row"));
        cache.filter_rows(&[3, 0]).unwrap();
        model.filter(&[3, 0]);
        assert_matches(&cache, &model, &format!("{what}: filter after fork_row"));
    }
}
