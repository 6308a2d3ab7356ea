//! Short-lived threads calling the library leave nothing running behind them: after 1,000
//! threads (spawned and joined a few at a time) each append, read and trim, on their own handle
//! and on a shared one, the process has at most a few more OS threads than after a warm-up call,
//! and the shared cache equals the reference model. (Its own test binary: it counts the
//! process's threads, which Linux and macOS let it count; on other platforms it is empty.)
#![cfg(any(target_os = "linux", target_os = "macos"))]
mod common;

use std::sync::Mutex;

use latent_cache::ffi::cache::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

use common::check::{append_host, assert_equal, host_data, last_error, new_cache, Shared};
use common::model::{Model, Rng};

const WIDTHS: [usize; 3] = [8, 4, 3];
const THREADS: usize = 1000;
const AT_ONCE: usize = 4;
/// Threads the library may keep for itself after the warm-up (pools, a few lazily made streams).
const SLACK: usize = 8;

#[cfg(target_os = "linux")]
fn os_threads() -> usize {
    std::fs::read_dir("/proc/self/task").expect("/proc/self/task").count()
}

#[cfg(target_os = "macos")]
fn os_threads() -> usize {
    // The kernel's task info for this process: its thread count (what `ps -M` lists).
    let mut info: libc::proc_taskinfo = unsafe { std::mem::zeroed() };
    let size = std::mem::size_of::<libc::proc_taskinfo>() as libc::c_int;
    let pid = unsafe { libc::getpid() };
    let got = unsafe { libc::proc_pidinfo(pid, libc::PROC_PIDTASKINFO, 0, (&mut info as *mut libc::proc_taskinfo).cast(), size) };
    assert_eq!(got, size, "proc_pidinfo(PROC_PIDTASKINFO)");
    info.pti_threadnum as usize
}

/// One append of one position to a one-row cache, a read of the row, and a trim of that
/// position; `model` follows along.
fn append_read_trim(cache: *mut Handle, model: &mut Model, rng: &mut Rng, what: &str) {
    let batch = model.rows.len().max(1);
    let data = host_data(rng, WIDTHS, batch, 2);
    assert_eq!(append_host(cache, batch, 2, &data), Status::Ok, "append_host ({what}): {}", last_error());
    model.append(batch, 2, &data);
    assert_equal(cache, model, what);
    assert_eq!(unsafe { latent_cache_trim(cache, 1, false) }, Status::Ok, "trim ({what}): {}", last_error());
    model.trim(1);
}

#[test]
fn short_lived_threads_leave_no_os_threads_behind() {
    let shared = Shared(new_cache(WIDTHS, 0));
    let state = Mutex::new((Model::new(WIDTHS), Rng::new(11)));
    {
        // Warm-up on this thread: the library's and MLX's one-time setup happens here.
        let (model, rng) = &mut *state.lock().unwrap();
        append_read_trim(shared.get(), model, rng, "warm-up");
        let own = new_cache(WIDTHS, 0);
        append_read_trim(own, &mut Model::new(WIDTHS), rng, "warm-up, own handle");
        unsafe { latent_cache_free(own) };
    }
    let baseline = os_threads();

    for round in 0..THREADS / AT_ONCE {
        std::thread::scope(|scope| {
            for t in 0..AT_ONCE {
                let state = &state;
                scope.spawn(move || {
                    let n = round * AT_ONCE + t;
                    let mut rng = Rng::new(1000 + n as u64);
                    if n % 2 == 0 {
                        let own = new_cache(WIDTHS, 0);
                        append_read_trim(own, &mut Model::new(WIDTHS), &mut rng, &format!("thread {n}, own handle"));
                        unsafe { latent_cache_free(own) };
                    } else {
                        let (model, rng) = &mut *state.lock().unwrap();
                        append_read_trim(shared.get(), model, rng, &format!("thread {n}, shared handle"));
                    }
                });
            }
        });
    }

    let after = os_threads();
    let (model, _) = &*state.lock().unwrap();
    assert_equal(shared.get(), model, "1,000 short-lived threads");
    unsafe { latent_cache_free(shared.get()) };
    assert!(
        after <= baseline + SLACK,
        "{after} OS threads after {THREADS} short-lived threads used the library (baseline {baseline}, allowed {SLACK} more)"
    );
}
