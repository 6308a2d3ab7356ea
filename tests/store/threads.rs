//! The store driven through the C API from several threads at once, as an engine does: one
//! thread decodes its own set (appends and reads, never touching the store), others put,
//! look up, restore and attach conversations through one store handle, with write-behind to a
//! folder running under them. Every restore is exact and the decoding thread's set holds what
//! it appended.
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use super::engine::{scratch, tokens, values};
use crate::common::model::Rng;

use ::latent_cache::ffi::{latent_cache as Cache, latent_cache_config, latent_cache_status};
use latent_cache::ffi::cache::{latent_cache_append_host, latent_cache_read_row_host};
use latent_cache::ffi::config::latent_cache_config_default;
use latent_cache::ffi::set::{latent_cache_set, latent_cache_set_free, latent_cache_set_layer, latent_cache_set_new};
use latent_cache::ffi::store::*;

const OK: latent_cache_status = latent_cache_status::Ok;
const W: [usize; 3] = [128, 64, 0];

fn new_set() -> *mut latent_cache_set {
    let mut cfg: latent_cache_config = latent_cache_config_default();
    (cfg.kv_lora_rank, cfg.rope_head_dim, cfg.index_head_dim) = (W[0], W[1], W[2]);
    let cfgs = [cfg, cfg];
    let mut set = null_mut();
    assert_eq!(unsafe { latent_cache_set_new(cfgs.as_ptr(), 2, &mut set) }, OK);
    set
}

fn layer(set: *mut latent_cache_set, i: usize) -> *mut Cache {
    let mut out = null_mut();
    assert_eq!(unsafe { latent_cache_set_layer(set, i, &mut out) }, OK);
    out
}

/// Appends the values of `t[from..]` to both layers.
fn append(set: *mut latent_cache_set, t: &[u32], from: usize) {
    for i in 0..2 {
        let v = values(t, from, t.len(), i, W);
        let s = unsafe {
            latent_cache_append_host(
                layer(set, i),
                1,
                t.len() - from,
                v[0].as_ptr(),
                v[0].len(),
                v[1].as_ptr(),
                v[1].len(),
                std::ptr::null(),
                0,
            )
        };
        assert_eq!(s, OK);
    }
}

/// Row `row` of both layers holds the values of `t`.
fn check(set: *mut latent_cache_set, row: usize, t: &[u32], what: &str) {
    for i in 0..2 {
        let v = values(t, 0, t.len(), i, W);
        for (f, want) in v.iter().enumerate().take(2) {
            let mut out = vec![0f32; want.len() + 1];
            let mut written = 0;
            assert_eq!(
                unsafe { latent_cache_read_row_host(layer(set, i), f as u32, row, out.as_mut_ptr(), out.len(), &mut written) },
                OK
            );
            assert_eq!(&out[..written], &want[..], "{what}: layer {i} family {f}");
        }
    }
}

#[test]
fn puts_lookups_and_restores_from_threads_while_another_decodes() {
    let dir = scratch("threads");
    let path = std::ffi::CString::new(dir.to_str().unwrap()).unwrap();
    let mut store = null_mut();
    assert_eq!(unsafe { latent_cache_store_open(path.as_ptr(), 16, 4 << 20, 64 << 20, &mut store) }, OK);
    let store_token = store as usize;
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            // The decoding thread: its own set, 300 single-position steps.
            let set = new_set();
            let t = tokens(&mut Rng::new(5), 300);
            for n in 1..=t.len() {
                append(set, &t[..n], n - 1);
            }
            check(set, 0, &t, "the decoding thread's set");
            unsafe { latent_cache_set_free(set) };
            done.store(true, Ordering::Relaxed);
        });
        for worker in 0..3u64 {
            let done = &done;
            s.spawn(move || {
                let store = store_token as *mut latent_cache_store;
                let mut rng = Rng::new(100 + worker);
                let prompt = tokens(&mut Rng::new(7), 48);
                let mut turns = 0;
                while !done.load(Ordering::Relaxed) || turns < 6 {
                    let mut t = prompt.clone();
                    let n = rng.range(1, 60);
                    t.extend(tokens(&mut rng, n));
                    let set = new_set();
                    let mut got = 0;
                    let s = match turns % 2 {
                        0 => unsafe { latent_cache_store_restore(store, set, b"ns".as_ptr(), 2, t.as_ptr(), t.len(), &mut got) },
                        _ => unsafe {
                            latent_cache_store_attach(store, set, b"ns".as_ptr(), 2, t.as_ptr(), t.len(), 1, &mut got)
                        },
                    };
                    assert_eq!(s, OK);
                    assert_eq!(got % 16, 0);
                    if got > 0 {
                        check(set, 0, &t[..got], &format!("worker {worker} turn {turns}: restored"));
                    }
                    append(set, &t, got);
                    check(set, 0, &t, &format!("worker {worker} turn {turns}: prefilled on"));
                    let mut stored = 0;
                    assert_eq!(
                        unsafe { latent_cache_store_put(store, set, 0, b"ns".as_ptr(), 2, t.as_ptr(), t.len(), &mut stored) },
                        OK
                    );
                    let mut n = 0;
                    assert_eq!(
                        unsafe { latent_cache_store_lookup(store, set, b"ns".as_ptr(), 2, t.as_ptr(), t.len(), &mut n) },
                        OK
                    );
                    assert_eq!(n, t.len() / 16 * 16, "worker {worker}: a lookup right after a put");
                    unsafe { latent_cache_set_free(set) };
                    turns += 1;
                }
            });
        }
    });
    assert_eq!(unsafe { latent_cache_store_sync(store) }, OK);
    let mut stats = latent_cache_store_stats::default();
    assert_eq!(unsafe { latent_cache_store_info(store, &mut stats) }, OK);
    assert!(stats.hits > 0 && stats.blocks_written > 0 && stats.write_failures == 0, "{stats:?}");
    unsafe { latent_cache_store_free(store) };
    let _ = std::fs::remove_dir_all(&dir);
}
