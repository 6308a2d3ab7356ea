//! What an engine ported from the seed's implementation relies on, through the C ABI: the
//! signature strings its predicates compare, the MTP role, and the accounting calls
//! (`byte_length`, `projected_bytes`) against the reference model's row lengths.
use crate::common::check::{append_host, host_data, last_error};
use crate::common::model::{Model, Rng};
use latent_cache::ffi::cache::*;
use latent_cache::ffi::config::{latent_cache_config, latent_cache_config_default, latent_cache_projected_bytes};
use latent_cache::ffi::layout::latent_cache_layout;
use latent_cache::ffi::query::*;
use latent_cache::ffi::role::latent_cache_role;
use latent_cache::ffi::rows::latent_cache_merge_rows;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::storage::latent_cache_storage as S;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

fn config(index_head_dim: usize) -> latent_cache_config {
    let mut cfg = latent_cache_config_default();
    cfg.index_head_dim = index_head_dim;
    cfg
}

fn new(cfg: &latent_cache_config) -> Result<*mut Handle, (Status, String)> {
    let mut cache = std::ptr::null_mut();
    match unsafe { latent_cache_new(cfg, &mut cache) } {
        Status::Ok => Ok(cache),
        status => Err((status, last_error())),
    }
}

fn signature(cfg: &latent_cache_config) -> String {
    let cache = new(cfg).unwrap();
    let mut buf = vec![0 as std::ffi::c_char; 256];
    let mut written = 0;
    assert_eq!(unsafe { latent_cache_signature(cache, buf.as_mut_ptr(), buf.len(), &mut written) }, Status::Ok);
    unsafe { latent_cache_free(cache) };
    let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_str().unwrap().to_string();
    assert_eq!(s.len(), written);
    s
}

#[test]
fn signatures_are_the_seeds_strings() {
    assert_eq!(signature(&config(0)), "kv:mla:target");
    assert_eq!(signature(&config(128)), "kv:mla:target:dsa");
    let mut mtp = config(0);
    mtp.role = latent_cache_role::Mtp as u32;
    assert_eq!(signature(&mtp), "kv:mla:mtp");
    // Compact storage wraps the kind; the index keys' mode counts only where there are some.
    let mut q8 = config(128);
    (q8.latent_storage, q8.rope_storage, q8.index_storage) = (S::Q8 as u32, S::Bf16 as u32, S::Fp8 as u32);
    assert_eq!(signature(&q8), "kv:mla-storage:q8-bf16-fp8:kv:mla:target:dsa");
    let mut plain_bf16 = config(0);
    (plain_bf16.latent_storage, plain_bf16.index_storage) = (S::Bf16 as u32, S::Q8 as u32);
    assert_eq!(signature(&plain_bf16), "kv:mla-storage:bf16-f32:kv:mla:target");
    let mut ragged = mtp;
    ragged.layout = latent_cache_layout::Ragged as u32;
    assert_eq!(signature(&ragged), "kv:ragged:kv:mla:mtp");
    ragged.latent_storage = S::Q4 as u32;
    assert_eq!(signature(&ragged), "kv:ragged:kv:mla-storage:q4-f32:kv:mla:mtp");
    // Widths are not in the string: the getters have them.
    let mut narrow = config(0);
    narrow.kv_lora_rank = 256;
    assert_eq!(signature(&narrow), "kv:mla:target");
}

#[test]
fn the_mtp_role_is_checked_and_never_merges_with_targets() {
    let mut mtp = config(128);
    mtp.role = latent_cache_role::Mtp as u32;
    let (status, message) = new(&mtp).unwrap_err();
    assert_eq!(status, Status::InvalidArgument);
    assert!(message.contains("MTP"), "{message}");
    let mut unknown = config(0);
    unknown.role = 2;
    assert_eq!(new(&unknown).unwrap_err().0, Status::InvalidArgument);

    // Same widths, different roles: refused, nothing changed. Same for a different limit.
    mtp.index_head_dim = 0;
    let mut rng = Rng::new(4);
    let widths = [512, 64, 0];
    let (target, mtp_cache) = (new(&config(0)).unwrap(), new(&mtp).unwrap());
    for cache in [target, mtp_cache] {
        assert_eq!(append_host(cache, 1, 3, &host_data(&mut rng, widths, 1, 3)), Status::Ok);
    }
    let destination = new(&config(0)).unwrap();
    let sources = [target.cast_const(), mtp_cache.cast_const()];
    assert_eq!(unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 2) }, Status::InvalidArgument);
    assert!(last_error().contains("kv:mla:mtp"), "{}", last_error());
    let mut limited = config(0);
    limited.max_tokens = 4096;
    let limited = new(&limited).unwrap();
    assert_eq!(append_host(limited, 1, 3, &host_data(&mut rng, widths, 1, 3)), Status::Ok);
    let sources = [target.cast_const(), limited.cast_const()];
    assert_eq!(unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 2) }, Status::InvalidArgument);
    assert!(last_error().contains("max_tokens 4096"), "{}", last_error());
    let mut batch = 7;
    assert_eq!(unsafe { latent_cache_batch_size(destination, &mut batch) }, Status::Ok);
    assert_eq!(batch, 0);
    for cache in [target, mtp_cache, limited, destination] {
        unsafe { latent_cache_free(cache) };
    }
}

fn byte_length(cache: *mut Handle) -> usize {
    let mut out = usize::MAX;
    assert_eq!(unsafe { latent_cache_byte_length(cache, &mut out) }, Status::Ok);
    out
}

#[test]
fn byte_length_counts_valid_positions_and_projected_bytes_admits_requests() {
    let widths = [512, 64, 128];
    let per_token = (512 + 64 + 128) * 4;
    let cache = new(&config(128)).unwrap();
    let mut model = Model::new(widths);
    let mut rng = Rng::new(9);
    assert_eq!(byte_length(cache), 0);
    let data = host_data(&mut rng, widths, 3, 5);
    assert_eq!(append_host(cache, 3, 5, &data), Status::Ok);
    model.append(3, 5, &data);
    assert_eq!(unsafe { latent_cache_spec_round_begin(cache) }, Status::Ok);
    model.begin();
    let data = host_data(&mut rng, widths, 3, 4);
    assert_eq!(append_host(cache, 3, 4, &data), Status::Ok);
    model.append(3, 4, &data);
    let keep = [4, 1, 0];
    assert_eq!(unsafe { latent_cache_spec_round_rollback_rows(cache, keep.as_ptr(), 3) }, Status::Ok);
    model.rollback(&keep);
    // Rows of 9, 6 and 5 positions: padding (the shorter rows' left_pad) is not state.
    assert_eq!(byte_length(cache), model.row_offsets().iter().sum::<usize>() * per_token);
    assert_eq!(byte_length(cache), 20 * per_token);
    unsafe { latent_cache_free(cache) };

    let mut projected = 0;
    let cfg = config(128);
    assert_eq!(unsafe { latent_cache_projected_bytes(&cfg, 8, 131_072, &mut projected) }, Status::Ok);
    assert_eq!(projected, 8 * 131_072 * per_token);
    let mut q8 = config(128);
    (q8.latent_storage, q8.rope_storage, q8.index_storage) = (S::Q8 as u32, S::Bf16 as u32, S::Q8 as u32);
    assert_eq!(unsafe { latent_cache_projected_bytes(&q8, 1, 1000, &mut projected) }, Status::Ok);
    assert_eq!(projected, 1000 * (544 + 128 + 136));
    let mut bad = config(128);
    bad.rope_storage = S::Fp8 as u32;
    assert_eq!(unsafe { latent_cache_projected_bytes(&bad, 1, 1, &mut projected) }, Status::InvalidArgument);
    assert_eq!(unsafe { latent_cache_projected_bytes(&cfg, usize::MAX, 2, &mut projected) }, Status::Capacity);
    assert_eq!(unsafe { latent_cache_projected_bytes(std::ptr::null(), 1, 1, &mut projected) }, Status::NullArgument);
    assert_eq!(projected, 1000 * (544 + 128 + 136), "refused calls write nothing");
}

/// A config field the header calls ignored accepts any value: `hot_storage` while `hot_window`
/// is 0, `index_storage` on a layer without index keys (one naming no mode reads back as `F32`,
/// 0); where they apply the same values are refused.
#[test]
fn ignored_storage_fields_accept_any_value() {
    use latent_cache::ffi::config::latent_cache_get_config;
    let mut cfg = config(0);
    (cfg.hot_storage, cfg.index_storage) = (9, 9);
    let cache = new(&cfg).unwrap_or_else(|(status, e)| panic!("ignored fields refused: {status:?} {e}"));
    let mut back = config(128);
    assert_eq!(unsafe { latent_cache_get_config(cache, &mut back) }, Status::Ok);
    assert_eq!((back.hot_storage, back.index_storage, back.hot_window, back.index_head_dim), (0, 0, 0, 0));
    unsafe { latent_cache_free(cache) };
    let mut bytes = 0;
    assert_eq!(unsafe { latent_cache_projected_bytes(&cfg, 1, 1, &mut bytes) }, Status::Ok);

    let mut composed = cfg;
    (composed.latent_storage, composed.hot_window) = (S::Q8 as u32, 64);
    assert_eq!(new(&composed).map(|_| ()).unwrap_err().0, Status::InvalidArgument, "hot_storage applies");
    let mut keyed = cfg;
    keyed.index_head_dim = 128;
    assert_eq!(new(&keyed).map(|_| ()).unwrap_err().0, Status::InvalidArgument, "index_storage applies");
}
