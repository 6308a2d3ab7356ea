//! Targeted corners.
use super::*;

/// A join right after a filter that moved `start` (the longest row left), with joiners
/// shorter, equal and longer than the rows there; then growth past capacity with `first > 0`,
/// `reserve` after the moves, extracts, and a save.
#[test]
fn join_after_start_moved_then_growth_and_reserve() {
    for layout in LAYOUTS {
        for joiner_len in [1, 9, 12, 30, 40, 60, 300] {
            let g = geometry([8, 4, 6], layout);
            let what = format!("{layout:?} joiner {joiner_len}");
            let mut rng = Rng::new(joiner_len as u64);
            let (mut cache, mut model) = moved_batch(g, &mut rng);
            let held = cache.bytes_in_use();
            let mut j = LatentCache::new(g).unwrap();
            let mut jm = model_of(&g);
            append(&mut rng, &mut j, &mut jm, 1, joiner_len);
            cache.merge_rows(&[&j]).unwrap();
            model = Model::merge(&[&model, &jm]);
            assert_matches(&cache, &model, &format!("{what}: join after start moved"));
            if joiner_len <= 40 {
                assert_eq!(cache.bytes_in_use(), held, "{what}: a join fitting the window takes the free slot");
            }
            // The first row leaves (first moves on), the batch grows past its capacity.
            cache.filter_rows(&[1, 2, 3]).unwrap();
            model.filter(&[1, 2, 3]);
            assert_matches(&cache, &model, &format!("{what}: front leave"));
            append(&mut rng, &mut cache, &mut model, 3, 250);
            assert_matches(&cache, &model, &format!("{what}: growth with first > 0"));
            cache.filter_rows(&[2, 0]).unwrap();
            model.filter(&[2, 0]);
            cache.reserve(model.offset() + 700).unwrap();
            assert_matches(&cache, &model, &format!("{what}: reserve after moves"));
            for row in 0..2 {
                assert_matches(&cache.extract_row(row).unwrap(), &model.extract(row), &format!("{what}: extract {row}"));
            }
            let (k, km) = request(g, &mut rng, 2, 50, true);
            cache.merge_rows(&[&k]).unwrap();
            model = Model::merge(&[&model, &km]);
            append(&mut rng, &mut cache, &mut model, 4, 3);
            assert_matches(&cache, &model, &format!("{what}: join and append after reserve"));
            let bytes = save_to_bytes(&[&cache]).unwrap();
            assert_matches(&load_from_bytes(&bytes).unwrap()[0], &model, &format!("{what}: loaded"));
        }
    }
}

/// Joins when every free slot lies before the rows (rows left from the front): the rows move
/// back to slot 0; with a right-justified joiner longer than the window too.
#[test]
fn joins_with_free_slots_only_before_the_rows() {
    for layout in LAYOUTS {
        for longer in [false, true] {
            let g = geometry([8, 4, 6], layout);
            let what = format!("{layout:?} longer {longer}");
            let mut rng = Rng::new(3);
            let (mut cache, mut model) = batch_of(g, &mut rng, &[20, 7, 13, 4, 9], 0);
            // Rows 0 and 1 leave from the front: slots 0 and 1 free, the rows in slots 2..5.
            cache.filter_rows(&[2, 3, 4]).unwrap();
            model.filter(&[2, 3, 4]);
            append(&mut rng, &mut cache, &mut model, 3, 1);
            assert_matches(&cache, &model, &format!("{what}: front leave"));
            let n = if longer { 35 } else { 3 };
            let (a, am) = request(g, &mut rng, 1, n, false);
            let (b, bm) = request(g, &mut rng, 1, n, false);
            cache.merge_rows(&[&a, &b]).unwrap();
            model = Model::merge(&[&model, &am, &bm]);
            assert_matches(&cache, &model, &format!("{what}: two joins into the slots before the rows"));
            append(&mut rng, &mut cache, &mut model, 5, 2);
            assert_matches(&cache, &model, &format!("{what}: append after"));
            // Now leave from the middle with the order kept, and from the back, then join again.
            cache.filter_rows(&[0, 1, 3, 4]).unwrap();
            model.filter(&[0, 1, 3, 4]);
            cache.filter_rows(&[1, 2, 3]).unwrap();
            model.filter(&[1, 2, 3]);
            assert_matches(&cache, &model, &format!("{what}: more leaves"));
            let (c, cm) = request(g, &mut rng, 2, 40, true);
            cache.merge_rows(&[&c]).unwrap();
            model = Model::merge(&[&model, &cm]);
            append(&mut rng, &mut cache, &mut model, 5, 1);
            assert_matches(&cache, &model, &format!("{what}: join of a padded pair"));
        }
    }
}

/// Ragged rows with different left padding (a padded prefill) and uneven rollbacks leave and
/// join; ragged appends scatter over slots from `first`.
#[test]
fn ragged_padded_rows_with_uneven_rollbacks_leave_and_join() {
    let g = geometry([8, 4, 6], LayoutKind::Ragged);
    for seed in 0..8 {
        let mut rng = Rng::new(500 + seed);
        let mut cache = LatentCache::new(g).unwrap();
        let mut model = model_of(&g);
        cache.reserve_rows(7).unwrap();
        append_padded(&mut rng, &mut cache, &mut model, &[0, 3, 3, 5], 8);
        for step in 0..6 {
            let what = format!("seed {seed} step {step}");
            cache.spec_round_begin().unwrap();
            model.begin();
            let n = model.rows.len();
            append(&mut rng, &mut cache, &mut model, n, 4);
            let keep: Vec<usize> = (0..n).map(|_| rng.range(0, 4)).collect();
            cache.spec_round_rollback(&keep).unwrap();
            model.rollback(&keep);
            assert_matches(&cache, &model, &format!("{what}: rollback {keep:?}"));
            let (k, shape) = filter_shape(&mut rng, n);
            cache.filter_rows(&k).unwrap();
            model.filter(&k);
            assert_matches(&cache, &model, &format!("{what}: filter {k:?} ({shape})"));
            if model.rows.len() < 6 {
                let rows = rng.range(1, 2);
                let (j, jm) = request(g, &mut rng, rows, 12, true);
                cache.merge_rows(&[&j]).unwrap();
                model = Model::merge(&[&model, &jm]);
                assert_matches(&cache, &model, &format!("{what}: join"));
            }
            let n = model.rows.len();
            append(&mut rng, &mut cache, &mut model, n, 1);
            assert_matches(&cache, &model, &format!("{what}: append"));
        }
    }
}

/// max_tokens bounds the capacity; a filter moving `start` leaves less room than max_tokens,
/// so appends up to max_tokens must still fit (by growing) and joins of longer rows rebuild.
#[test]
fn max_tokens_with_start_moved() {
    for layout in LAYOUTS {
        let g = Geometry { max_tokens: 64, ..geometry([8, 4, 6], layout) };
        let what = format!("{layout:?}");
        let mut rng = Rng::new(8);
        let (mut cache, mut model) = batch_of(g, &mut rng, &[50, 10, 20], 0);
        cache.filter_rows(&[1, 2]).unwrap();
        model.filter(&[1, 2]);
        assert_matches(&cache, &model, &format!("{what}: the longest left"));
        // Up to max_tokens exactly.
        let room = 64 - model.offset();
        append(&mut rng, &mut cache, &mut model, 2, room);
        assert_matches(&cache, &model, &format!("{what}: appended to max_tokens"));
        assert_eq!(cache.max_append_tokens(), 0, "{what}");
        cache.trim(30, false).unwrap();
        model.trim(30);
        cache.filter_rows(&[1]).unwrap();
        model.filter(&[1]);
        let (j, jm) = request(g, &mut rng, 1, 64, false);
        cache.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        assert_matches(&cache, &model, &format!("{what}: join after trims"));
        let room = 64 - model.offset();
        if room > 0 {
            append(&mut rng, &mut cache, &mut model, 2, room);
            assert_matches(&cache, &model, &format!("{what}: to max_tokens again"));
        }
    }
}

/// Attention over a batch whose rows sit in later slots and past `start` equals attention over
/// a fresh merge of the same rows.
#[test]
fn attention_over_moved_slots_equals_a_fresh_merge() {
    use latent_cache::core::attention::MaskMode;
    for layout in LAYOUTS {
        for modes in [[StorageMode::F32; 3], [StorageMode::Q8, StorageMode::Bf16, StorageMode::Bf16]] {
            let g = geometry_in([128, 64, 0], modes, layout);
            let what = format!("{layout:?} {modes:?}");
            let mut rng = Rng::new(21);
            let (mut cache, mut model) = moved_batch(g, &mut rng);
            let (j, jm) = request(g, &mut rng, 1, 30, false);
            cache.merge_rows(&[&j]).unwrap();
            model = Model::merge(&[&model, &jm]);
            cache.filter_rows(&[3, 1, 2]).unwrap();
            model.filter(&[3, 1, 2]);
            assert_matches(&cache, &model, &what);
            let rows: Vec<LatentCache> = (0..3).map(|b| cache.extract_row(b).unwrap()).collect();
            let mut fresh = LatentCache::new(g).unwrap();
            fresh.merge_rows(&rows.iter().collect::<Vec<_>>()).unwrap();
            let (heads, lq) = (4usize, 2usize);
            let ql: Vec<f32> = rng.floats(3 * heads * lq * 128).iter().map(|v| v / 8192.0).collect();
            let qr: Vec<f32> = rng.floats(3 * heads * lq * 64).iter().map(|v| v / 8192.0).collect();
            let q_latent = common::mlx_helpers::array(&ql, &[3, heads, lq, 128]);
            let q_rope = common::mlx_helpers::array(&qr, &[3, heads, lq, 64]);
            for mode in [MaskMode::None, MaskMode::Causal] {
                let got = cache.capture_donor_rows().unwrap().attend(&q_latent, &q_rope, 0.1, mode, None).unwrap();
                let want = fresh.capture_donor_rows().unwrap().attend(&q_latent, &q_rope, 0.1, mode, None).unwrap();
                let (got, want) = (common::mlx_helpers::host(&got), common::mlx_helpers::host(&want));
                assert_eq!(got.len(), want.len());
                let worst = got.iter().zip(&want).map(|(a, b)| (a - b).abs() / (1.0 + b.abs())).fold(0f32, f32::max);
                assert!(worst < 1e-5, "{what} {mode:?}: attention over moved slots differs by {worst}");
            }
        }
    }
}

/// The set (Rust API and C ABI): every layer joins and leaves together; a refusal on one layer
/// changes none.
#[test]
fn set_joins_and_leaves_move_every_layer_together() {
    for layout in LAYOUTS {
        let gs = [
            geometry([8, 4, 6], layout),
            geometry([8, 4, 0], layout),
            Geometry { max_tokens: 100, ..geometry([8, 4, 0], layout) },
        ];
        let what = format!("{layout:?}");
        let mut rng = Rng::new(13);
        let mut layers: Vec<LatentCache> = gs.iter().map(|&g| LatentCache::new(g).unwrap()).collect();
        let mut models: Vec<Model> = gs.iter().map(model_of).collect();
        change_all(&mut layers.iter_mut().collect::<Vec<_>>(), |l| l.prepare_reserve_rows(5)).unwrap();
        for (l, m) in layers.iter_mut().zip(&mut models) {
            append(&mut rng, l, m, 3, 6);
        }
        let check = |layers: &[LatentCache], models: &[Model], step: &str| {
            for (i, (l, m)) in layers.iter().zip(models).enumerate() {
                assert_matches(l, m, &format!("{what}: layer {i} after {step}"));
            }
        };
        for round in 0..4 {
            // A request of 1 or 2 rows joins every layer.
            let rows = 1 + round % 2;
            let tokens = rng.range(1, 20);
            let mut src: Vec<LatentCache> = gs.iter().map(|&g| LatentCache::new(g).unwrap()).collect();
            let mut src_models: Vec<Model> = gs.iter().map(model_of).collect();
            for (l, m) in src.iter_mut().zip(&mut src_models) {
                append(&mut rng, l, m, rows, tokens);
            }
            merge_all(&mut layers.iter_mut().collect::<Vec<_>>(), &[src.iter().collect()]).unwrap();
            for (m, s) in models.iter_mut().zip(&src_models) {
                *m = Model::merge(&[m, s]);
            }
            check(&layers, &models, &format!("set join {round}"));
            let n = models[0].rows.len();
            let (keep, shape) = filter_shape(&mut rng, n);
            change_all(&mut layers.iter_mut().collect::<Vec<_>>(), |l| l.prepare_filter(&keep)).unwrap();
            models.iter_mut().for_each(|m| m.filter(&keep));
            check(&layers, &models, &format!("set filter {keep:?} ({shape})"));
            let n = models[0].rows.len();
            for (l, m) in layers.iter_mut().zip(&mut models) {
                append(&mut rng, l, m, n, 2);
            }
            check(&layers, &models, "appends");
        }
        // A join that the last layer refuses (its source exceeds nothing but has another
        // geometry): no layer changes.
        let before: Vec<Snapshot> = layers.iter().map(snapshot).collect();
        let mut bad: Vec<LatentCache> = gs.iter().map(|&g| LatentCache::new(g).unwrap()).collect();
        bad[2] = LatentCache::new(Geometry { max_tokens: 0, ..gs[2] }).unwrap();
        let mut bad_models: Vec<Model> = gs.iter().map(model_of).collect();
        for (l, m) in bad.iter_mut().zip(&mut bad_models) {
            append(&mut rng, l, m, 1, 3);
        }
        let r = merge_all(&mut layers.iter_mut().collect::<Vec<_>>(), &[bad.iter().collect()]);
        assert_eq!(r.unwrap_err().kind, ErrorKind::InvalidArgument, "{what}");
        let after: Vec<Snapshot> = layers.iter().map(snapshot).collect();
        assert_eq!(after, before, "{what}: a refused set join changed a layer");
    }
}

/// The C ABI: per-cache and set-wide reserve_rows, merge_rows (join), filter_rows.
#[test]
fn c_abi_joins_and_leaves() {
    use common::check::{append_host, assert_equal, host_data, last_error, new_cache};
    use latent_cache::ffi::cache::latent_cache_free;
    use latent_cache::ffi::config::latent_cache_config_default;
    use latent_cache::ffi::rows::{latent_cache_filter_rows, latent_cache_merge_rows, latent_cache_reserve_rows};
    use latent_cache::ffi::set::*;
    use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

    let widths = [8, 4, 6];
    let mut rng = Rng::new(99);
    let cache = new_cache(widths, 0);
    let mut model = Model::new(widths);
    assert_eq!(unsafe { latent_cache_reserve_rows(cache, 6) }, Status::Ok, "{}", last_error());
    let d = host_data(&mut rng, widths, 4, 9);
    assert_eq!(append_host(cache, 4, 9, &d), Status::Ok);
    model.append(4, 9, &d);
    for step in 0..6 {
        let keep: Vec<usize> = match step % 3 {
            0 => (1..model.rows.len()).collect(),
            1 => vec![model.rows.len() - 1, 0],
            _ => (0..model.rows.len()).rev().collect(),
        };
        assert_eq!(unsafe { latent_cache_filter_rows(cache, keep.as_ptr(), keep.len()) }, Status::Ok, "{}", last_error());
        model.filter(&keep);
        assert_equal(cache, &model, &format!("C filter {keep:?}"));
        let j = new_cache(widths, 0);
        let tokens = 1 + 5 * step;
        let d = host_data(&mut rng, widths, 2, tokens);
        assert_eq!(append_host(j, 2, tokens, &d), Status::Ok);
        let mut jm = Model::new(widths);
        jm.append(2, tokens, &d);
        // The same source twice: both its rows join (each handle locked once).
        let sources = [j.cast_const(), j.cast_const()];
        assert_eq!(unsafe { latent_cache_merge_rows(cache, sources.as_ptr(), 2) }, Status::Ok, "{}", last_error());
        model = Model::merge(&[&model, &jm, &jm]);
        assert_equal(cache, &model, &format!("C join {step}"));
        // The destination among the sources: refused, nothing changed.
        let selfish = [cache.cast_const()];
        assert_eq!(unsafe { latent_cache_merge_rows(cache, selfish.as_ptr(), 1) }, Status::InvalidArgument);
        let dup = [0usize, 0];
        assert_eq!(unsafe { latent_cache_filter_rows(cache, dup.as_ptr(), 2) }, Status::InvalidArgument);
        assert_equal(cache, &model, "refusals");
        unsafe { latent_cache_free(j) };
        let n = model.rows.len();
        let d = host_data(&mut rng, widths, n, 1);
        assert_eq!(append_host(cache, n, 1, &d), Status::Ok);
        model.append(n, 1, &d);
    }
    unsafe { latent_cache_free(cache) };

    // Sets of two layers.
    let cfgs: Vec<_> = (0..2)
        .map(|i| {
            let mut c = latent_cache_config_default();
            (c.kv_lora_rank, c.rope_head_dim, c.index_head_dim) = (8, 4, if i == 0 { 6 } else { 0 });
            c
        })
        .collect();
    let new_set = || {
        let mut set = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), 2, &mut set) }, Status::Ok, "{}", last_error());
        let layers: Vec<*mut Handle> = (0..2)
            .map(|i| {
                let mut l = std::ptr::null_mut();
                assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut l) }, Status::Ok);
                l
            })
            .collect();
        (set, layers)
    };
    let lw = [[8, 4, 6], [8, 4, 0]];
    let (set, layers) = new_set();
    let mut models: Vec<Model> = lw.iter().map(|&w| Model::new(w)).collect();
    assert_eq!(unsafe { latent_cache_set_reserve_rows(set, 5) }, Status::Ok, "{}", last_error());
    for (l, m) in layers.iter().zip(&mut models) {
        let d = host_data(&mut rng, m.widths, 3, 5);
        assert_eq!(append_host(*l, 3, 5, &d), Status::Ok);
        m.append(3, 5, &d);
    }
    for step in 0..4 {
        let n = models[0].rows.len();
        let keep: Vec<usize> = if step % 2 == 0 { (1..n).collect() } else { vec![n - 1, 0] };
        assert_eq!(unsafe { latent_cache_set_filter_rows(set, keep.as_ptr(), keep.len()) }, Status::Ok, "{}", last_error());
        models.iter_mut().for_each(|m| m.filter(&keep));
        let (src, src_layers) = new_set();
        let mut src_models: Vec<Model> = lw.iter().map(|&w| Model::new(w)).collect();
        let tokens = 2 + 7 * step;
        for (l, m) in src_layers.iter().zip(&mut src_models) {
            let d = host_data(&mut rng, m.widths, 2, tokens);
            assert_eq!(append_host(*l, 2, tokens, &d), Status::Ok);
            m.append(2, tokens, &d);
        }
        let sources = [src.cast_const()];
        assert_eq!(unsafe { latent_cache_set_merge_rows(set, sources.as_ptr(), 1) }, Status::Ok, "{}", last_error());
        for (m, s) in models.iter_mut().zip(&src_models) {
            *m = Model::merge(&[m, s]);
        }
        for (i, (l, m)) in layers.iter().zip(&models).enumerate() {
            assert_equal(*l, m, &format!("set layer {i} after step {step}"));
        }
        unsafe { latent_cache_set_free(src) };
    }
    unsafe { latent_cache_set_free(set) };
}
