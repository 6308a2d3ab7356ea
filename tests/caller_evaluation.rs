//! `latent_cache_set_evaluation_thread(false)`: the library evaluates on the calling thread
//! instead of its own. Then an array an engine built on its own thread's stream and left
//! unevaluated is evaluated by that thread's calls (and refused, with nothing changed, on any
//! other thread), as the header says; turned back on, even the owner's calls refuse it. (Its
//! own test binary: the setting is process-wide.)
mod common;

use std::sync::mpsc;

use common::check::{append_host, assert_equal, host_data, last_error, new_cache, Shared};
use common::model::{Model, Rng};
use latent_cache::ffi::arrays::{latent_cache_append_latent, latent_cache_array_free};
use latent_cache::ffi::cache::latent_cache_free;
use latent_cache::ffi::eval_lock::latent_cache_set_evaluation_thread;
use latent_cache::ffi::latent_cache_status as Status;
use latent_cache::ffi::query::latent_cache_offset;
use mlx_sys::mlx_array;

const WIDTHS: [usize; 3] = [8, 4, 0];

#[test]
fn the_calling_thread_evaluates_when_the_evaluation_thread_is_off() {
    latent_cache_set_evaluation_thread(false);
    let mut rng = Rng::new(3);
    let cache = Shared(new_cache(WIDTHS, 0));
    let mut model = Model::new(WIDTHS);
    let first = host_data(&mut rng, WIDTHS, 1, 2);
    assert_eq!(append_host(cache.get(), 1, 2, &first), Status::Ok, "{}", last_error());
    model.append(1, 2, &first);

    let lazy = host_data(&mut rng, WIDTHS, 1, 2);
    let (more, again) = (host_data(&mut rng, WIDTHS, 1, 1), host_data(&mut rng, WIDTHS, 1, 1));
    let (to_main, from_owner) = mpsc::channel::<()>();
    let (to_owner, from_main) = mpsc::channel::<()>();
    let owner = {
        let (lazy, more, again) = (lazy.clone(), more.clone(), again.clone());
        std::thread::spawn(move || {
            // Inputs computed lazily on this thread's own default stream (x + 0).
            let make = |f: usize| {
                let x = mlx_rs::Array::from_slice(&lazy[f], &[1, 2, WIDTHS[f] as i32]);
                mlx_rs::ops::add(&x, mlx_rs::Array::from_f32(0.0)).unwrap()
            };
            let (latent, rope) = (make(0), make(1));
            let none = mlx_array { ctx: std::ptr::null_mut() };
            let mut views = [none; 3];
            let [l, r, k] = &mut views;
            let status = unsafe { latent_cache_append_latent(cache.get(), latent.as_ptr(), rope.as_ptr(), none, l, r, k) };
            assert_eq!(status, Status::Ok, "append_latent of lazy inputs: {}", last_error());
            views.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
            to_main.send(()).unwrap();
            from_main.recv().unwrap();

            // With the evaluation thread turned back on, even the owner's call refuses them.
            latent_cache_set_evaluation_thread(true);
            let status = append_host(cache.get(), 1, 1, &again);
            assert_eq!(status, Status::Backend, "append_host on the owner, evaluation thread on: {}", last_error());
            // Off again: the owner's own call evaluates them.
            latent_cache_set_evaluation_thread(false);
            assert_eq!(append_host(cache.get(), 1, 1, &more), Status::Ok, "append_host on the owner: {}", last_error());
        })
    };
    from_owner.recv().unwrap();
    model.append(1, 2, &lazy);
    // Another thread cannot evaluate the owner's arrays: refused, nothing changed.
    let status = append_host(cache.get(), 1, 1, &more);
    assert_eq!(status, Status::Backend, "append_host on another thread: {}", last_error());
    let mut offset = 0;
    assert_eq!(unsafe { latent_cache_offset(cache.get(), &mut offset) }, Status::Ok);
    assert_eq!(offset, 4, "the refused append moved the offset");
    to_owner.send(()).unwrap();
    owner.join().expect("the owning thread");
    model.append(1, 1, &more);
    assert_equal(cache.get(), &model, "after the owner's call evaluated its inputs");
    latent_cache_set_evaluation_thread(true);
    unsafe { latent_cache_free(cache.get()) };
}
