//! An engine-provided evaluation lock wraps every evaluation the library performs, exactly once
//! each, from every thread; NULL pairs restore the library's lock; half-set pairs are refused.
//! (Its own test binary: the lock is process-wide.)
mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use latent_cache::ffi::cache::*;
use latent_cache::ffi::eval_lock::latent_cache_set_eval_lock;
use latent_cache::ffi::latent_cache_status as Status;

/// The engine's lock: a spin lock that counts acquisitions and notices overlap.
struct EngineLock {
    held: AtomicBool,
    acquired: AtomicUsize,
}

unsafe extern "C" fn lock(ctx: *mut c_void) {
    let engine = unsafe { &*(ctx as *const EngineLock) };
    while engine.held.compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed).is_err() {
        std::hint::spin_loop();
    }
    engine.acquired.fetch_add(1, Ordering::Relaxed);
}

unsafe extern "C" fn unlock(ctx: *mut c_void) {
    let engine = unsafe { &*(ctx as *const EngineLock) };
    assert!(engine.held.swap(false, Ordering::Release), "unlock without lock");
}

fn new_cache() -> *mut latent_cache::ffi::latent_cache {
    common::check::new_cache([4, 2, 0], 0)
}

fn append_one(cache: *mut latent_cache::ffi::latent_cache) {
    let (latent, rope) = ([1f32; 4], [2f32; 2]);
    let status = unsafe { latent_cache_append_host(cache, 1, 1, latent.as_ptr(), 4, rope.as_ptr(), 2, std::ptr::null(), 0) };
    assert_eq!(status, Status::Ok);
}

#[test]
fn the_engine_lock_wraps_every_evaluation() {
    static ENGINE: EngineLock = EngineLock { held: AtomicBool::new(false), acquired: AtomicUsize::new(0) };
    let ctx = &ENGINE as *const EngineLock as *mut c_void;
    assert_eq!(unsafe { latent_cache_set_eval_lock(Some(lock), None, ctx) }, Status::InvalidArgument);
    assert_eq!(unsafe { latent_cache_set_eval_lock(Some(lock), Some(unlock), ctx) }, Status::Ok);

    let threads: Vec<_> = (0..4)
        .map(|_| {
            std::thread::spawn(|| {
                let cache = new_cache();
                for _ in 0..25 {
                    append_one(cache); // one evaluation each
                }
                unsafe { latent_cache_free(cache) };
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert!(ENGINE.acquired.load(Ordering::Relaxed) >= 100, "every append's evaluation took the engine lock");
    assert!(!ENGINE.held.load(Ordering::Relaxed), "released after each evaluation");

    assert_eq!(unsafe { latent_cache_set_eval_lock(None, None, std::ptr::null_mut()) }, Status::Ok);
    let before = ENGINE.acquired.load(Ordering::Relaxed);
    let cache = new_cache();
    append_one(cache);
    assert_eq!(ENGINE.acquired.load(Ordering::Relaxed), before, "the library's own lock is back");
    unsafe { latent_cache_free(cache) };
}
