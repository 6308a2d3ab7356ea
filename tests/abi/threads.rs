//! Threads: many threads on their own handles run mixed operations without interfering, and
//! several threads calling into one handle at once are serialized safely (the header's promise):
//! every append lands whole, none is lost, and each row ends with exactly the appended values.
use std::sync::Arc;
use std::thread;

use latent_cache::ffi::cache::*;
use latent_cache::ffi::query::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

/// A handle shared across threads; the C API documents that concurrent calls are serialized.
struct Shared(*mut Handle);
unsafe impl Send for Shared {}
unsafe impl Sync for Shared {}

const RANK: usize = 8;
const ROPE: usize = 4;

fn new_cache() -> *mut Handle {
    crate::common::check::new_cache([RANK, ROPE, 0], 0)
}

/// One position whose every channel carries `tag`, so a torn append would show mixed tags.
fn append_tagged(cache: *mut Handle, tag: f32) -> Status {
    let latent = [tag; RANK];
    let rope = [tag; ROPE];
    unsafe { latent_cache_append_host(cache, 1, 1, latent.as_ptr(), RANK, rope.as_ptr(), ROPE, std::ptr::null(), 0) }
}

fn read_latent(cache: *mut Handle) -> Vec<f32> {
    let mut offset = 0;
    assert_eq!(unsafe { latent_cache_offset(cache, &mut offset) }, Status::Ok);
    let mut out = vec![0f32; offset * RANK];
    let mut written = 0;
    let status = unsafe { latent_cache_read_row_host(cache, 0, 0, out.as_mut_ptr(), out.len(), &mut written) };
    assert_eq!(status, Status::Ok);
    out
}

#[test]
fn threads_on_their_own_handles_do_not_interfere() {
    let workers: Vec<_> = (0..8)
        .map(|t| {
            thread::spawn(move || {
                let cache = new_cache();
                let mut expected = Vec::new();
                for i in 0..150 {
                    let tag = (t * 1000 + i) as f32;
                    assert_eq!(append_tagged(cache, tag), Status::Ok);
                    expected.push(tag);
                    match i % 7 {
                        3 => {
                            assert_eq!(unsafe { latent_cache_trim(cache, 2, false) }, Status::Ok);
                            expected.truncate(expected.len() - 2);
                        }
                        5 => {
                            assert_eq!(unsafe { latent_cache_spec_round_begin(cache) }, Status::Ok);
                            assert_eq!(append_tagged(cache, -1.0), Status::Ok);
                            assert_eq!(unsafe { latent_cache_spec_round_rollback(cache, 0) }, Status::Ok);
                        }
                        _ => {}
                    }
                }
                let got = read_latent(cache);
                let want: Vec<f32> = expected.iter().flat_map(|&t| [t; RANK]).collect();
                assert_eq!(got, want, "thread {t}");
                unsafe { latent_cache_free(cache) };
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
}

#[test]
fn concurrent_calls_on_one_handle_are_serialized() {
    let cache = Arc::new(Shared(new_cache()));
    let threads = 6;
    let per_thread = 120;
    let workers: Vec<_> = (0..threads)
        .map(|t| {
            let cache = Arc::clone(&cache);
            thread::spawn(move || {
                for i in 0..per_thread {
                    assert_eq!(append_tagged(cache.0, (t * 10_000 + i) as f32), Status::Ok);
                    // Reads interleave with other threads' appends; each sees a consistent cache.
                    let mut offset = 0;
                    assert_eq!(unsafe { latent_cache_offset(cache.0, &mut offset) }, Status::Ok);
                    assert!(offset >= 1);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    let got = read_latent(cache.0);
    assert_eq!(got.len(), threads * per_thread * RANK, "every append landed");
    let mut tags: Vec<u32> = got
        .chunks(RANK)
        .map(|pos| {
            assert!(pos.iter().all(|&v| v == pos[0]), "an append was torn: {pos:?}");
            pos[0] as u32
        })
        .collect();
    // Each thread's appends appear once each, in that thread's order.
    for t in 0..threads as u32 {
        let mine: Vec<u32> = tags.iter().copied().filter(|v| v / 10_000 == t).collect();
        assert_eq!(mine, (0..per_thread as u32).map(|i| t * 10_000 + i).collect::<Vec<_>>());
    }
    tags.sort();
    tags.dedup();
    assert_eq!(tags.len(), threads * per_thread);
    unsafe { latent_cache_free(cache.0) };
}

#[test]
fn a_panic_inside_an_export_becomes_the_panic_status() {
    // Every export runs its body through this boundary (tests/abi/ffi_contract.rs proves it).
    let status = latent_cache::ffi::panic::run(|| panic!("injected failure"));
    assert_eq!(status, Status::Panic);
    let mut buf = vec![0 as std::ffi::c_char; 256];
    let len = unsafe { latent_cache::ffi::last_error::latent_cache_last_error(buf.as_mut_ptr(), buf.len()) };
    let message = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    assert!(len > 0 && message.contains("injected failure"), "{message}");
    // The library keeps working afterwards.
    let cache = new_cache();
    assert_eq!(append_tagged(cache, 1.0), Status::Ok);
    unsafe { latent_cache_free(cache) };
}
