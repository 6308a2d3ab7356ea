//! Random operation sequences against the reference model, through the Rust API: after every
//! step each row's values, row_offsets, left_pad, offset and batch_size equal the model exactly.
use crate::common::core_check::{assert_matches, model_of, widths};
use crate::common::mlx_helpers::geometry as geometry_of;
use crate::common::model::{Model, Rng};
use latent_cache::core::persist;
use latent_cache::{Geometry, LatentCache, LayoutKind, StorageMode};

fn geometry(index_head_dim: usize) -> Geometry {
    geometry_of([8, 4, index_head_dim], LayoutKind::RightJustified)
}

fn ragged(g: Geometry) -> Geometry {
    Geometry { layout: LayoutKind::Ragged, ..g }
}

fn random_append(rng: &mut Rng, cache: &mut LatentCache, model: &mut Model, batch: usize) -> String {
    let tokens = if rng.range(0, 3) == 0 { rng.range(1, 40) } else { rng.range(1, 4) };
    let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * model.widths[f]));
    let keys = (model.widths[2] > 0).then_some(data[2].as_slice());
    cache.append_host(batch, tokens, &data[0], &data[1], keys).unwrap();
    model.append(batch, tokens, &data);
    format!("append {batch}x{tokens}")
}

fn run_sequence(seed: u64, g: Geometry, steps: usize) {
    let mut rng = Rng::new(seed);
    let batch = rng.range(1, 8);
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = model_of(&g);
    let mut batch_now = batch;
    if rng.range(0, 1) == 0 {
        // A padded batched prefill first: prompts of different lengths, the longest unpadded.
        let tokens = rng.range(1, 12);
        let mut pads: Vec<usize> = (0..batch).map(|_| rng.range(0, tokens)).collect();
        pads[rng.range(0, batch - 1)] = 0;
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(batch * tokens * model.widths[f]));
        let keys = (model.widths[2] > 0).then_some(data[2].as_slice());
        cache.append_host_padded(batch, tokens, &pads, &data[0], &data[1], keys).unwrap();
        model.append_padded(batch, tokens, &pads, &data);
        assert_matches(&cache, &model, &format!("padded append {pads:?}, seed {seed}"));
    }
    for i in 0..steps {
        let step = match rng.range(0, 9) {
            0..=3 => random_append(&mut rng, &mut cache, &mut model, batch_now),
            4 => {
                // Inside a round only what every row appended in it may go (a rollback must
                // restore what the rows held before the round).
                let shortest = match model.round {
                    Some(_) => (0..model.rows.len()).map(|r| model.appended_in_round(r)).min().unwrap_or(0),
                    None => model.row_offsets().into_iter().min().unwrap_or(0),
                };
                let n = rng.range(0, shortest);
                let bypass = model.round.is_some();
                cache.trim(n, bypass).unwrap();
                model.trim(n);
                format!("trim {n}")
            }
            5 if model.round.is_none() => {
                cache.spec_round_begin().unwrap();
                model.begin();
                "begin".into()
            }
            5 | 6 if model.round.is_some() => {
                if rng.range(0, 3) == 0 {
                    cache.spec_round_commit().unwrap();
                    model.round = None;
                    "commit".into()
                } else {
                    let keep: Vec<usize> = if rng.range(0, 1) == 0 {
                        let min = (0..model.rows.len()).map(|r| model.appended_in_round(r)).min().unwrap_or(0);
                        vec![rng.range(0, min); model.rows.len()]
                    } else {
                        (0..model.rows.len()).map(|r| rng.range(0, model.appended_in_round(r))).collect()
                    };
                    cache.spec_round_rollback(&keep).unwrap();
                    model.rollback(&keep);
                    format!("rollback {keep:?}")
                }
            }
            7 if model.round.is_none() && model.rows.len() > 1 => {
                let mut keep: Vec<usize> = (0..model.rows.len()).filter(|_| rng.range(0, 2) > 0).collect();
                if keep.is_empty() {
                    keep.push(rng.range(0, model.rows.len() - 1));
                }
                if rng.range(0, 1) == 0 {
                    keep.reverse();
                }
                cache.filter_rows(&keep).unwrap();
                model.filter(&keep);
                batch_now = keep.len();
                format!("filter {keep:?}")
            }
            8 if model.round.is_none() && !model.rows.is_empty() && model.rows.len() < 8 => {
                // A new request joins: prefill it alone, then merge it after the running rows.
                let mut joiner = LatentCache::new(g).unwrap();
                let mut joiner_model = model_of(&g);
                random_append(&mut rng, &mut joiner, &mut joiner_model, 1);
                // Into a new cache, or into the running one (a join: into a free slot when a
                // row left or rows were reserved, else the batch is rebuilt).
                let how = rng.range(0, 2);
                if how == 2 {
                    cache.reserve_rows(model.rows.len() + rng.range(1, 3)).unwrap();
                    assert_matches(&cache, &model, "reserve_rows changes no value");
                }
                if how == 0 {
                    let mut merged = LatentCache::new(g).unwrap();
                    merged.merge_rows(&[&cache, &joiner]).unwrap();
                    cache = merged;
                } else {
                    cache.merge_rows(&[&joiner]).unwrap();
                }
                assert_matches(&joiner, &joiner_model, "joiner unchanged by merge");
                model = Model::merge(&[&model, &joiner_model]);
                batch_now = model.rows.len();
                ["merge", "join", "join after reserve_rows"][how].into()
            }
            9 if !model.rows.is_empty() => {
                let row = rng.range(0, model.rows.len() - 1);
                let extracted = cache.extract_row(row).unwrap();
                assert_matches(&extracted, &model.extract(row), "extract");
                format!("extract {row}")
            }
            _ => random_append(&mut rng, &mut cache, &mut model, batch_now),
        };
        assert_matches(&cache, &model, &format!("step {i} ({step}), seed {seed}"));
        if i % 10 == 9 && cache.check_saveable().is_ok() {
            // Saved and loaded, the rows read the same (buffers with spare slots, or whose rows
            // start past their first position, save only what the rows hold).
            let bytes = persist::save_to_bytes(&[&cache]).unwrap();
            let loaded = persist::load_from_bytes(&bytes).unwrap();
            assert_matches(&loaded[0], &model, &format!("loaded after step {i}, seed {seed}"));
        }
    }
}

#[test]
fn random_sequences_match_the_model_on_dsa_layers() {
    for seed in 1..=12 {
        run_sequence(seed, geometry(6), 60);
    }
}

#[test]
fn random_sequences_match_the_model_on_plain_layers() {
    for seed in 100..=105 {
        run_sequence(seed, geometry(0), 60);
    }
}

#[test]
fn random_sequences_match_the_model_in_the_ragged_layout() {
    for seed in 300..=311 {
        run_sequence(seed, ragged(geometry(6)), 60);
    }
    for seed in 320..=323 {
        run_sequence(seed, ragged(geometry(0)), 60);
    }
}

/// The same random sequences (appends, trims, rounds uniform and per row, filters, merges,
/// extracts) with every storage mode, on widths every mode can hold (FP8 needs 128).
#[test]
fn random_sequences_match_the_model_in_every_storage_mode() {
    use StorageMode::*;
    for (i, (latent, rope, index)) in
        [(Bf16, Bf16, Bf16), (F16, F16, F16), (Q8, Bf16, Q8), (Q4, Q4, Q4), (Fp8, Bf16, Fp8), (Q4, F32, Fp8)]
            .into_iter()
            .enumerate()
    {
        let g = Geometry {
            kv_lora_rank: 256,
            rope_head_dim: 64,
            index_head_dim: 128,
            latent_storage: latent,
            rope_storage: rope,
            index_storage: index,
            ..Geometry::default()
        };
        for seed in 0..3 {
            run_sequence(200 + 10 * i as u64 + seed, g, 40);
        }
        run_sequence(400 + i as u64, ragged(g), 40);
    }
}

#[test]
fn growth_past_many_capacity_steps_keeps_every_position() {
    let g = geometry(2);
    let mut cache = LatentCache::new(g).unwrap();
    let mut model = Model::new(widths(&g));
    let mut rng = Rng::new(7);
    while model.offset() < 3000 {
        let tokens = rng.range(100, 700);
        let data: [Vec<f32>; 3] = std::array::from_fn(|f| rng.floats(2 * tokens * model.widths[f]));
        cache.append_host(2, tokens, &data[0], &data[1], Some(&data[2])).unwrap();
        model.append(2, tokens, &data);
    }
    assert_matches(&cache, &model, "growth");
}

#[test]
fn views_have_the_documented_shapes() {
    let g = geometry(6);
    let mut cache = LatentCache::new(g).unwrap();
    // Before the first append: empty views with the family widths, batch 0.
    assert_eq!(cache.stored_index_keys().unwrap().shape(), &[0, 0, 6]);
    let state = cache.state().unwrap();
    assert_eq!(state.latent.shape(), &[0, 0, 8]);
    assert_eq!(state.rope.shape(), &[0, 0, 4]);
    let input = |w: i32| mlx_rs::Array::from_slice(&vec![1f32; (3 * 2 * w) as usize], &[3, 2, w]);
    let views = cache.append_latent(&input(8), &input(4), Some(&input(6))).unwrap();
    assert_eq!(views.latent.shape(), &[3, 2, 8]);
    assert_eq!(views.rope.shape(), &[3, 2, 4]);
    assert_eq!(views.index_keys.as_ref().unwrap().shape(), &[3, 2, 6]);
    drop(views);
    // stored_index_keys is what the next append will follow: [B, T, index_head_dim].
    assert_eq!(cache.stored_index_keys().unwrap().shape(), &[3, 2, 6]);
    cache.trim(1, false).unwrap();
    assert_eq!(cache.state().unwrap().latent.shape(), &[3, 1, 8]);
    assert_eq!(cache.batch_size(), 3, "trim keeps the batch");
    cache.reset();
    assert_eq!(cache.batch_size(), 0);
    assert_eq!(cache.geometry(), &g, "reset keeps the geometry");

    // A layer without DSA has no index keys to read.
    let plain = LatentCache::new(geometry(0)).unwrap();
    assert_eq!(plain.stored_index_keys().unwrap_err().kind, latent_cache::ErrorKind::InvalidArgument);
    assert!(plain.state().unwrap().index_keys.is_none());
}
