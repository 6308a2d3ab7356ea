//! Short-lived caller threads ending while another thread's call evaluates: the engine's thread
//! pool retiring workers, or a Swift task's thread going away. A thread that evaluates MLX work
//! holds MLX state of its own, and on MLX's CUDA backend ending such a thread broke the CUDA
//! graph another thread was capturing (the process aborted). The library evaluates on a thread
//! of its own, so caller threads may come and go. Checked here through the C ABI against the
//! reference model: one long-lived thread appends and attends over its cache while, beside it,
//! threads are started, call the library on caches of their own, and end. (Its own test
//! binary: its threads' MLX state and ends are the process's, which other tests' threads would
//! share.)
mod common;

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use common::attention_ref::{attention, visible};
use common::check::{append_host, assert_equal, host_array_shaped, host_data, last_error, new_cache, Shared};
use common::model::{Model, Rng};
use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::latent_cache_free;
use latent_cache::ffi::donor::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_sys::mlx_array;

const WIDTHS: [usize; 3] = [64, 16, 0];
const HEADS: usize = 4;

fn ok(status: Status, what: &str) {
    assert_eq!(status, Status::Ok, "{what}: {}", last_error());
}

/// The absorbed attention of one query per head over row 0 of `cache`, checked against float64
/// over the row the model says it holds.
fn attend_and_check(cache: *mut Handle, model: &Model, rng: &mut Rng, what: &str) {
    let (r, p) = (WIDTHS[0], WIDTHS[1]);
    // Queries small enough that the scores stay near 1 over values of up to 8192, so no single
    // position dominates and the check sees every position's weight.
    let small = |v: Vec<f32>| v.into_iter().map(|x| x * 1e-8).collect::<Vec<f32>>();
    let (q_latent, q_rope) = (small(rng.floats(HEADS * r)), small(rng.floats(HEADS * p)));
    let scale = 0.05;
    let mut donor = std::ptr::null_mut();
    ok(unsafe { latent_cache_capture_donor_rows(cache, &mut donor) }, "capture_donor_rows");
    let (ql, qr) = (host_array_shaped(&q_latent, &[1, HEADS, 1, r]), host_array_shaped(&q_rope, &[1, HEADS, 1, p]));
    let mut out = mlx_array { ctx: std::ptr::null_mut() };
    let none = mlx_array { ctx: std::ptr::null_mut() };
    ok(unsafe { latent_cache_donor_attend(donor, ql, qr, scale, 0, none, &mut out) }, "donor_attend");
    let mut got = vec![0f32; HEADS * r];
    let mut written = 0;
    ok(unsafe { latent_cache_array_to_host(out, got.as_mut_ptr(), got.len(), &mut written) }, "array_to_host");
    unsafe {
        [ql, qr, out].into_iter().for_each(|a| latent_cache_array_free(a));
        latent_cache_donor_free(donor);
    }
    assert_eq!(written, HEADS * r);
    let row = &model.rows[0].families;
    let len = model.len(0);
    let largest = row[0].iter().fold(0f64, |m, &v| m.max(v.abs() as f64));
    for h in 0..HEADS {
        let (ql, qr) = (&q_latent[h * r..][..r], &q_rope[h * p..][..p]);
        let want = attention(&row[0], &row[1], ql, qr, scale as f64, &visible(len, 1, 0, false), |_| 0.0);
        for (c, &want) in want.iter().enumerate() {
            // float32 here; TF32 matmuls (10-bit mantissas) on CUDA.
            let diff = (got[h * r + c] as f64 - want).abs();
            assert!(diff <= 5e-3 * largest, "{what}: head {h} column {c}: {} against {want}", got[h * r + c]);
        }
    }
}

#[test]
fn caller_threads_end_while_another_thread_evaluates() {
    let done = Arc::new(AtomicBool::new(false));
    let ended = Arc::new(AtomicUsize::new(0));
    let side = {
        let (done, ended) = (done.clone(), ended.clone());
        std::thread::spawn(move || {
            let mut n = 0u64;
            while !done.load(Ordering::Acquire) {
                n += 1;
                std::thread::spawn(move || {
                    let mut rng = Rng::new(1000 + n);
                    let cache = new_cache(WIDTHS, 0);
                    let mut model = Model::new(WIDTHS);
                    let data = host_data(&mut rng, WIDTHS, 1, 3);
                    ok(append_host(cache, 1, 3, &data), "append_host on a short-lived thread");
                    model.append(1, 3, &data);
                    assert_equal(cache, &model, "a short-lived thread's cache");
                    attend_and_check(cache, &model, &mut rng, "a short-lived thread's attention");
                    unsafe { latent_cache_free(cache) };
                })
                .join()
                .expect("a short-lived thread");
                ended.fetch_add(1, Ordering::Release);
            }
        })
    };

    let mut rng = Rng::new(7);
    let cache = Shared(new_cache(WIDTHS, 0));
    let mut model = Model::new(WIDTHS);
    let mut steps = 0;
    // At least 200 steps, and at least 100 threads ended beside them.
    while steps < 200 || ended.load(Ordering::Acquire) < 100 {
        let data = host_data(&mut rng, WIDTHS, 1, 1);
        ok(append_host(cache.get(), 1, 1, &data), "append_host on the long-lived thread");
        model.append(1, 1, &data);
        attend_and_check(cache.get(), &model, &mut rng, &format!("step {steps}"));
        steps += 1;
    }
    done.store(true, Ordering::Release);
    side.join().expect("the thread starting short-lived threads");
    assert_equal(cache.get(), &model, "the long-lived thread's cache");
    unsafe { latent_cache_free(cache.get()) };
}
