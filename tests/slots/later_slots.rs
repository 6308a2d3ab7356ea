//! More corners: views held across moves, segments extended into a later slot, many rows at
//! once, `start` near the capacity, slots kept across prefix calls.
use super::*;

fn host_bits(a: &mlx_rs::Array) -> Vec<u32> {
    common::mlx_helpers::host(a).iter().map(|v| v.to_bits()).collect()
}

/// Views (`state`) and donors taken before an in-place leave or join keep the values they had:
/// the in-place writes must not reach arrays someone else still holds.
#[test]
fn views_and_donors_taken_before_a_move_keep_their_values() {
    use latent_cache::core::attention::MaskMode;
    for layout in LAYOUTS {
        let g = geometry_in([128, 64, 0], [StorageMode::F32; 3], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(31);
        let (mut cache, mut model) = moved_batch(g, &mut rng);
        let state = cache.state().unwrap();
        let (latent_before, rope_before) = (host_bits(&state.latent), host_bits(&state.rope));
        let held_lazy = cache.state().unwrap(); // never evaluated before the moves
        let donor = cache.capture_donor_rows().unwrap();
        let ql: Vec<f32> = rng.floats(3 * 2 * 128).iter().map(|v| v / 8192.0).collect();
        let qr: Vec<f32> = rng.floats(3 * 2 * 64).iter().map(|v| v / 8192.0).collect();
        let q_latent = common::mlx_helpers::array(&ql, &[3, 2, 1, 128]);
        let q_rope = common::mlx_helpers::array(&qr, &[3, 2, 1, 64]);
        let attended = host_bits(&donor.attend(&q_latent, &q_rope, 0.1, MaskMode::None, None).unwrap());
        // In-place moves: a join into the free slot, the last row taking row 0's slot, appends.
        let (j, jm) = request(g, &mut rng, 1, 10, false);
        cache.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        cache.filter_rows(&[3, 1, 2]).unwrap();
        model.filter(&[3, 1, 2]);
        append(&mut rng, &mut cache, &mut model, 3, 2);
        cache.eval().unwrap();
        assert_matches(&cache, &model, &what);
        assert_eq!(host_bits(&state.latent), latent_before, "{what}: an evaluated latent view changed under a move");
        assert_eq!(host_bits(&state.rope), rope_before, "{what}: an evaluated rope view changed under a move");
        assert_eq!(host_bits(&held_lazy.latent), latent_before, "{what}: a lazy latent view read the moved buffers");
        let again = host_bits(&donor.attend(&q_latent, &q_rope, 0.1, MaskMode::None, None).unwrap());
        assert_eq!(again, attended, "{what}: a donor taken before the moves attends differently");
    }
}

/// A chain restored into a one-row cache whose row sits in slot 1 (a two-row batch the first
/// row left) is extended there.
#[test]
fn segments_extend_a_row_in_a_later_slot() {
    for layout in LAYOUTS {
        let g = geometry_in([64, 16, 0], [StorageMode::Bf16; 3], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(41);
        // The conversation: 12 positions then 5 more, saved as two segments.
        let mut conv = LatentCache::new(g).unwrap();
        let mut conv_model = model_of(&g);
        append(&mut rng, &mut conv, &mut conv_model, 1, 12);
        let (s0, _) = save_segment_to_bytes(&mut [&mut conv], SegmentRange { row: 0, from: 0, to: 12, key: b"c" }).unwrap();
        append(&mut rng, &mut conv, &mut conv_model, 1, 5);
        let (s1, _) = save_segment_to_bytes(&mut [&mut conv], SegmentRange { row: 0, from: 12, to: 17, key: b"c" }).unwrap();
        // A batch: a longer row, then the conversation's first segment; the first row leaves.
        let first = load_segments(&[SegmentSource::Bytes(&s0)]).unwrap().pop().unwrap();
        let (long, _) = request(g, &mut rng, 1, 40, false);
        let mut batch = LatentCache::new(g).unwrap();
        batch.reserve_rows(3).unwrap();
        batch.merge_rows(&[&long, &first]).unwrap();
        batch.filter_rows(&[1]).unwrap();
        let mut model = conv_model.extract(0);
        model.truncate_row(0, 12);
        assert_matches(&batch, &model, &format!("{what}: the conversation's row in slot 1"));
        // The batch's row saved again (the same chain), then extended by the second segment.
        let (again, _) = save_segment_to_bytes(&mut [&mut batch], SegmentRange { row: 0, from: 0, to: 12, key: b"c" }).unwrap();
        assert_eq!(again, s0, "{what}: the same positions save the same segment");
        let added = latent_cache::core::persist::segment::extend_segments(&mut [&mut batch], &[SegmentSource::Bytes(&s1)]);
        assert_eq!(added.unwrap(), 1, "{what}: one segment appended");
        assert_matches(&batch, &conv_model, &format!("{what}: extended in slot 1"));
        append(&mut rng, &mut batch, &mut conv_model, 1, 3);
        assert_matches(&batch, &conv_model, &format!("{what}: appended after the extension"));
    }
}

/// Seventy requests join at once into reserved slots (more writes than one lazy chain holds),
/// then leave from the front, the back and the middle, and some join again.
#[test]
fn many_rows_join_at_once_and_leave_one_by_one() {
    for layout in LAYOUTS {
        let g = geometry([8, 4, 6], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(51);
        // Rows longer than every joiner: right-justified joins then move nothing there.
        let mut cache = LatentCache::new(g).unwrap();
        let mut model = model_of(&g);
        // (Padded ragged rows would rebuild: their left paddings differ.)
        match layout {
            LayoutKind::RightJustified => append_padded(&mut rng, &mut cache, &mut model, &[0, 3], 20),
            LayoutKind::Ragged => append(&mut rng, &mut cache, &mut model, 2, 20),
        }
        cache.reserve_rows(80).unwrap();
        let held = cache.bytes_in_use();
        let reqs: Vec<(LatentCache, Model)> = (0..70).map(|i| request(g, &mut rng, usize::from(i % 9 != 4), 15, false)).collect();
        cache.merge_rows(&reqs.iter().map(|r| &r.0).collect::<Vec<_>>()).unwrap();
        let mut models = vec![&model];
        models.extend(reqs.iter().map(|r| &r.1));
        model = Model::merge(&models);
        assert_matches(&cache, &model, &format!("{what}: 70 joins"));
        assert_eq!(cache.bytes_in_use(), held, "{what}: 70 joins into reserved slots");
        let batch = model.rows.len();
        append(&mut rng, &mut cache, &mut model, batch, 1);
        for step in 0..40 {
            let n = model.rows.len();
            let keep: Vec<usize> = match step % 4 {
                0 => (1..n).collect(),
                1 => (0..n - 1).collect(),
                2 => (0..n).filter(|&b| b != n / 2).collect(),
                _ => (0..n).filter(|&b| b != n / 3).rev().collect(),
            };
            cache.filter_rows(&keep).unwrap();
            model.filter(&keep);
            if step % 5 == 0 {
                let (a, am) = request(g, &mut rng, 1, 30, false);
                let (b, bm) = request(g, &mut rng, 2, 5, false);
                cache.merge_rows(&[&a, &b]).unwrap();
                model = Model::merge(&[&model, &am, &bm]);
            }
            let n = model.rows.len();
            append(&mut rng, &mut cache, &mut model, n, 1);
            assert_matches(&cache, &model, &format!("{what}: step {step} keep {keep:?}"));
        }
    }
}

/// `start` pushed near the end of the capacity (the longest row left), then joins, appends
/// position by position past the capacity, rounds and leaves.
#[test]
fn start_near_the_capacity_then_joins_and_growth() {
    for layout in LAYOUTS {
        let g = geometry([8, 4, 6], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(61);
        let mut a = LatentCache::new(g).unwrap();
        let mut am = model_of(&g);
        append(&mut rng, &mut a, &mut am, 1, 250);
        let (b, bm) = request(g, &mut rng, 1, 1, false);
        let mut cache = LatentCache::new(g).unwrap();
        cache.reserve_rows(4).unwrap();
        cache.merge_rows(&[&a, &b]).unwrap();
        let mut model = Model::merge(&[&am, &bm]);
        cache.filter_rows(&[1]).unwrap();
        model.filter(&[1]);
        assert_matches(&cache, &model, &format!("{what}: start near the end"));
        for step in 0..30 {
            match step % 6 {
                0 => {
                    let (j, jm) = request(g, &mut rng, 1, 4, false);
                    cache.merge_rows(&[&j]).unwrap();
                    model = Model::merge(&[&model, &jm]);
                }
                3 => {
                    cache.spec_round_begin().unwrap();
                    model.begin();
                    let n = model.rows.len();
                    append(&mut rng, &mut cache, &mut model, n, 3);
                    let keep: Vec<usize> = (0..n).map(|b| (b + step) % 4).collect();
                    cache.spec_round_rollback(&keep).unwrap();
                    model.rollback(&keep);
                }
                5 if model.rows.len() > 1 => {
                    cache.filter_rows(&[model.rows.len() - 1]).unwrap();
                    model.filter(&[model.rows.len() - 1]);
                }
                _ => {
                    let n = model.rows.len();
                    append(&mut rng, &mut cache, &mut model, n, 1);
                }
            }
            assert_matches(&cache, &model, &format!("{what}: step {step}"));
        }
    }
}

/// A set of several layers: reserve_rows, a merge into the empty set, then joins into the
/// reserved slots (no layer's buffers reallocated), through the C ABI.
#[test]
fn c_abi_set_reserve_rows_then_joins_take_free_slots() {
    use common::check::{append_host, assert_equal, host_data, last_error};
    use latent_cache::ffi::config::latent_cache_config_default;
    use latent_cache::ffi::set::*;
    use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
    let cfgs: Vec<_> = (0..3)
        .map(|i| {
            let mut c = latent_cache_config_default();
            (c.kv_lora_rank, c.rope_head_dim, c.index_head_dim) = (8, 4, if i == 1 { 6 } else { 0 });
            c
        })
        .collect();
    let new_set = || {
        let mut set = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), cfgs.len(), &mut set) }, Status::Ok, "{}", last_error());
        let layers: Vec<*mut Handle> = (0..cfgs.len())
            .map(|i| {
                let mut l = std::ptr::null_mut();
                assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut l) }, Status::Ok);
                l
            })
            .collect();
        (set, layers)
    };
    let widths: Vec<[usize; 3]> = cfgs.iter().map(|c| [c.kv_lora_rank, c.rope_head_dim, c.index_head_dim]).collect();
    let mut rng = Rng::new(71);
    let request = |rng: &mut Rng, rows: usize, tokens: usize| {
        let (set, layers) = new_set();
        let mut models: Vec<Model> = widths.iter().map(|&w| Model::new(w)).collect();
        for (l, m) in layers.iter().zip(&mut models) {
            let d = host_data(rng, m.widths, rows, tokens);
            assert_eq!(append_host(*l, rows, tokens, &d), Status::Ok);
            m.append(rows, tokens, &d);
        }
        (set, models)
    };
    let bytes = |set| {
        let mut b = 0;
        assert_eq!(unsafe { latent_cache_set_bytes_in_use(set, &mut b) }, Status::Ok);
        b
    };
    let (set, layers) = new_set();
    assert_eq!(unsafe { latent_cache_set_reserve_rows(set, 8) }, Status::Ok, "{}", last_error());
    let (a, am) = request(&mut rng, 2, 9);
    let (b, bm) = request(&mut rng, 1, 4);
    let sources = [a.cast_const(), b.cast_const()];
    assert_eq!(unsafe { latent_cache_set_merge_rows(set, sources.as_ptr(), 2) }, Status::Ok, "{}", last_error());
    let mut models: Vec<Model> = am.iter().zip(&bm).map(|(x, y)| Model::merge(&[x, y])).collect();
    let held = bytes(set);
    for step in 0..5 {
        for (i, (l, m)) in layers.iter().zip(&models).enumerate() {
            assert_equal(*l, m, &format!("layer {i} step {step}"));
        }
        let n = models[0].rows.len();
        let keep: Vec<usize> = if step % 2 == 0 { (1..n).collect() } else { (0..n - 1).collect() };
        assert_eq!(unsafe { latent_cache_set_filter_rows(set, keep.as_ptr(), keep.len()) }, Status::Ok, "{}", last_error());
        models.iter_mut().for_each(|m| m.filter(&keep));
        let (c, cm) = request(&mut rng, 2, 1 + step);
        let sources = [c.cast_const()];
        assert_eq!(unsafe { latent_cache_set_merge_rows(set, sources.as_ptr(), 1) }, Status::Ok, "{}", last_error());
        for (m, s) in models.iter_mut().zip(&cm) {
            *m = Model::merge(&[m, s]);
        }
        assert_eq!(bytes(set), held, "step {step}: the set's joins took free slots");
        unsafe { latent_cache_set_free(c) };
    }
    for s in [a, b, set] {
        unsafe { latent_cache_set_free(s) };
    }
}

/// DEFECT PROBE: `reserve_rows(n)` on an empty cache is documented to make "the first
/// allocation take that many" slots, "never shrinks; reset forgets it". `attach_prefix` is not
/// a reset, yet it clears the storage (its `rebase`) and with it the reserved slots: the rows'
/// first append allocates only as many slots as rows, and the next join rebuilds every row.
#[test]
fn reserve_rows_before_attach_prefix_keeps_its_slots() {
    let g = geometry([8, 4, 6], LayoutKind::Ragged);
    let mut rng = Rng::new(81);
    let mut base = LatentCache::new(g).unwrap();
    let mut base_model = model_of(&g);
    append(&mut rng, &mut base, &mut base_model, 1, 10);
    let prefix = base.share_prefix(0, 10).unwrap();
    let mut cache = LatentCache::new(g).unwrap();
    cache.reserve_rows(4).unwrap();
    cache.attach_prefix(&prefix, 2).unwrap();
    let mut model = Model::merge(&[&base_model, &base_model]);
    append(&mut rng, &mut cache, &mut model, 2, 5);
    assert_matches(&cache, &model, "two rows over the prefix");
    let per_slot = 256 * g.bytes_per_token(); // one slot of the first allocation (MIN_CAPACITY)
    assert_eq!(cache.bytes_in_use(), 4 * per_slot, "the first append should allocate the 4 reserved slots");
}

/// DEFECT PROBE (the same cause through `fork_row`): a batch with 8 reserved slots forks a row
/// into 2; the forked rows' buffers hold 2 slots, so "slots never shrink except by reset" does
/// not hold and the next join rebuilds.
#[test]
fn fork_row_keeps_reserved_slots() {
    let g = geometry([8, 4, 6], LayoutKind::RightJustified);
    let mut rng = Rng::new(82);
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = model_of(&g);
    cache.reserve_rows(8).unwrap();
    append(&mut rng, &mut cache, &mut model, 3, 5);
    cache.fork_row(0, 2).unwrap();
    let row = model.extract(0);
    model = Model::merge(&[&row, &row]);
    append(&mut rng, &mut cache, &mut model, 2, 5);
    assert_matches(&cache, &model, "forked");
    let per_slot = 256 * g.bytes_per_token();
    assert_eq!(cache.bytes_in_use(), 8 * per_slot, "the forked rows' buffers should keep the 8 reserved slots");
}

/// `shrink_rows` (landed after the slots) of rows in later slots and past `start`: in a round
/// (then an uneven rollback), mid-prefill, over a shared prefix, and followed by joins,
/// leaves and growth; and in the random sequences' spirit, after every step the model.
#[test]
fn shrink_rows_after_slot_moves() {
    for layout in LAYOUTS {
        let g = geometry([8, 4, 6], layout);
        let what = format!("{layout:?}");
        let mut rng = Rng::new(91);
        let (mut cache, mut model) = moved_batch(g, &mut rng);
        let before = cache.bytes_in_use();
        cache.shrink_rows().unwrap();
        assert_matches(&cache, &model, &format!("{what}: shrink after a front leave"));
        assert!(cache.bytes_in_use() < before, "{what}: shrink released nothing");
        // In a round, then an uneven rollback.
        cache.spec_round_begin().unwrap();
        model.begin();
        append(&mut rng, &mut cache, &mut model, 3, 4);
        cache.filter_rows(&[0]).unwrap_err();
        cache.shrink_rows().unwrap();
        cache.spec_round_rollback(&[4, 0, 2]).unwrap();
        model.rollback(&[4, 0, 2]);
        assert_matches(&cache, &model, &format!("{what}: rollback after a shrink in the round"));
        // Joins rebuild (no free slot), leaves keep slots, shrink again, grow.
        let (j, jm) = request(g, &mut rng, 2, 30, true);
        cache.merge_rows(&[&j]).unwrap();
        model = Model::merge(&[&model, &jm]);
        cache.filter_rows(&[4, 1, 2]).unwrap();
        model.filter(&[4, 1, 2]);
        cache.shrink_rows().unwrap();
        assert_matches(&cache, &model, &format!("{what}: shrink after join and leave"));
        // Mid-prefill.
        cache.prefill_prepare(None, None, Some(&[2, 0, 1])).unwrap();
        model.prefill = Some(Prefill { lengths: None, left: None, right: Some(vec![2, 0, 1]), base: model.row_offsets() });
        append(&mut rng, &mut cache, &mut model, 3, 3);
        cache.filter_rows(&[1, 2]).unwrap();
        model.filter(&[1, 2]);
        cache.shrink_rows().unwrap();
        assert_matches(&cache, &model, &format!("{what}: shrink mid-prefill"));
        cache.prefill_finalize().unwrap();
        let right = model.prefill.take().unwrap().right.unwrap();
        for (row, &r) in right.iter().enumerate() {
            let len = model.len(row);
            model.truncate_row(row, len - r);
        }
        assert_matches(&cache, &model, &format!("{what}: finalize after shrink"));
        append(&mut rng, &mut cache, &mut model, 2, 300);
        assert_matches(&cache, &model, &format!("{what}: growth after shrink"));
        cache.reserve_rows(4).unwrap();
        let (k, km) = request(g, &mut rng, 1, 10, false);
        let held = cache.bytes_in_use();
        cache.merge_rows(&[&k]).unwrap();
        model = Model::merge(&[&model, &km]);
        assert_matches(&cache, &model, &format!("{what}: join after reserve_rows after shrink"));
        assert_eq!(cache.bytes_in_use(), held, "{what}: the join took a reserved slot");

        // Over a shared prefix.
        let prefix = cache.share_prefix(0, model.len(0).min(20)).unwrap();
        let mut pm = model.extract(0);
        pm.truncate_row(0, model.len(0).min(20));
        let mut over = LatentCache::new(g).unwrap();
        over.attach_prefix(&prefix, 3).unwrap();
        over.reserve_rows(6).unwrap();
        let mut om = Model::merge(&[&pm, &pm, &pm]);
        append(&mut rng, &mut over, &mut om, 3, 5);
        over.filter_rows(&[2, 1]).unwrap();
        om.filter(&[2, 1]);
        over.shrink_rows().unwrap();
        assert_matches(&over, &om, &format!("{what}: shrink over a prefix"));
        append(&mut rng, &mut over, &mut om, 2, 2);
        assert_matches(&over, &om, &format!("{what}: append after shrink over a prefix"));
    }
}
