//! Handles hopping between OS threads (the header: "a handle may move between threads"): every
//! call of random operation sequences lands on a randomly chosen long-lived worker thread, the
//! views a call returns are evaluated on another one, and after every operation the cache is
//! read back on yet another and compared bit for bit with the reference model. Plus focused
//! cases: work done on a thread that has since exited reads back on the main thread, and two
//! live threads taking turns appending lazily past the library's bound on unevaluated writes.
use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;

use latent_cache::ffi::arrays::*;
use latent_cache::ffi::cache::*;
use latent_cache::ffi::query::latent_cache_offset;
use latent_cache::ffi::rows::*;
use latent_cache::ffi::spec::*;
use latent_cache::ffi::{latent_cache as Handle, latent_cache_status as Status};
use mlx_sys::mlx_array;

use crate::common::check::{append_host, assert_equal, assert_view, host_data, last_error, new_cache, Shared};
use crate::common::model::{Model, Rng};

const NULL_ARRAY: mlx_array = mlx_array { ctx: std::ptr::null_mut() };

type Job = Box<dyn FnOnce() + Send>;

/// Long-lived worker threads; `run` executes a closure on the chosen one and returns its result
/// (a panic inside is re-raised on the caller, with its message).
struct Pool {
    senders: Vec<Mutex<mpsc::Sender<Job>>>,
    threads: Vec<thread::JoinHandle<()>>,
}

impl Pool {
    fn new(n: usize) -> Pool {
        let (mut senders, mut threads) = (Vec::new(), Vec::new());
        for _ in 0..n {
            let (tx, rx) = mpsc::channel::<Job>();
            senders.push(Mutex::new(tx));
            threads.push(thread::spawn(move || {
                for job in rx {
                    job();
                }
            }));
        }
        Pool { senders, threads }
    }

    fn run<T: Send + 'static>(&self, worker: usize, f: impl FnOnce() -> T + Send + 'static) -> T {
        let (tx, rx) = mpsc::channel();
        let job: Job = Box::new(move || {
            let _ = tx.send(catch_unwind(AssertUnwindSafe(f)));
        });
        self.senders[worker].lock().unwrap().send(job).expect("worker alive");
        match rx.recv().expect("worker answered") {
            Ok(value) => value,
            Err(panic) => resume_unwind(panic),
        }
    }

    fn len(&self) -> usize {
        self.senders.len()
    }

    fn shut_down(self) {
        drop(self.senders);
        for t in self.threads {
            let _ = t.join();
        }
    }
}

/// A worker other than those in `avoid`.
fn pick(rng: &mut Rng, workers: usize, avoid: &[usize]) -> usize {
    loop {
        let w = rng.range(0, workers - 1);
        if !avoid.contains(&w) {
            return w;
        }
    }
}

fn ok(status: Status, what: &str) {
    // Runs on the thread that made the call, so the message is that call's.
    assert_eq!(status, Status::Ok, "{what}: {}", last_error());
}

/// Arrays `[batch, tokens, width]` holding `data` (index keys: a NULL array when absent).
fn arrays_from_host(data: &[Vec<f32>; 3], batch: usize, tokens: usize, widths: [usize; 3]) -> [Shared<mlx_array>; 3] {
    std::array::from_fn(|f| {
        let mut out = NULL_ARRAY;
        if widths[f] > 0 {
            let status =
                unsafe { latent_cache_array_from_host(data[f].as_ptr(), data[f].len(), batch, tokens, widths[f], &mut out) };
            ok(status, "array_from_host");
        }
        Shared(out)
    })
}

fn free_arrays(arrays: &[Shared<mlx_array>]) {
    for a in arrays {
        unsafe { latent_cache_array_free(a.0) };
    }
}

/// Evaluates `views` in one evaluation and compares each family with the model.
fn eval_and_check(views: &[Shared<mlx_array>; 3], model: &Model, what: &str) {
    let families = if model.widths[2] > 0 { 3 } else { 2 };
    let list: Vec<mlx_array> = views[..families].iter().map(|v| v.0).collect();
    ok(unsafe { latent_cache_eval(list.as_ptr(), list.len()) }, &format!("eval of views after {what}"));
    for (f, view) in views[..families].iter().enumerate() {
        assert_view(view.0, model, f, what);
    }
    if families == 2 {
        assert!(views[2].0.ctx.is_null(), "index-key view on a layer without index keys after {what}");
    }
}

struct Slot {
    cache: Shared<*mut Handle>,
    model: Model,
    rng: Rng,
    pool: Arc<Pool>,
}

impl Slot {
    fn pick(&mut self, avoid: &[usize]) -> usize {
        pick(&mut self.rng, self.pool.len(), avoid)
    }

    fn widths(&self) -> [usize; 3] {
        self.model.widths
    }

    /// Appends through `append_latent`: arrays made on one worker, appended on another, the
    /// returned views evaluated and checked on a third and freed on a fourth.
    fn append_latent(&mut self, what: &str) -> usize {
        let widths = self.widths();
        let batch = if self.model.rows.is_empty() { self.rng.range(1, 3) } else { self.model.rows.len() };
        let tokens = self.rng.range(1, 3);
        let data = host_data(&mut self.rng, widths, batch, tokens);
        let w1 = self.pick(&[]);
        let w2 = self.pick(&[w1]);
        let inputs = {
            let data = data.clone();
            self.pool.run(w1, move || arrays_from_host(&data, batch, tokens, widths))
        };
        let cache = self.cache;
        let name = what.to_string();
        let views = self.pool.run(w2, move || {
            let mut out = [NULL_ARRAY; 3];
            let [l, r, i] = &mut out;
            let status = unsafe { latent_cache_append_latent(cache.get(), inputs[0].0, inputs[1].0, inputs[2].0, l, r, i) };
            ok(status, &name);
            free_arrays(&inputs);
            out.map(Shared)
        });
        self.model.append(batch, tokens, &data);
        let w3 = self.pick(&[w2]);
        let model = self.model.clone();
        let name = what.to_string();
        self.pool.run(w3, move || eval_and_check(&views, &model, &name));
        let w4 = self.pick(&[w3]);
        self.pool.run(w4, move || free_arrays(&views));
        w2
    }

    fn state_views(&mut self, what: &str) -> usize {
        let (w1, cache, dsa) = (self.pick(&[]), self.cache, self.widths()[2] > 0);
        let name = what.to_string();
        let views = self.pool.run(w1, move || {
            let mut out = [NULL_ARRAY; 4];
            let [l, r, i, k] = &mut out;
            ok(unsafe { latent_cache_state(cache.get(), l, r, i) }, &name);
            if dsa {
                ok(unsafe { latent_cache_stored_index_keys(cache.get(), k) }, &name);
            }
            out.map(Shared)
        });
        let w2 = self.pick(&[w1]);
        let model = self.model.clone();
        let name = what.to_string();
        self.pool.run(w2, move || {
            eval_and_check(&[views[0], views[1], views[2]], &model, &name);
            if dsa {
                ok(unsafe { latent_cache_eval(&views[3].0, 1) }, &name);
                assert_view(views[3].0, &model, 2, &format!("stored_index_keys, {name}"));
            }
            free_arrays(&views);
        });
        w1
    }

    /// One random operation; returns the worker that made the operation's main call.
    fn step(&mut self, what: &str) -> usize {
        let cache = self.cache;
        let rows = self.model.rows.len();
        let in_round = self.model.round.is_some();
        let name = what.to_string();
        let mut op = self.rng.range(0, 13);
        let long = self.model.offset() > 100; // then reset, keeping the test moderate
        if long {
            op = 8;
        }
        let w = self.pick(&[]);
        match op {
            0..=2 => {
                let batch = if rows == 0 { self.rng.range(1, 3) } else { rows };
                let tokens = self.rng.range(1, 4);
                let widths = self.widths();
                let data = host_data(&mut self.rng, widths, batch, tokens);
                let d = data.clone();
                self.pool.run(w, move || ok(append_host(cache.get(), batch, tokens, &d), &name));
                self.model.append(batch, tokens, &data);
                w
            }
            3..=5 => self.append_latent(what),
            6 => self.state_views(what),
            7 => {
                // Inside a round only what every row appended in it may be trimmed.
                let shortest = match in_round {
                    true => (0..self.model.rows.len()).map(|r| self.model.appended_in_round(r)).min().unwrap_or(0),
                    false => self.model.row_offsets().into_iter().min().unwrap_or(0),
                };
                let n = self.rng.range(0, shortest);
                self.pool.run(w, move || ok(unsafe { latent_cache_trim(cache.get(), n, in_round) }, &name));
                self.model.trim(n);
                w
            }
            8 => {
                if long || self.rng.range(0, 2) == 0 {
                    self.pool.run(w, move || ok(unsafe { latent_cache_reset(cache.get()) }, &name));
                    self.model = Model::new(self.widths());
                }
                w
            }
            9 => {
                let tokens = self.model.offset() + self.rng.range(0, 300);
                self.pool.run(w, move || ok(unsafe { latent_cache_reserve(cache.get(), tokens) }, &name));
                w
            }
            10 if !in_round => {
                self.pool.run(w, move || ok(unsafe { latent_cache_spec_round_begin(cache.get()) }, &name));
                self.model.begin();
                w
            }
            10 => {
                match self.rng.range(0, 2) {
                    0 => {
                        self.pool.run(w, move || ok(unsafe { latent_cache_spec_round_commit(cache.get()) }, &name));
                        self.model.round = None;
                    }
                    1 if rows > 0 => {
                        let keep: Vec<usize> = (0..rows).map(|r| self.rng.range(0, self.model.appended_in_round(r))).collect();
                        let k = keep.clone();
                        self.pool.run(w, move || {
                            ok(unsafe { latent_cache_spec_round_rollback_rows(cache.get(), k.as_ptr(), k.len()) }, &name)
                        });
                        self.model.rollback(&keep);
                    }
                    _ => {
                        let fewest = (0..rows).map(|r| self.model.appended_in_round(r)).min().unwrap_or(0);
                        let keep = self.rng.range(0, fewest);
                        self.pool.run(w, move || ok(unsafe { latent_cache_spec_round_rollback(cache.get(), keep) }, &name));
                        self.model.rollback(&vec![keep; rows]);
                    }
                }
                w
            }
            11 if rows > 0 && !in_round => {
                let mut order: Vec<usize> = (0..rows).collect();
                for i in (1..rows).rev() {
                    order.swap(i, self.rng.range(0, i));
                }
                order.truncate(self.rng.range(1, rows));
                let k = order.clone();
                self.pool.run(w, move || ok(unsafe { latent_cache_filter_rows(cache.get(), k.as_ptr(), k.len()) }, &name));
                self.model.filter(&order);
                w
            }
            12 if rows > 0 => {
                let row = self.rng.range(0, rows - 1);
                let single = self.pool.run(w, move || {
                    let mut out = std::ptr::null_mut();
                    ok(unsafe { latent_cache_extract_row(cache.get(), row, &mut out) }, &name);
                    Shared(out)
                });
                let (w2, expected, name) = (self.pick(&[w]), self.model.extract(row), what.to_string());
                self.pool.run(w2, move || assert_equal(single.get(), &expected, &format!("extract_row {row}, {name}")));
                let w3 = self.pick(&[w2]);
                self.pool.run(w3, move || unsafe { latent_cache_free(single.get()) });
                w
            }
            13 => {
                let widths = self.widths();
                let destination = self.pool.run(w, move || Shared(new_cache(widths, 0)));
                let twice = self.rng.range(0, 1) == 1;
                let merged = if twice { Model::merge(&[&self.model, &self.model]) } else { Model::merge(&[&self.model]) };
                let w2 = self.pick(&[w]);
                self.pool.run(w2, move || {
                    let sources = [cache.get().cast_const(), cache.get().cast_const()];
                    let n = if twice { 2 } else { 1 };
                    ok(unsafe { latent_cache_merge_rows(destination.get(), sources.as_ptr(), n) }, &name);
                });
                let (w3, expected, name) = (self.pick(&[w2]), merged.clone(), what.to_string());
                self.pool.run(w3, move || assert_equal(destination.get(), &expected, &format!("merge destination, {name}")));
                let w4 = self.pick(&[w3]);
                if !in_round && merged.rows.len() <= 6 {
                    self.pool.run(w4, move || unsafe { latent_cache_free(cache.get()) });
                    self.cache = destination;
                    self.model = merged;
                } else {
                    self.pool.run(w4, move || unsafe { latent_cache_free(destination.get()) });
                }
                w2
            }
            _ => self.append_latent(what),
        }
    }
}

#[test]
fn random_operations_hop_between_worker_threads_and_match_the_model() {
    const SEED: u64 = 0x0007_e578;
    const OPS: usize = 150;
    let pool = Arc::new(Pool::new(8));
    let layouts = [[8, 4, 3], [5, 3, 2], [8, 4, 0], [6, 2, 0]];
    let drivers: Vec<_> = layouts
        .iter()
        .enumerate()
        .map(|(k, &widths)| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let w = k % pool.len();
                let cache = pool.run(w, move || Shared(new_cache(widths, 0)));
                let mut slot = Slot { cache, model: Model::new(widths), rng: Rng::new(SEED + k as u64), pool };
                for i in 0..OPS {
                    let what = format!("handle {k} (widths {widths:?}, seed {}) op {i}", SEED + k as u64);
                    let w = slot.step(&what);
                    let (c, model) = (slot.cache, slot.model.clone());
                    let reader = slot.pick(&[w]);
                    slot.pool.run(reader, move || assert_equal(c.get(), &model, &what));
                }
                let cache = slot.cache;
                let w = slot.pick(&[]);
                slot.pool.run(w, move || unsafe { latent_cache_free(cache.get()) });
            })
        })
        .collect();
    let failures: Vec<String> = drivers
        .into_iter()
        .filter_map(|d| d.join().err())
        .map(|e| {
            e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
        })
        .collect();
    Arc::try_unwrap(pool).ok().expect("drivers done").shut_down();
    assert!(failures.is_empty(), "{} of 4 handles failed: {failures:#?}", failures.len());
}

// ---- Focused cases: work done on a thread that has exited since, read on the main thread ----

const DSA: [usize; 3] = [8, 4, 3];

/// Runs `f` on a new thread and waits for it to exit.
fn on_exited_thread<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    match thread::spawn(f).join() {
        Ok(v) => v,
        Err(panic) => resume_unwind(panic),
    }
}

/// A DSA cache holding three rows appended on the main thread.
fn three_rows(rng: &mut Rng) -> (Shared<*mut Handle>, Model) {
    let cache = new_cache(DSA, 0);
    let mut model = Model::new(DSA);
    let data = host_data(rng, DSA, 3, 4);
    ok(append_host(cache, 3, 4, &data), "append_host on main");
    model.append(3, 4, &data);
    (Shared(cache), model)
}

/// `append_latent` on a thread that then exits; the returned views are freed unevaluated.
fn append_latent_on_exited_thread(cache: Shared<*mut Handle>, model: &mut Model, rng: &mut Rng, tokens: usize) {
    let batch = model.rows.len();
    let data = host_data(rng, DSA, batch, tokens);
    let d = data.clone();
    on_exited_thread(move || {
        let inputs = arrays_from_host(&d, batch, tokens, DSA);
        let mut out = [NULL_ARRAY; 3];
        let [l, r, i] = &mut out;
        let status = unsafe { latent_cache_append_latent(cache.get(), inputs[0].0, inputs[1].0, inputs[2].0, l, r, i) };
        ok(status, "append_latent on a worker thread");
        free_arrays(&inputs);
        free_arrays(&out.map(Shared));
    });
    model.append(batch, tokens, &data);
}

/// After the thread-side work, the main thread reads the cache back and can keep appending.
fn still_usable_on_main(cache: Shared<*mut Handle>, model: &mut Model, rng: &mut Rng, what: &str) {
    assert_equal(cache.get(), model, &format!("{what}, read on the main thread"));
    let data = host_data(rng, DSA, model.rows.len(), 2);
    ok(append_host(cache.get(), model.rows.len(), 2, &data), &format!("append_host on main after {what}"));
    model.append(model.rows.len(), 2, &data);
    assert_equal(cache.get(), model, &format!("append_host on main after {what}"));
    unsafe { latent_cache_free(cache.get()) };
}

#[test]
fn append_latent_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(1);
    let (cache, mut model) = three_rows(&mut rng);
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 3);
    still_usable_on_main(cache, &mut model, &mut rng, "append_latent on an exited thread");
}

#[test]
fn merge_rows_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(2);
    let (cache, mut model) = three_rows(&mut rng);
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 2);
    let destination = on_exited_thread(move || {
        let destination = new_cache(DSA, 0);
        let sources = [cache.get().cast_const(), cache.get().cast_const()];
        ok(unsafe { latent_cache_merge_rows(destination, sources.as_ptr(), 2) }, "merge_rows on a worker thread");
        Shared(destination)
    });
    assert_equal(cache.get(), &model, "merge source, read on the main thread");
    let mut merged = Model::merge(&[&model, &model]);
    unsafe { latent_cache_free(cache.get()) };
    still_usable_on_main(destination, &mut merged, &mut rng, "merge_rows on an exited thread");
}

#[test]
fn filter_rows_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(3);
    let (cache, mut model) = three_rows(&mut rng);
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 2);
    on_exited_thread(move || {
        ok(unsafe { latent_cache_filter_rows(cache.get(), [2usize, 0].as_ptr(), 2) }, "filter_rows on a worker")
    });
    model.filter(&[2, 0]);
    still_usable_on_main(cache, &mut model, &mut rng, "filter_rows on an exited thread");
}

#[test]
fn reserve_with_rows_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(4);
    let (cache, mut model) = three_rows(&mut rng);
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 2);
    on_exited_thread(move || ok(unsafe { latent_cache_reserve(cache.get(), 2000) }, "reserve on a worker"));
    still_usable_on_main(cache, &mut model, &mut rng, "reserve on an exited thread");
}

#[test]
fn uneven_rollback_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(5);
    let (cache, mut model) = three_rows(&mut rng);
    ok(unsafe { latent_cache_spec_round_begin(cache.get()) }, "spec_round_begin on main");
    model.begin();
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 3);
    let keep = [2usize, 0, 1];
    on_exited_thread(move || {
        ok(unsafe { latent_cache_spec_round_rollback_rows(cache.get(), keep.as_ptr(), keep.len()) }, "rollback_rows on a worker")
    });
    model.rollback(&keep);
    still_usable_on_main(cache, &mut model, &mut rng, "uneven rollback on an exited thread");
}

#[test]
fn extract_row_on_an_exited_thread_reads_back_on_main() {
    let mut rng = Rng::new(6);
    let (cache, mut model) = three_rows(&mut rng);
    append_latent_on_exited_thread(cache, &mut model, &mut rng, 2);
    let single = on_exited_thread(move || {
        let mut out = std::ptr::null_mut();
        ok(unsafe { latent_cache_extract_row(cache.get(), 1, &mut out) }, "extract_row on a worker");
        Shared(out)
    });
    let mut extracted = model.extract(1);
    assert_equal(cache.get(), &model, "extract source, read on the main thread");
    unsafe { latent_cache_free(cache.get()) };
    still_usable_on_main(single, &mut extracted, &mut rng, "extract_row on an exited thread");
}

/// Two live threads take turns appending through `append_latent` (views freed unevaluated), past
/// the library's bound on unevaluated writes (it then evaluates on whichever thread appends).
#[test]
fn two_live_threads_take_turns_appending_latent() {
    let pool = Pool::new(2);
    let mut rng = Rng::new(7);
    let cache = Shared(new_cache(DSA, 0));
    let mut model = Model::new(DSA);
    for i in 0..200 {
        let (batch, tokens) = (2, rng.range(1, 2));
        let data = host_data(&mut rng, DSA, batch, tokens);
        let d = data.clone();
        pool.run(i % 2, move || {
            let inputs = arrays_from_host(&d, batch, tokens, DSA);
            let mut out = [NULL_ARRAY; 3];
            let [l, r, k] = &mut out;
            let status = unsafe { latent_cache_append_latent(cache.get(), inputs[0].0, inputs[1].0, inputs[2].0, l, r, k) };
            ok(status, &format!("append_latent call {i} on worker {}", i % 2));
            free_arrays(&inputs);
            free_arrays(&out.map(Shared));
        });
        model.append(batch, tokens, &data);
    }
    pool.shut_down();
    assert_equal(cache.get(), &model, "200 alternating append_latent calls");
    unsafe { latent_cache_free(cache.get()) };
}

/// The documented limit: an array the engine built on its own thread's stream and left
/// unevaluated can only be evaluated there, never by the library (which evaluates on a thread of
/// its own). A call that must evaluate the cache fails with BACKEND and changes nothing (its
/// message without MLX's source paths), on any thread, the owner's too; once the owning thread
/// evaluates, every thread works again.
#[test]
fn an_engine_array_on_its_own_threads_stream_fails_elsewhere_and_changes_nothing() {
    let pool = Pool::new(1);
    let mut rng = Rng::new(5);
    let widths = [8, 4, 0];
    let cache = Shared(new_cache(widths, 0));
    let mut model = Model::new(widths);
    let data = host_data(&mut rng, widths, 1, 3);
    ok(append_host(cache.get(), 1, 3, &data), "first append_host");
    model.append(1, 3, &data);

    // On the worker: inputs computed lazily on the worker's own default stream (x + 0).
    let lazy = host_data(&mut rng, widths, 1, 2);
    let appended = lazy.clone();
    let inputs = pool.run(0, move || {
        let make = |f: usize| {
            let x = mlx_rs::Array::from_slice(&appended[f], &[1, 2, widths[f] as i32]);
            mlx_rs::ops::add(&x, mlx_rs::Array::from_f32(0.0)).unwrap()
        };
        let (latent, rope) = (make(0), make(1));
        let mut views = [NULL_ARRAY; 3];
        let [l, r, k] = &mut views;
        let status = unsafe { latent_cache_append_latent(cache.get(), latent.as_ptr(), rope.as_ptr(), NULL_ARRAY, l, r, k) };
        ok(status, "append_latent of lazy inputs on the worker");
        views.iter().for_each(|&v| unsafe { latent_cache_array_free(v) });
        [latent, rope]
    });
    model.append(1, 2, &lazy);

    // On the main thread, and on the owner: a host append must evaluate the cache, and cannot.
    let more = host_data(&mut rng, widths, 1, 1);
    let status = append_host(cache.get(), 1, 1, &more);
    assert_eq!(status, Status::Backend, "append_host on another thread: {}", last_error());
    let again = more.clone();
    pool.run(0, move || {
        let status = append_host(cache.get(), 1, 1, &again);
        assert_eq!(status, Status::Backend, "append_host on the owning thread: {}", last_error());
    });
    let message = last_error();
    assert!(!message.contains(".cpp:"), "the message carries MLX's source path: {message}");
    let mut offset = 0;
    ok(unsafe { latent_cache_offset(cache.get(), &mut offset) }, "offset");
    assert_eq!(offset, 5, "the failed append_host moved the offset");

    // The owning thread evaluates its inputs (its own evaluation, on its own stream: other
    // threads' evaluations may run meanwhile); then the main thread reads and appends again.
    pool.run(0, move || mlx_rs::transforms::eval(&inputs).expect("the owner's own evaluation"));
    assert_equal(cache.get(), &model, "after the owning thread evaluated");
    ok(append_host(cache.get(), 1, 1, &more), "append_host on main after the owner evaluated");
    model.append(1, 1, &more);
    assert_equal(cache.get(), &model, "append_host after recovery");
    unsafe { latent_cache_free(cache.get()) };
    pool.shut_down();
}
