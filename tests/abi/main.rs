//! The C ABI's contract: rejected inputs and the panic boundary (`ffi_contract`), the config's
//! growth (`config_growth`), host arrays of several types (`host_arrays`), what a ported
//! engine relies on (`fidelity`), stale handles (`handles`), threads on their own and shared
//! handles (`threads`) and handles hopping between threads (`thread_hop`). Grouped in one binary
//! (one link of mlx-c): none of these tests sets process-wide state (handles are tokens never
//! reused, so other tests' caches cannot take a stale handle's place). The thread tests that
//! count the process's threads, end threads mid-evaluation, install an evaluation lock or turn
//! the evaluation thread off are apart (`tests/thread_count.rs`, `tests/thread_exit.rs`,
//! `tests/eval_lock*.rs`, `tests/handle_free_race.rs`, `tests/caller_evaluation.rs`).
#[path = "../common/mod.rs"]
mod common;

mod config_growth;
mod ffi_contract;
mod fidelity;
mod handles;
mod host_arrays;
mod thread_hop;
mod threads;
