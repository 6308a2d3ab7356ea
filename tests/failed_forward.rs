//! What an engine meets when memory runs out, checked against the reference model: a forward
//! refused at a middle layer (an append over MLX's memory limit) and the set-wide ways back
//! from it (`latent_cache_set_recover` outside a round, the round's rollback inside one); with
//! MLX's limit raised to SIZE_MAX, reserves the machine cannot hold are CAPACITY, not a crash;
//! forks and attaches of more rows than the process can hold are CAPACITY, with nothing made;
//! a segment's header reads under any limit. (Its own test binary, one test: the memory limit
//! is process-wide.)
mod common;

use std::panic::{catch_unwind, AssertUnwindSafe};

use latent_cache::ffi::cache::{latent_cache_free, latent_cache_reserve};
use latent_cache::ffi::memory::{latent_cache_memory, latent_cache_memory_info, latent_cache_set_memory_limit};
use latent_cache::ffi::prefix::{
    latent_cache_attach_prefix, latent_cache_fork_row, latent_cache_prefix_free, latent_cache_share_prefix,
};
use latent_cache::ffi::rows::latent_cache_reserve_rows;
use latent_cache::ffi::segment::{
    latent_cache_segment_info, latent_cache_segment_read_info, latent_cache_set_load_segments, latent_cache_set_save_segment,
};
use latent_cache::ffi::set::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

use common::check::{append_host, assert_equal, filled, host_data, last_error, new_cache};
use common::model::{Model, Rng};

const WIDTHS: [usize; 3] = [64, 16, 32];
const GLM: [usize; 3] = [512, 64, 128];
const LAYERS: usize = 4;

fn memory() -> latent_cache_memory {
    let mut out = latent_cache_memory { active: 0, cache: 0, peak: 0, limit: 0 };
    assert_eq!(unsafe { latent_cache_memory_info(&mut out) }, Status::Ok);
    out
}

fn set_limit(bytes: usize) {
    assert_eq!(unsafe { latent_cache_set_memory_limit(bytes, std::ptr::null_mut()) }, Status::Ok);
}

fn layer(set: *mut latent_cache_set, i: usize) -> *mut Handle {
    let mut cache = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut cache) }, Status::Ok);
    cache
}

fn new_set(layers: usize) -> *mut latent_cache_set {
    let configs: Vec<_> = (0..layers)
        .map(|_| {
            let mut c = latent_cache::ffi::config::latent_cache_config_default();
            (c.kv_lora_rank, c.rope_head_dim, c.index_head_dim) = (WIDTHS[0], WIDTHS[1], WIDTHS[2]);
            c
        })
        .collect();
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(configs.as_ptr(), layers, &mut set) }, Status::Ok);
    set
}

/// Appends `tokens` positions to every row of layer `l` (`models[l]` follows on success).
fn append_layer(set: *mut latent_cache_set, models: &mut [Model], l: usize, tokens: usize, rng: &mut Rng) -> Status {
    let batch = models[l].rows.len().max(1);
    let data = host_data(rng, WIDTHS, batch, tokens);
    let status = append_host(layer(set, l), batch, tokens, &data);
    if status == Status::Ok {
        models[l].append(batch, tokens, &data);
    }
    status
}

fn assert_layers(set: *mut latent_cache_set, models: &[Model], what: &str) {
    for (l, model) in models.iter().enumerate() {
        assert_equal(layer(set, l), model, &format!("layer {l}, {what}"));
    }
}

/// A forward of `tokens` over every layer, refused at layer 2: MLX's limit is set to what is
/// active once layers 0 and 1 appended, so layer 2's growth cannot be allocated.
fn forward_refused_at_layer_2(set: *mut latent_cache_set, models: &mut [Model], tokens: usize, rng: &mut Rng) {
    let limit = memory().limit;
    for l in 0..2 {
        assert_eq!(append_layer(set, models, l, tokens, rng), Status::Ok, "layer {l}: {}", last_error());
    }
    set_limit(memory().active);
    let status = append_layer(set, models, 2, tokens, rng);
    set_limit(limit);
    assert_eq!(status, Status::Capacity, "layer 2's append under the limit: {}", last_error());
    assert_layers(set, models, "the refused forward");
}

fn forward_recovers() {
    let mut rng = Rng::new(31);
    let set = new_set(LAYERS);
    let mut models: Vec<Model> = (0..LAYERS).map(|_| Model::new(WIDTHS)).collect();
    for l in 0..LAYERS {
        assert_eq!(append_layer(set, &mut models, l, 10, &mut rng), Status::Ok);
    }
    // Outside a round: layers 0-1 hold 310 positions, 2-3 hold 10; set-wide calls are refused.
    forward_refused_at_layer_2(set, &mut models, 300, &mut rng);
    assert_eq!(unsafe { latent_cache_set_trim(set, 1, false) }, Status::InvalidState);
    let mut dropped = 0;
    assert_eq!(unsafe { latent_cache_set_recover(set, &mut dropped) }, Status::Ok, "{}", last_error());
    assert_eq!(dropped, 300);
    models[0].trim(300);
    models[1].trim(300);
    assert_layers(set, &models, "recover");
    assert_eq!(unsafe { latent_cache_set_recover(set, &mut dropped) }, Status::Ok);
    assert_eq!(dropped, 0, "layers that agree drop nothing");
    // The set works again: a whole forward, then a set-wide trim.
    for l in 0..LAYERS {
        assert_eq!(append_layer(set, &mut models, l, 3, &mut rng), Status::Ok);
    }
    assert_eq!(unsafe { latent_cache_set_trim(set, 1, false) }, Status::Ok, "{}", last_error());
    models.iter_mut().for_each(|m| m.trim(1));
    assert_layers(set, &models, "a forward and a trim after recover");
    // Inside a round: the rollback brings every layer back to the round's start.
    assert_eq!(unsafe { latent_cache_set_spec_round_begin(set) }, Status::Ok);
    models.iter_mut().for_each(Model::begin);
    forward_refused_at_layer_2(set, &mut models, 400, &mut rng);
    assert_eq!(unsafe { latent_cache_set_spec_round_commit(set) }, Status::InvalidState);
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback(set, 1) }, Status::OutOfRange, "layer 2 appended nothing");
    assert_layers(set, &models, "a refused rollback");
    assert_eq!(unsafe { latent_cache_set_spec_round_rollback(set, 0) }, Status::Ok, "{}", last_error());
    for model in models.iter_mut() {
        let rows = model.rows.len();
        model.rollback(&vec![0; rows]);
    }
    assert_layers(set, &models, "the round's rollback");
    unsafe { latent_cache_set_free(set) };
}

fn allocations_past_the_machine() {
    let mut rng = Rng::new(5);
    let (cache, model) = filled(GLM, 2, 40, &mut rng);
    let limit = memory().limit;
    set_limit(usize::MAX);
    let reserve = unsafe { latent_cache_reserve(cache, i32::MAX as usize) };
    let rows = unsafe { latent_cache_reserve_rows(cache, i32::MAX as usize) };
    set_limit(limit);
    assert_eq!(reserve, Status::Capacity, "reserve(INT32_MAX) under a SIZE_MAX limit: {}", last_error());
    assert!(matches!(rows, Status::Capacity | Status::InvalidArgument), "reserve_rows(INT32_MAX): {rows:?}");
    assert_equal(cache, &model, "refused reserves");
    // Forks and attaches of rows the process cannot hold: CAPACITY, nothing made.
    for n in [i32::MAX as usize, 100_000_000] {
        assert_eq!(unsafe { latent_cache_fork_row(cache, 0, n) }, Status::Capacity, "fork into {n}: {}", last_error());
        assert_equal(cache, &model, "a refused fork");
    }
    let mut prefix = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_share_prefix(cache, 1, 40, &mut prefix) }, Status::Ok);
    let empty = new_cache(GLM, 0);
    assert_eq!(unsafe { latent_cache_attach_prefix(empty, prefix, i32::MAX as usize) }, Status::Capacity);
    assert_equal(empty, &Model::new(GLM), "a refused attach");
    assert_eq!(unsafe { latent_cache_attach_prefix(empty, prefix, 3) }, Status::Ok, "{}", last_error());
    unsafe {
        latent_cache_prefix_free(prefix);
        latent_cache_free(empty);
        latent_cache_free(cache);
    }
}

fn header_reads_under_any_limit() {
    let mut rng = Rng::new(9);
    let set = new_set(1);
    let mut models = vec![Model::new(WIDTHS)];
    assert_eq!(append_layer(set, &mut models, 0, 50, &mut rng), Status::Ok);
    let path = std::env::temp_dir().join(format!("latent-cache-failed-forward-{}.seg", std::process::id()));
    let c_path = std::ffi::CString::new(path.to_str().unwrap()).unwrap();
    let rc = unsafe { latent_cache_set_save_segment(set, 0, 0, 50, std::ptr::null(), 0, c_path.as_ptr(), std::ptr::null_mut()) };
    assert_eq!(rc, Status::Ok);
    let limit = memory().limit;
    set_limit(memory().active);
    let mut info = latent_cache_segment_info::default();
    let read = unsafe { latent_cache_segment_read_info(c_path.as_ptr(), &mut info, std::ptr::null_mut(), 0) };
    let mut loaded = std::ptr::null_mut();
    let load = unsafe { latent_cache_set_load_segments(&c_path.as_ptr(), 1, &mut loaded) };
    set_limit(limit);
    assert_eq!((read, info.from, info.to), (Status::Ok, 0, 50), "a header read under a low limit");
    assert_eq!(load, Status::Capacity, "the segment's tensors under a low limit");
    std::fs::remove_file(&path).unwrap();
    unsafe { latent_cache_set_free(set) };
}

#[test]
fn memory_running_out_is_a_status_and_a_set_recovers() {
    let default_limit = memory().limit;
    let mut failures = Vec::new();
    let parts: [(&str, fn()); 3] = [
        ("forward_recovers", forward_recovers),
        ("allocations_past_the_machine", allocations_past_the_machine),
        ("header_reads_under_any_limit", header_reads_under_any_limit),
    ];
    for (name, f) in parts {
        eprintln!("failed_forward: {name}");
        if let Err(panic) = catch_unwind(AssertUnwindSafe(f)) {
            let message = panic.downcast_ref::<String>().cloned().or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()));
            failures.push(format!("{name}: {}", message.unwrap_or_default()));
        }
        set_limit(default_limit);
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
