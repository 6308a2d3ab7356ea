//! The documented way to share an evaluation lock works with a plain, non-recursive mutex: the
//! engine hands the library its lock, evaluates its own graphs (here: the views the library
//! returned) under it, and calls the library without holding it. Four engine threads do that
//! while the library evaluates internally (host appends and reads); the lock is an
//! error-checking one that records any re-entry or foreign unlock instead of deadlocking.
//! Values are checked against the reference model. (Its own test binary: the lock is
//! process-wide.)
mod common;

use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::eval_lock::latent_cache_set_eval_lock;
use latent_cache::ffi::latent_cache_status as Status;
use mlx_rs::Array;
use mlx_sys::mlx_array;

use common::check::{append_host, assert_equal, host_array, host_data, last_error, new_cache, Shared};
use common::model::{Model, Rng};

/// A non-recursive, error-checking mutex: the owner's thread id, 0 when free.
struct ErrorCheckingLock {
    owner: AtomicU64,
    acquired: AtomicUsize,
    misuse: AtomicUsize,
}

fn thread_id() -> u64 {
    thread_local! { static ID: u64 = NEXT.fetch_add(1, Ordering::Relaxed); }
    static NEXT: AtomicU64 = AtomicU64::new(1);
    ID.with(|id| *id)
}

static LOCK: ErrorCheckingLock =
    ErrorCheckingLock { owner: AtomicU64::new(0), acquired: AtomicUsize::new(0), misuse: AtomicUsize::new(0) };

impl ErrorCheckingLock {
    fn lock(&self) {
        let me = thread_id();
        if self.owner.load(Ordering::Acquire) == me {
            // A plain mutex would deadlock here; record it and carry on as the owner.
            self.misuse.fetch_add(1, Ordering::Relaxed);
            return;
        }
        while self.owner.compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed).is_err() {
            std::thread::yield_now();
        }
        self.acquired.fetch_add(1, Ordering::Relaxed);
    }

    fn unlock(&self) {
        if self.owner.compare_exchange(thread_id(), 0, Ordering::Release, Ordering::Relaxed).is_err() {
            self.misuse.fetch_add(1, Ordering::Relaxed);
        }
    }
}

unsafe extern "C" fn lock(_: *mut c_void) {
    LOCK.lock();
}

unsafe extern "C" fn unlock(_: *mut c_void) {
    LOCK.unlock();
}

const WIDTHS: [usize; 3] = [8, 4, 3];

#[test]
fn a_non_recursive_engine_lock_used_as_documented_never_deadlocks() {
    assert_eq!(unsafe { latent_cache_set_eval_lock(Some(lock), Some(unlock), std::ptr::null_mut()) }, Status::Ok);
    let engines: Vec<_> = (0..4u64)
        .map(|seed| {
            std::thread::spawn(move || {
                let mut rng = Rng::new(seed);
                let cache = Shared(new_cache(WIDTHS, 0));
                let mut model = Model::new(WIDTHS);
                for _ in 0..20 {
                    // The library's host path evaluates inside the call: the engine does not hold its lock.
                    let data = host_data(&mut rng, WIDTHS, 1, 2);
                    assert_eq!(append_host(cache.get(), 1, 2, &data), Status::Ok, "append_host: {}", last_error());
                    model.append(1, 2, &data);

                    // The MLX-array path: append lazily, then the engine evaluates the views itself,
                    // under its own lock, as it evaluates its forward pass.
                    let data = host_data(&mut rng, WIDTHS, 1, 1);
                    let inputs: Vec<mlx_array> = (0..3).map(|f| host_array(&data[f], 1, WIDTHS[f])).collect();
                    let mut views = [mlx_array { ctx: std::ptr::null_mut() }; 3];
                    let [l, r, k] = &mut views;
                    let status = unsafe { latent_cache_append_latent(cache.get(), inputs[0], inputs[1], inputs[2], l, r, k) };
                    assert_eq!(status, Status::Ok, "append_latent: {}", last_error());
                    model.append(1, 1, &data);
                    inputs.into_iter().for_each(|a| unsafe { latent_cache_array_free(a) });
                    {
                        let owned: Vec<Array> = views.iter().map(|&v| unsafe { Array::from_ptr(v) }).collect();
                        LOCK.lock();
                        mlx_rs::transforms::eval(owned.iter()).expect("the engine's own evaluation");
                        LOCK.unlock();
                    }
                    assert_equal(cache.get(), &model, "after the engine's own evaluation");
                }
                unsafe { latent_cache_free(cache.get()) };
            })
        })
        .collect();
    engines.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(unsafe { latent_cache_set_eval_lock(None, None, std::ptr::null_mut()) }, Status::Ok);
    assert_eq!(LOCK.misuse.load(Ordering::Relaxed), 0, "the library re-entered or released the engine's lock");
    assert!(LOCK.acquired.load(Ordering::Relaxed) >= 4 * 20 * 2, "the library and the engine both took the lock");
}
