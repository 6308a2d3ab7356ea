//! How `latent_cache_config` grows without breaking programs: `struct_size` names the caller's
//! version of the struct. A program built against a newer header (modelled here as this
//! library's config followed by fields it does not know) works while it leaves those fields 0
//! and is refused, with nothing created, when it sets one; outputs fill the caller's whole
//! struct; arrays of configs use the caller's stride; sizes no header declares are refused.
use crate::common::check::last_error;
use latent_cache::ffi::cache::{latent_cache_free, latent_cache_new};
use latent_cache::ffi::config::*;
use latent_cache::ffi::presets::*;
use latent_cache::ffi::set::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

/// A config as a newer header would declare it: today's fields, then four more.
#[repr(C)]
#[derive(Clone, Copy)]
struct Newer {
    base: latent_cache_config,
    added: [u64; 4],
}

const SIZE: usize = std::mem::size_of::<latent_cache_config>();
const NEWER: usize = std::mem::size_of::<Newer>();

fn newer() -> Newer {
    let mut config = Newer { base: latent_cache_config_default(), added: [0xAB; 4] };
    // What a newer header's inline default does: init with its own size.
    assert_eq!(unsafe { latent_cache_config_init(&mut config.base, NEWER) }, Status::Ok, "{}", last_error());
    config
}

fn new(config: *const latent_cache_config) -> (Status, *mut Handle) {
    let mut cache = std::ptr::null_mut();
    (unsafe { latent_cache_new(config, &mut cache) }, cache)
}

fn same_geometry(a: &latent_cache_config, b: &latent_cache_config) -> bool {
    (a.kv_lora_rank, a.rope_head_dim, a.index_head_dim, a.max_tokens, a.latent_storage, a.rope_storage)
        == (b.kv_lora_rank, b.rope_head_dim, b.index_head_dim, b.max_tokens, b.latent_storage, b.rope_storage)
        && (a.index_storage, a.layout, a.role, a.hot_storage, a.hot_window)
            == (b.index_storage, b.layout, b.role, b.hot_storage, b.hot_window)
}

#[test]
fn the_default_names_its_size_and_init_fills_a_newer_struct_with_zeros() {
    assert_eq!(latent_cache_config_default().struct_size, SIZE);
    let config = newer();
    assert_eq!(config.base.struct_size, NEWER);
    assert_eq!(config.added, [0; 4], "fields the library does not know are set to their default, 0");
    assert!(same_geometry(&config.base, &latent_cache_config_default()));
    assert_eq!((config.base.kv_lora_rank, config.base.rope_head_dim, config.base.index_head_dim), (512, 64, 128));
}

#[test]
fn a_newer_config_works_while_its_new_fields_are_zero() {
    let mut config = newer();
    config.base.index_head_dim = 0;
    let (status, cache) = new(&config.base);
    assert_eq!(status, Status::Ok, "{}", last_error());
    // Read back into a newer struct whose tail holds garbage: the library zeroes what it does
    // not know and reports the caller's size.
    let mut out = Newer { base: latent_cache_config_default(), added: [7; 4] };
    assert_eq!(unsafe { latent_cache_get_config_sized(cache, &mut out.base, NEWER) }, Status::Ok);
    assert_eq!((out.base.struct_size, out.added), (NEWER, [0; 4]));
    assert!(same_geometry(&out.base, &config.base));
    unsafe { latent_cache_free(cache) };

    config.added[2] = 1;
    let (status, cache) = new(&config.base);
    assert_eq!(status, Status::InvalidArgument);
    assert!(cache.is_null(), "nothing is created");
    let message = last_error();
    assert!(message.contains(&format!("byte {}", SIZE + 16)), "the message names the first unknown byte set: {message}");
}

#[test]
fn sizes_no_header_declares_are_refused() {
    for bad in [8, SIZE - 8, SIZE + 3, 1 << 40, usize::MAX] {
        let mut config = latent_cache_config_default();
        config.struct_size = bad;
        let (status, cache) = new(&config);
        assert_eq!(status, Status::InvalidArgument, "struct_size {bad}");
        assert!(cache.is_null());
        assert!(last_error().contains("struct_size"), "{}", last_error());
        let mut out = latent_cache_config_default();
        out.kv_lora_rank = 3;
        assert_eq!(unsafe { latent_cache_config_init(&mut out, bad) }, Status::InvalidArgument);
        assert_eq!(out.kv_lora_rank, 3, "nothing is written on failure");
    }
    // 0 is this version's size (a zero-initialized struct whose fields were then set).
    let mut config = latent_cache_config_default();
    config.struct_size = 0;
    let (status, cache) = new(&config);
    assert_eq!(status, Status::Ok, "{}", last_error());
    unsafe { latent_cache_free(cache) };
}

#[test]
fn arrays_of_configs_use_the_callers_stride() {
    // A set from newer configs: layer i gets index_head_dim 0 on odd layers.
    let mut layers: Vec<Newer> = (0..5).map(|_| newer()).collect();
    for (i, layer) in layers.iter_mut().enumerate() {
        layer.base.index_head_dim = if i % 2 == 1 { 0 } else { 128 };
        layer.base.max_tokens = 1000 + i;
    }
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(&layers[0].base, layers.len(), &mut set) }, Status::Ok, "{}", last_error());
    for (i, layer) in layers.iter().enumerate() {
        let mut cache = std::ptr::null_mut();
        assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut cache) }, Status::Ok);
        let mut out = latent_cache_config_default();
        assert_eq!(unsafe { latent_cache_get_config(cache, &mut out) }, Status::Ok);
        assert!(same_geometry(&out, &layer.base), "layer {i}");
    }
    unsafe { latent_cache_set_free(set) };

    // Configs of one array from two headers: refused, nothing created.
    layers[3].base.struct_size = SIZE;
    let mut set = std::ptr::null_mut();
    assert_eq!(unsafe { latent_cache_set_new(&layers[0].base, layers.len(), &mut set) }, Status::InvalidArgument);
    assert!(set.is_null());
    assert!(last_error().contains("layers[3]"), "{}", last_error());

    // The model's preset written at a newer stride matches the one at this version's.
    let mut ours = vec![latent_cache_config_default(); 79];
    let mut wide: Vec<Newer> = (0..79).map(|_| Newer { base: latent_cache_config_default(), added: [9; 4] }).collect();
    let (mut n, mut m) = (0, 0);
    assert_eq!(unsafe { latent_cache_glm52_configs(ours.as_mut_ptr(), ours.len(), &mut n) }, Status::Ok);
    assert_eq!(unsafe { latent_cache_glm52_configs_sized(&mut wide[0].base, wide.len(), NEWER, &mut m) }, Status::Ok);
    assert_eq!((n, m), (79, 79));
    for (i, (a, b)) in ours.iter().zip(&wide).enumerate() {
        assert!(same_geometry(a, &b.base), "layer {i}");
        assert_eq!((a.struct_size, b.base.struct_size, b.added), (SIZE, NEWER, [0; 4]), "layer {i}");
    }
    let dsa = ours.iter().filter(|c| c.index_head_dim == 128).count();
    assert_eq!(dsa, 21, "index keys on 21 of the 78 target layers");
}
