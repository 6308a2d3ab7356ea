//! The model-level set through the C ABI, as an engine drives it: per-layer appends through the
//! lent layer handles, set-wide trims, rounds, row operations and reservations checked against
//! one reference model per layer; a failure on any layer (or layers that disagree) changes no
//! layer; lent handles cannot be freed alone and die with their set; GLM-5.2's preset.
use crate::common::check::{append_host, assert_equal, host_data, last_error};
use crate::common::model::{Model, Rng};
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::{latent_cache_config, latent_cache_config_default};
use latent_cache::ffi::presets::*;
use latent_cache::ffi::query::*;
use latent_cache::ffi::role::latent_cache_role;
use latent_cache::ffi::set::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

/// Four small layers: two plain, one with index keys (and a position limit), and an MTP layer.
fn configs() -> Vec<latent_cache_config> {
    let layer = |index, max_tokens, role: latent_cache_role| {
        let mut cfg = latent_cache_config_default();
        (cfg.kv_lora_rank, cfg.rope_head_dim, cfg.index_head_dim, cfg.max_tokens) = (8, 4, index, max_tokens);
        cfg.role = role as u32;
        cfg
    };
    vec![
        layer(0, 0, latent_cache_role::Target),
        layer(6, 500, latent_cache_role::Target),
        layer(0, 0, latent_cache_role::Target),
        layer(0, 0, latent_cache_role::Mtp),
    ]
}

struct Model4 {
    set: *mut latent_cache_set,
    layers: Vec<*mut Handle>,
    models: Vec<Model>,
}

impl Model4 {
    fn new() -> Model4 {
        let cfgs = configs();
        let mut set = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), cfgs.len(), &mut set) }, Status::Ok, "{}", last_error());
        let layers = (0..cfgs.len())
            .map(|i| {
                let mut layer = std::ptr::null_mut();
                assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut layer) }, Status::Ok);
                layer
            })
            .collect();
        let models = cfgs.iter().map(|c| Model::new([c.kv_lora_rank, c.rope_head_dim, c.index_head_dim])).collect();
        Model4 { set, layers, models }
    }

    /// One forward: every layer appends `tokens` positions to every row.
    fn forward(&mut self, rng: &mut Rng, batch: usize, tokens: usize) {
        for (layer, model) in self.layers.iter().zip(self.models.iter_mut()) {
            let data = host_data(rng, model.widths, batch, tokens);
            assert_eq!(append_host(*layer, batch, tokens, &data), Status::Ok, "{}", last_error());
            model.append(batch, tokens, &data);
        }
    }

    fn check(&self, what: &str) {
        for (i, (layer, model)) in self.layers.iter().zip(&self.models).enumerate() {
            assert_equal(*layer, model, &format!("layer {i} after {what}"));
        }
    }

    fn bytes_in_use(&self) -> usize {
        let mut bytes = 0;
        assert_eq!(unsafe { latent_cache_set_bytes_in_use(self.set, &mut bytes) }, Status::Ok);
        bytes
    }
}

#[test]
fn set_wide_operations_move_every_layer_together() {
    let mut rng = Rng::new(31);
    let mut m = Model4::new();
    let mut count = 0;
    assert_eq!(unsafe { latent_cache_set_layer_count(m.set, &mut count) }, Status::Ok);
    assert_eq!(count, 4);
    m.forward(&mut rng, 3, 7);
    m.check("a forward");

    assert_eq!(unsafe { latent_cache_set_trim(m.set, 2, false) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.trim(2));
    m.check("a set-wide trim");

    assert_eq!(unsafe { latent_cache_set_spec_round_begin(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(Model::begin);
    m.forward(&mut rng, 3, 4);
    let keep = [4, 1, 2];
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback_rows(m.set, keep.as_ptr(), 3) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.rollback(&keep));
    m.check("an uneven set-wide rollback");

    assert_eq!(unsafe { latent_cache_set_spec_round_begin(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(Model::begin);
    m.forward(&mut rng, 3, 2);
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback(m.set, 1) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.rollback(&[1, 1, 1]));
    assert_eq!(unsafe { latent_cache_set_spec_round_begin(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(Model::begin);
    m.forward(&mut rng, 3, 1);
    assert_eq!(unsafe { latent_cache_set_spec_round_commit(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.round = None);
    m.check("set-wide rounds");

    let before = m.bytes_in_use();
    assert_eq!(unsafe { latent_cache_set_reserve(m.set, 400) }, Status::Ok);
    assert!(m.bytes_in_use() > before, "a reservation holds more");
    let rows = [2, 0];
    assert_eq!(unsafe { latent_cache_set_filter_rows(m.set, rows.as_ptr(), 2) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.filter(&rows));
    m.check("a set-wide filter");

    // A row as its own set, then merged back after the running rows.
    let mut single = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_extract_row(m.set, 1, &mut single) }, Status::Ok, "{}", last_error());
    let mut merged = std::ptr::null_mut();
    let cfgs = configs();
    assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), cfgs.len(), &mut merged) }, Status::Ok);
    let sources = [m.set.cast_const(), single.cast_const()];
    assert_eq!(unsafe { latent_cache_set_merge_rows(merged, sources.as_ptr(), 2) }, Status::Ok, "{}", last_error());
    for i in 0..4 {
        let (mut layer, mut one) = (std::ptr::null_mut(), std::ptr::null_mut());
        assert_eq!(unsafe { latent_cache_set_layer(merged, i, &mut layer) }, Status::Ok);
        assert_eq!(unsafe { latent_cache_set_layer(single, i, &mut one) }, Status::Ok);
        let extracted = m.models[i].extract(1);
        assert_equal(one, &extracted, &format!("layer {i} of the extracted row"));
        assert_equal(layer, &Model::merge(&[&m.models[i], &extracted]), &format!("layer {i} of the merged set"));
    }

    assert_eq!(unsafe { latent_cache_set_reset(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(|model| *model = model.empty_like());
    m.check("a set-wide reset");
    unsafe {
        latent_cache_set_free(single);
        latent_cache_set_free(merged);
        latent_cache_set_free(m.set);
    }
}

#[test]
fn a_failure_on_any_layer_changes_no_layer() {
    let mut rng = Rng::new(32);
    let mut m = Model4::new();
    m.forward(&mut rng, 2, 5);
    let held = m.bytes_in_use();
    // Layer 1 may hold 500 positions: a reservation of 600 fits every other layer.
    assert_eq!(unsafe { latent_cache_set_reserve(m.set, 600) }, Status::Capacity);
    assert!(last_error().starts_with("layer 1: "), "{}", last_error());
    assert_eq!(m.bytes_in_use(), held, "no layer reserved");
    // A keep count beyond what the rows appended: refused on the first layer, nothing changed.
    assert_eq!(unsafe { latent_cache_set_spec_round_begin(m.set) }, Status::Ok);
    m.models.iter_mut().for_each(Model::begin);
    m.forward(&mut rng, 2, 2);
    let keep = [1, 3];
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback_rows(m.set, keep.as_ptr(), 2) }, Status::OutOfRange);
    m.check("a refused rollback");
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback(m.set, 0) }, Status::Ok);
    m.models.iter_mut().for_each(|model| model.rollback(&[0, 0]));

    // One layer driven alone: the layers disagree, set-wide calls say so and change nothing.
    assert_eq!(unsafe { latent_cache_trim(m.layers[2], 1, false) }, Status::Ok);
    m.models[2].trim(1);
    assert_eq!(unsafe { latent_cache_set_trim(m.set, 1, false) }, Status::InvalidState);
    assert!(last_error().contains("layer 2"), "{}", last_error());
    assert_eq!(unsafe { latent_cache_set_spec_round_begin(m.set) }, Status::InvalidState);
    m.check("refused calls on disagreeing layers");
    unsafe { latent_cache_set_free(m.set) };
}

#[test]
fn lent_layers_belong_to_their_set() {
    let mut rng = Rng::new(33);
    let mut m = Model4::new();
    m.forward(&mut rng, 1, 3);
    // Freeing a lent layer does nothing but say so.
    unsafe { latent_cache_free(m.layers[0]) };
    assert!(last_error().contains("layer of a latent_cache_set"), "{}", last_error());
    m.check("a refused free of a lent layer");
    let mut layer = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(m.set, 4, &mut layer) }, Status::OutOfRange);
    assert!(layer.is_null());
    unsafe { latent_cache_set_free(m.set) };
    // The set's layers die with it; the set handle too (and a second free touches nothing).
    let mut offset = 0;
    assert_eq!(unsafe { latent_cache_offset(m.layers[0], &mut offset) }, Status::NullArgument);
    assert_eq!(unsafe { latent_cache_set_trim(m.set, 0, false) }, Status::NullArgument);
    unsafe { latent_cache_set_free(m.set) };
    assert!(last_error().contains("not a live latent_cache_set"), "{}", last_error());
}

#[test]
fn glm52_preset_is_the_model_with_its_mtp_layer() {
    let mut configs = vec![latent_cache_config_default(); 79];
    let mut written = 0;
    assert_eq!(unsafe { latent_cache_glm52_configs(configs.as_mut_ptr(), 78, &mut written) }, Status::BufferTooSmall);
    assert_eq!(unsafe { latent_cache_glm52_configs(configs.as_mut_ptr(), 79, &mut written) }, Status::Ok);
    assert_eq!(written, 79);
    // GLM-5.2's config.json (`indexer_types`): 1 = the layer runs the DSA indexer ("full").
    let indexer_types: [u8; 78] = [
        1, 1, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0,
        0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0, 1, 0, 0, 0,
    ];
    for (l, &full) in indexer_types.iter().enumerate() {
        assert_eq!(configs[l].index_head_dim, if full == 1 { 128 } else { 0 }, "layer {l}: index keys where the indexer runs");
    }
    assert_eq!(configs.iter().filter(|c| c.index_head_dim == 128).count(), 21);
    // Each layer attends with its own selection where it runs the indexer, else the nearest
    // indexer layer's before it.
    let mut sources = vec![usize::MAX; 78];
    assert_eq!(unsafe { latent_cache_glm52_selection_sources(sources.as_mut_ptr(), 77, &mut written) }, Status::BufferTooSmall);
    assert_eq!(unsafe { latent_cache_glm52_selection_sources(sources.as_mut_ptr(), 78, &mut written) }, Status::Ok);
    assert_eq!(written, 78);
    let mut last_full = 0;
    for (l, &full) in indexer_types.iter().enumerate() {
        if full == 1 {
            last_full = l;
        }
        assert_eq!(sources[l], last_full, "layer {l}");
    }
    assert!(configs.iter().all(|c| c.kv_lora_rank == 512 && c.rope_head_dim == 64));
    assert_eq!(configs[78].role, latent_cache_role::Mtp as u32);
    assert_eq!(configs[78].index_head_dim, 0);
    assert!(configs[..78].iter().all(|c| c.role == latent_cache_role::Target as u32));
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), 79, &mut set) }, Status::Ok, "{}", last_error());
    let mut bytes = 0;
    let per_token: usize = (0..79)
        .map(|i| {
            let mut layer = std::ptr::null_mut();
            assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut layer) }, Status::Ok);
            assert_eq!(unsafe { latent_cache_bytes_per_token(layer, &mut bytes) }, Status::Ok);
            bytes
        })
        .sum();
    assert_eq!(per_token, 190_464 + (512 + 64) * 4, "the model's 78 layers plus the MTP layer");
    // A refused layer config names the layer.
    configs[5].rope_storage = 9;
    let mut other = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), 79, &mut other) }, Status::InvalidArgument);
    assert!(last_error().starts_with("layers[5]: "), "{}", last_error());
    assert!(other.is_null());
    unsafe { latent_cache_set_free(set) };
}

/// Prefill maintenance set-wide, as an engine drives a chunked prefill of a model whose layers
/// are composed (and one that is not): boundaries follow every layer's rows at every chunk, and
/// the seed's protocol is checked on every layer alike (misuse changes no layer).
#[test]
fn prefill_maintenance_moves_every_layer_together() {
    use latent_cache::ffi::storage::latent_cache_storage as S;
    let layer = |hot_window: usize| {
        let mut cfg = latent_cache_config_default();
        (cfg.kv_lora_rank, cfg.rope_head_dim, cfg.index_head_dim) = (64, 8, 0);
        cfg.latent_storage = S::Q8 as u32;
        cfg.rope_storage = S::Bf16 as u32;
        cfg.hot_window = hot_window;
        cfg
    };
    let cfgs = [layer(10), layer(100), layer(0)];
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), cfgs.len(), &mut set) }, Status::Ok);
    let layers: Vec<*mut Handle> = (0..3)
        .map(|i| {
            let mut h = std::ptr::null_mut();
            assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut h) }, Status::Ok);
            h
        })
        .collect();
    let converted = |h: *mut Handle| {
        let (mut out, mut n) = ([0usize; 4], 0);
        assert_eq!(unsafe { latent_cache_converted_positions(h, out.as_mut_ptr(), out.len(), &mut n) }, Status::Ok);
        out[..n].to_vec()
    };
    assert_eq!(unsafe { latent_cache_set_prefill_end(set) }, Status::InvalidState);
    assert!(!last_error().is_empty());
    assert_eq!(unsafe { latent_cache_set_prefill_begin(set) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_set_prefill_begin(set) }, Status::InvalidState);
    let mut rng = Rng::new(4);
    for _ in 0..3 {
        for &h in &layers {
            let data = host_data(&mut rng, [64, 8, 0], 2, 100);
            assert_eq!(append_host(h, 2, 100, &data), Status::Ok);
        }
    }
    assert_eq!(converted(layers[0]), vec![256, 256]);
    assert_eq!(converted(layers[1]), vec![192, 192]);
    // Row 2 does not exist: refused on every layer.
    assert_eq!(unsafe { latent_cache_set_prefill_commit(set, [0usize, 2].as_ptr(), 2) }, Status::OutOfRange);
    assert_eq!(unsafe { latent_cache_set_prefill_commit(set, [1usize].as_ptr(), 1) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_set_prefill_end(set) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_set_prefill_commit(set, [1usize].as_ptr(), 1) }, Status::InvalidState);
    assert_eq!(converted(layers[0]), vec![256, 256]);
    assert_eq!(converted(layers[1]), vec![192, 192]);
    assert!(converted(layers[2]).is_empty());
    unsafe { latent_cache_set_free(set) };
}
