//! A handle freed on one thread while calls on it are in flight on others is not a
//! use-after-free: the call inside the handle (held at the evaluation lock by an engine lock the
//! test controls) and the call waiting for the handle each complete or are refused, and a cache
//! created meanwhile (which may get the freed memory) is untouched by them. (Its own test
//! binary: it installs a process-wide evaluation lock. The library takes that lock on its
//! evaluation thread, so while the gate holds it no other evaluation runs: the new cache is
//! made meanwhile, which evaluates nothing, and filled once the gate opens.)
mod common;

use std::ffi::c_void;
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};
use std::thread;
use std::time::Duration;

use latent_cache::ffi::cache::*;
use latent_cache::ffi::eval_lock::latent_cache_set_eval_lock;
use latent_cache::ffi::query::latent_cache_offset;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};

use common::check::{append_host, assert_equal, host_data, last_error, new_cache, Shared};
use common::model::{Model, Rng};

const WIDTHS: [usize; 3] = [8, 4, 3];

/// The engine's evaluation lock: a plain lock, except that while `gated` is set the next
/// evaluation stops at its door until the gate opens (its caller is then inside a call,
/// holding the handle).
struct Gate {
    state: Mutex<GateState>,
    changed: Condvar,
}

struct GateState {
    held: bool,
    gated: bool,
    gated_waiting: bool,
}

static GATE: Gate =
    Gate { state: Mutex::new(GateState { held: false, gated: false, gated_waiting: false }), changed: Condvar::new() };

unsafe extern "C" fn lock(_: *mut c_void) {
    let mut s = GATE.state.lock().unwrap();
    if s.gated {
        s.gated_waiting = true;
        GATE.changed.notify_all();
        while s.gated {
            s = GATE.changed.wait(s).unwrap();
        }
    }
    while s.held {
        s = GATE.changed.wait(s).unwrap();
    }
    s.held = true;
}

unsafe extern "C" fn unlock(_: *mut c_void) {
    GATE.state.lock().unwrap().held = false;
    GATE.changed.notify_all();
}

/// Runs `f` on a new thread; its result comes back through the returned receiver.
fn spawn<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> mpsc::Receiver<T> {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx
}

/// A hang detector only: a call on a freed handle that never returns is the failure it reports.
fn wait<T>(rx: &mpsc::Receiver<T>, what: &str) -> T {
    rx.recv_timeout(Duration::from_secs(60)).unwrap_or_else(|_| panic!("{what} never returned (deadlocked, or panicked)"))
}

fn append_one(cache: *mut Handle, rng: &mut Rng) -> (Status, String) {
    let data = host_data(rng, WIDTHS, 1, 1);
    let status = append_host(cache, 1, 1, &data);
    (status, if status == Status::Ok { String::new() } else { last_error() })
}

#[test]
fn freeing_a_handle_while_calls_on_it_are_in_flight_is_safe() {
    assert_eq!(unsafe { latent_cache_set_eval_lock(Some(lock), Some(unlock), std::ptr::null_mut()) }, Status::Ok);
    let mut rng = Rng::new(41);
    for round in 0..20 {
        let a = Shared(new_cache(WIDTHS, 0));
        assert_eq!(append_one(a.get(), &mut rng).0, Status::Ok);

        // T1 enters an append on A and stops at the evaluation lock, holding A.
        GATE.state.lock().unwrap().gated = true;
        let inside = spawn(move || append_one(a.get(), &mut Rng::new(round)));
        {
            let mut s = GATE.state.lock().unwrap();
            while !s.gated_waiting {
                s = GATE.changed.wait(s).unwrap();
            }
        }
        // T2 calls into A while T1 holds it; T3 frees A. (The pauses only make it likely that
        // T2 is waiting and the free has happened before the next step; nothing depends on it.)
        let waiting = spawn(move || append_one(a.get(), &mut Rng::new(100 + round)));
        thread::sleep(Duration::from_millis(20));
        let freed = spawn(move || unsafe { latent_cache_free(a.get()) });
        thread::sleep(Duration::from_millis(20));

        // A new cache made now may get A's memory; the calls in flight must not reach it.
        let b = new_cache(WIDTHS, 0);

        {
            let mut s = GATE.state.lock().unwrap();
            s.gated = false;
            s.gated_waiting = false;
        }
        GATE.changed.notify_all();
        let (s1, m1) = wait(&inside, "the call holding the handle");
        let (s2, m2) = wait(&waiting, "the call waiting for the handle");
        wait(&freed, "latent_cache_free");
        // Had a call on A reached B, B would hold a row already, and this append or the check
        // after it would fail.
        let mut model = Model::new(WIDTHS);
        let data = host_data(&mut rng, WIDTHS, 2, 3);
        assert_eq!(append_host(b, 2, 3, &data), Status::Ok, "{}", last_error());
        model.append(2, 3, &data);

        assert!(matches!(s1, Status::Ok | Status::NullArgument), "round {round}: call inside the freed handle: {s1:?} {m1}");
        assert!(matches!(s2, Status::Ok | Status::NullArgument), "round {round}: call waiting on the freed handle: {s2:?} {m2}");
        assert_equal(b, &model, &format!("round {round}: a cache created while calls on a freed handle were in flight"));
        let mut offset = usize::MAX;
        assert_eq!(unsafe { latent_cache_offset(a.get(), &mut offset) }, Status::NullArgument, "round {round}: freed handle");
        assert_eq!(offset, usize::MAX);
        unsafe { latent_cache_free(b) };
    }
    assert_eq!(unsafe { latent_cache_set_eval_lock(None, None, std::ptr::null_mut()) }, Status::Ok);
}
