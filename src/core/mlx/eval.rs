//! Evaluation: the one place the library runs MLX work, on one thread the library owns, under
//! one process-wide lock (the library's own, or the engine's). Every graph the library builds
//! lives on one stream usable from any thread, so evaluations must never overlap: the lock is
//! what makes that stream safe. The thread is what makes caller threads safe to end: a thread
//! that evaluates gets MLX state of its own (its default stream and, on CUDA, its BLAS, DNN and
//! stream handles), and ending such a thread tears that state down with device-wide CUDA calls
//! that break a CUDA graph another thread is capturing at that moment (MLX 0.32 aborts the
//! process: "cudaStreamEndCapture ... failed"). Caller threads therefore never evaluate: they
//! hand the arrays to the evaluation thread and wait for it.
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender, SyncSender};
use std::sync::{Arc, Mutex, RwLock};

use mlx_rs::Array;
use once_cell::sync::{Lazy, OnceCell};

use crate::core::error::{error, fail, Result};
use crate::core::mlx::device;

/// MLX evaluation is not safe to run from several threads at once on a shared stream (Metal
/// also encodes into a stream's command buffer on the calling thread), so every evaluation the
/// library performs takes this lock, or the engine's own (`set_eval_lock`).
static EVAL_LOCK: Lazy<Mutex<()>> = Lazy::new(|| Mutex::new(()));

/// A lock the engine owns, to be held around every evaluation the library performs, so that one
/// lock serializes MLX evaluation across the whole process (the engine's and ours).
pub trait EvalLock: Send + Sync {
    fn lock(&self);
    fn unlock(&self);
}

/// The engine's lock when one is installed; otherwise `EVAL_LOCK` is used.
static ENGINE_LOCK: Lazy<RwLock<Option<Arc<dyn EvalLock>>>> = Lazy::new(|| RwLock::new(None));

/// Installs the engine's evaluation lock (`None` restores the library's own).
pub fn set_eval_lock(lock: Option<Arc<dyn EvalLock>>) {
    *ENGINE_LOCK.write().unwrap_or_else(|poisoned| poisoned.into_inner()) = lock;
}

/// Releases the engine's lock when dropped, so an error or panic inside eval cannot leak it.
struct EngineGuard(Arc<dyn EvalLock>);

impl Drop for EngineGuard {
    fn drop(&mut self) {
        self.0.unlock();
    }
}

/// Whether `a` has been evaluated (its data is available).
pub fn is_evaluated(a: &Array) -> bool {
    let mut available = false;
    // SAFETY: a valid array handle; the call only reads its status.
    let rc = unsafe { mlx_sys::_mlx_array_is_available(&mut available, a.as_ptr()) };
    rc == 0 && available
}

/// Whether evaluations run on the library's evaluation thread (the default) or on the caller's.
static ON_EVALUATION_THREAD: AtomicBool = AtomicBool::new(true);

/// Chooses where the library's evaluations run: on its evaluation thread (`true`, the default;
/// any caller thread may end at any time) or on the calling thread (`false`: no hand-off, but on
/// MLX's CUDA backend a thread that evaluated must not end while another thread evaluates, and
/// arrays an engine built on its own thread's stream are then evaluated when that thread calls).
/// Set it before other threads use the library, or while none of them is evaluating.
pub fn set_evaluation_thread(enabled: bool) {
    ON_EVALUATION_THREAD.store(enabled, Ordering::SeqCst);
}

/// Whether evaluations run on the library's evaluation thread.
pub fn evaluation_thread() -> bool {
    ON_EVALUATION_THREAD.load(Ordering::SeqCst)
}

/// How an evaluation ends.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Finish {
    /// When the arrays are available.
    Wait,
    /// Then also when MLX has let go of the buffers its kernels read (see `eval_settled`).
    Settle,
    /// As soon as the work is handed to MLX (`eval_async`).
    HandOff,
}

/// One evaluation handed to the evaluation thread: references to the arrays (MLX arrays are
/// reference-counted, so these are not copies) and where to send the outcome.
struct Job {
    arrays: Vec<Array>,
    finish: Finish,
    reply: SyncSender<Result<()>>,
}

/// The evaluation thread's queue, started on the first evaluation. The thread lives as long as
/// the process, so the MLX state it gathers is never torn down while the process runs.
static EVALUATOR: OnceCell<Sender<Job>> = OnceCell::new();

fn evaluator() -> Result<&'static Sender<Job>> {
    EVALUATOR.get_or_try_init(|| {
        let (sender, jobs) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("latent-cache-eval".into())
            // MLX tears down long lazy chains recursively; give it the main thread's room.
            .stack_size(8 << 20)
            .spawn(move || {
                for job in jobs {
                    let arrays: Vec<&Array> = job.arrays.iter().collect();
                    let outcome = catch_unwind(AssertUnwindSafe(|| eval_locked(&arrays, job.finish)))
                        .unwrap_or_else(|_| fail!(Backend, "MLX evaluation panicked"));
                    drop(job.arrays);
                    let _ = job.reply.send(outcome);
                }
            })
            .map(|_| sender)
            .map_err(|e| error!(Backend, "starting the evaluation thread: {e}"))
    })
}

/// Evaluates under the engine's lock or the library's (on the evaluation thread, unless it is
/// turned off).
fn eval_locked(arrays: &[&Array], finish: Finish) -> Result<()> {
    let engine = ENGINE_LOCK.read().unwrap_or_else(|poisoned| poisoned.into_inner()).clone();
    let run = || -> Result<()> {
        match finish {
            Finish::HandOff => return Ok(mlx_rs::transforms::async_eval(arrays.iter().copied())?),
            _ if arrays.is_empty() => {}
            _ => mlx_rs::transforms::eval(arrays.iter().copied())?,
        }
        // SAFETY: the library's stream is valid for the process; the call only waits.
        if finish == Finish::Settle && unsafe { mlx_sys::mlx_synchronize(device::library_stream()) } != 0 {
            return fail!(Backend, "MLX could not wait for the library's stream");
        }
        Ok(())
    };
    match engine {
        Some(lock) => {
            lock.lock();
            let _guard = EngineGuard(lock);
            run()
        }
        None => {
            let _guard = EVAL_LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
            run()
        }
    }
}

/// Evaluates `arrays` on the evaluation thread and waits for it (or on this thread, when the
/// evaluation thread is turned off). Arrays already evaluated are skipped, and a call with
/// nothing left to evaluate returns at once, without a hand-off.
pub fn eval<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    eval_with(arrays, Finish::Wait)
}

/// Hands `arrays` to MLX and returns once their work is queued (MLX's `async_eval`), on the
/// evaluation thread and under the lock as `eval`. Their values are ready after a later `eval`
/// of them, which waits. This is how a decode loop overlaps building step n + 1 with the device
/// running step n; the library's writes into a buffer that step n still reads wait for it to
/// let go (`readers`), so they stay in place.
pub fn eval_async<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    eval_with(arrays, Finish::HandOff)
}

/// Waits until MLX has run everything handed to it on the library's stream and let go of the
/// buffers that work read (see `eval_settled`).
pub fn settle() -> Result<()> {
    run_job(Vec::new(), Finish::Settle)
}

/// `eval`, then a wait on the library's stream, so that MLX lets go of the buffers the
/// evaluation's kernels read. On MLX's GPU backends a kernel's inputs stay referenced after
/// `eval` returns, until the backend's completion handler for its work has run (on another
/// thread); a write evaluated while such a reference lives cannot take the buffer over and copies
/// all of it. Callers that read part of a buffer and then write into it in place
/// (`prepare_move`'s copy-out, then its writes) use this so the writes stay in place. On CUDA the
/// wait runs behind every earlier completion handler (MLX 0.32 queues it on the same worker;
/// measured on the H200); on Metal it waits for the GPU's work, and a handler still running then
/// costs a copy, never a wrong value.
pub fn eval_settled<'a>(arrays: impl IntoIterator<Item = &'a Array>) -> Result<()> {
    eval_with(arrays, Finish::Settle)
}

fn eval_with<'a>(arrays: impl IntoIterator<Item = &'a Array>, finish: Finish) -> Result<()> {
    let pending: Vec<Array> = arrays.into_iter().filter(|a| !is_evaluated(a)).cloned().collect();
    if pending.is_empty() {
        return Ok(());
    }
    run_job(pending, finish)
}

/// Runs one job on the evaluation thread and waits for its outcome (or on this thread, when the
/// evaluation thread is turned off).
fn run_job(arrays: Vec<Array>, finish: Finish) -> Result<()> {
    if !evaluation_thread() {
        return eval_locked(&arrays.iter().collect::<Vec<_>>(), finish);
    }
    let (reply, outcome) = mpsc::sync_channel(1);
    if evaluator()?.send(Job { arrays, finish, reply }).is_err() {
        return fail!(Backend, "the evaluation thread has stopped");
    }
    outcome.recv().unwrap_or_else(|_| fail!(Backend, "the evaluation thread has stopped"))
}
