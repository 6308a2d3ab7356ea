//! Padded batched prefills (`prefill_prepare` / `prefill_finalize`, mlx-lm's
//! `BatchKVCache.prepare` / `finalize`) against the reference model: prompts of different lengths
//! padded at their start, at their end or both, prefilled in chunks, rows leaving mid-prefill,
//! then decoding and rounds; in both layouts. Refused calls change nothing. The comparison with
//! mlx-lm itself is in tests/mlx_lm/mlx_lm_interop.rs.
use crate::common::check::{append_host, assert_equal, host_data, last_error};
use crate::common::core_check::{assert_matches, model_of};
use crate::common::mlx_helpers::geometry as geometry_of;
use crate::common::model::{Model, Rng};
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::set::*;
use latent_cache::{ErrorKind, Geometry, LatentCache, LayoutKind};

fn geometry(index_head_dim: usize, layout: LayoutKind) -> Geometry {
    geometry_of([8, 4, index_head_dim], layout)
}

fn append(rng: &mut Rng, cache: &mut LatentCache, model: &mut Model, batch: usize, tokens: usize, pads: Option<&[usize]>) {
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * model.widths[f]));
    let keys = (model.widths[2] > 0).then_some(data[2].as_slice());
    cache.append_host(batch, tokens, &data[0], &data[1], keys).unwrap();
    match pads {
        Some(pads) => model.append_padded(batch, tokens, pads, &data),
        None => model.append(batch, tokens, &data),
    }
}

/// The model's finalize: each row drops its right padding.
fn drop_right(model: &mut Model, right: &[usize]) {
    for (row, &r) in right.iter().enumerate() {
        let len = model.len(row);
        model.truncate_row(row, len - r);
    }
}

fn run(seed: u64, g: Geometry) {
    let mut rng = Rng::new(seed);
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = model_of(&g);
    let mut batch = rng.range(1, 6);
    let mut lengths: Vec<usize> = (0..batch).map(|_| rng.range(1, 12)).collect();
    let longest = *lengths.iter().max().unwrap();
    // Each prompt's padding split between its start and its end (all at one end, or both).
    let mut left: Vec<usize> = Vec::new();
    let mut right: Vec<usize> = Vec::new();
    let split = rng.range(0, 2);
    for &len in &lengths {
        let pad = longest - len;
        let l = match split {
            0 => pad,
            1 => 0,
            _ => rng.range(0, pad),
        };
        left.push(l);
        right.push(pad - l);
    }
    let give_lengths = rng.range(0, 1) == 0;
    let what = format!("seed {seed}, lengths {lengths:?}, left {left:?}, right {right:?}");
    cache
        .prefill_prepare(give_lengths.then_some(lengths.as_slice()), (split != 1).then_some(left.as_slice()), Some(&right))
        .unwrap();
    assert!(cache.in_prefill());
    // Chunks: the first holds every row's left padding and a position.
    let mut done = 0;
    while done < longest {
        let min_first = if done == 0 { left.iter().max().unwrap() + 1 } else { 1 };
        let tokens = rng.range(min_first, longest - done).max(min_first).min(longest - done);
        let pads = (done == 0).then_some(left.as_slice());
        append(&mut rng, &mut cache, &mut model, batch, tokens, pads);
        done += tokens;
        assert_matches(&cache, &model, &format!("prefill chunk of {tokens}, {what}"));
        if done < longest && batch > 1 && rng.range(0, 3) == 0 {
            // A request leaves mid-prefill: the kept rows keep their padding to drop.
            let keep: Vec<usize> = (0..batch).filter(|&b| b != rng.range(0, batch - 1)).collect();
            cache.filter_rows(&keep).unwrap();
            model.filter(&keep);
            right = keep.iter().map(|&b| right[b]).collect();
            lengths = keep.iter().map(|&b| lengths[b]).collect();
            left = keep.iter().map(|&b| left[b]).collect();
            batch = keep.len();
            assert_matches(&cache, &model, &format!("filter {keep:?} mid-prefill, {what}"));
        }
    }
    // A row extracted before finalize leaves without its right padding.
    let row = rng.range(0, batch - 1);
    let mut alone = model.extract(row);
    drop_right(&mut alone, &right[row..=row]);
    assert_matches(&cache.extract_row(row).unwrap(), &alone, &format!("extract {row} mid-prefill, {what}"));

    cache.prefill_finalize().unwrap();
    drop_right(&mut model, &right);
    assert!(!cache.in_prefill());
    assert_eq!(cache.row_offsets(), lengths, "every row holds its prompt, {what}");
    assert_matches(&cache, &model, &format!("finalize, {what}"));

    // Decoding and a round with uneven drops go on as after any prefill.
    append(&mut rng, &mut cache, &mut model, batch, 1, None);
    cache.spec_round_begin().unwrap();
    model.begin();
    append(&mut rng, &mut cache, &mut model, batch, 3, None);
    let keep: Vec<usize> = (0..batch).map(|_| rng.range(0, 3)).collect();
    cache.spec_round_rollback(&keep).unwrap();
    model.rollback(&keep);
    assert_matches(&cache, &model, &format!("round after the prefill, keep {keep:?}, {what}"));
}

#[test]
fn padded_prefills_match_the_model_in_both_layouts() {
    for seed in 0..60 {
        for layout in [LayoutKind::RightJustified, LayoutKind::Ragged] {
            run(seed, geometry(if seed % 2 == 0 { 4 } else { 0 }, layout));
        }
    }
}

#[test]
fn refused_calls_change_nothing() {
    let g = geometry(4, LayoutKind::RightJustified);
    let mut rng = Rng::new(7);
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = model_of(&g);
    let kind = |r: Result<(), latent_cache::CacheError>| r.unwrap_err().kind;

    // Vectors of different lengths for the same rows.
    assert_eq!(kind(cache.prefill_prepare(Some(&[3, 2]), None, Some(&[0, 1, 0]))), ErrorKind::InvalidArgument);
    assert!(!cache.in_prefill());
    cache.prefill_prepare(Some(&[3, 1]), None, Some(&[0, 1])).unwrap();
    assert_eq!(kind(cache.prefill_prepare(None, None, None)), ErrorKind::State, "a second prepare");
    assert_eq!(kind(cache.spec_round_begin()), ErrorKind::State, "a round inside a prefill");
    let mut other = LatentCache::new(g).unwrap();
    other.append_host(1, 1, &rng.floats(8), &rng.floats(4), Some(&rng.floats(4))).unwrap();
    assert_eq!(kind(cache.merge_rows(&[&other])), ErrorKind::State, "a merge into a cache in a prefill");
    append(&mut rng, &mut cache, &mut model, 2, 3, None);
    // Row 1 declared 1 position plus 1 of padding, but 3 were appended: finalize refuses
    // and the engine may still trim to match.
    let before_offsets = cache.row_offsets();
    assert_eq!(kind(cache.prefill_finalize()), ErrorKind::InvalidArgument);
    assert!(cache.in_prefill());
    assert_eq!(cache.row_offsets(), before_offsets);
    assert_matches(&cache, &model, "refused finalize");
    cache.reset();
    assert!(!cache.in_prefill(), "reset closes a prefill");

    // Left padding only on an empty cache; right padding beyond a row's positions.
    model = model_of(&g);
    append(&mut rng, &mut cache, &mut model, 2, 2, None);
    assert_eq!(kind(cache.prefill_prepare(None, Some(&[1, 0]), None)), ErrorKind::State);
    cache.prefill_prepare(None, None, Some(&[4, 0])).unwrap();
    append(&mut rng, &mut cache, &mut model, 2, 1, None);
    assert_eq!(kind(cache.prefill_finalize()), ErrorKind::OutOfRange);
    assert_matches(&cache, &model, "refused finalize (padding beyond the row)");
    cache.reset();
    model = model_of(&g);
    append(&mut rng, &mut cache, &mut model, 2, 2, None);
    cache.prefill_finalize().unwrap();
    assert_matches(&cache, &model, "a finalize without a prefill does nothing");
}

/// A set prepares and finalizes every layer together, through the C ABI.
#[test]
fn a_set_prefills_all_layers_together() {
    let mut configs = [latent_cache_config_default(), latent_cache_config_default()];
    for (i, c) in configs.iter_mut().enumerate() {
        c.kv_lora_rank = 8;
        c.rope_head_dim = 4;
        c.index_head_dim = if i == 0 { 4 } else { 0 };
    }
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), 2, &mut set) }, Status::Ok);
    let (lengths, right) = ([2usize, 4], [2usize, 0]);
    let status = unsafe { latent_cache_set_prefill_prepare(set, lengths.as_ptr(), std::ptr::null(), right.as_ptr(), 2) };
    assert_eq!(status, Status::Ok);
    let mut rng = Rng::new(3);
    let mut layers = [std::ptr::null_mut(); 2];
    let mut models = Vec::new();
    for (i, layer) in layers.iter_mut().enumerate() {
        assert_eq!(unsafe { latent_cache_set_layer(set, i, layer) }, Status::Ok);
        let mut model = Model::new([8, 4, if i == 0 { 4 } else { 0 }]);
        let data = host_data(&mut rng, model.widths, 2, 4);
        assert_eq!(append_host(*layer, 2, 4, &data), Status::Ok, "{}", last_error());
        model.append(2, 4, &data);
        models.push(model);
    }
    assert_eq!(unsafe { latent_cache_set_prefill_finalize(set) }, Status::Ok, "{}", last_error());
    for (layer, model) in layers.iter().zip(&mut models) {
        drop_right(model, &right);
        assert_equal(*layer, model, "set finalize");
    }
    unsafe { latent_cache_set_free(set) };
}
