//! The C ABI: a thin layer over the core. It checks every pointer, locks the handle, calls the
//! core, and turns the result into a status code and a per-thread message. One file per job:
//! plumbing (`status`, `error`, `panic`, `args`, `handle`) and the exports grouped by purpose.
//!
//! A new export goes into the file of its purpose, its body one `ffi_boundary!` (see `panic`).
//! cbindgen writes the header in the order of the modules below: the order a user learns the
//! API (statuses, families, storage modes, layouts and roles, the config, a cache's life and host path, the MLX-array path,
//! rounds, padded prefills and composed storage's prefill maintenance, rows, queries, the model-level set, saving and loading, the read path, errors, the evaluation lock, the version), so keep it that way.
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // the safety contract of every export is in its C docs

pub mod status;
pub mod family;
pub mod storage;
pub mod layout;
pub mod role;
pub mod handle;
pub mod config;
pub mod cache;
pub mod arrays;
pub mod spec;
pub mod prefill;
pub mod composed;
pub mod rows;
pub mod query;
pub mod set;
pub mod persist;
pub mod mlxbun;
pub mod donor;
pub mod last_error;
pub mod eval_lock;
pub mod version;

mod args;
pub mod error;
#[doc(hidden)] // exposed so tests can drive the boundary itself
pub mod panic;

pub use config::latent_cache_config;
pub use handle::latent_cache;
pub use status::latent_cache_status;
