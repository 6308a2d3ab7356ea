//! The C ABI: a thin layer over the core. It checks every pointer, looks the handle up, locks
//! it, calls the core, and turns the result into a status code and a per-thread message.
//!
//! Plumbing (no exports of its own, except the error and panic boundaries' few):
//! - `registry`: the token registry behind every opaque handle (caches, sets, donors).
//! - `handle`: the `latent_cache` handle: its registry and per-call lock.
//! - `args`: checked pointers in (slices, strings, paths) and outputs written after success.
//! - `mlx_array`: borrowing a caller's `mlx_array`, giving one back, freeing one.
//! - `error`, `panic`: the failure type, the per-thread message, the panic boundary.
//!
//! Exports, one concept a file, in the order a user learns the API (cbindgen writes the header
//! in the order of the modules below, so keep it that way): `status`; the enums `family`,
//! `storage`, `layout`, `role`; `config` (a layer's config, its defaults, its projected bytes, a
//! cache's config); `cache` (a cache's life and host path); `arrays` (the MLX-array path); `host_arrays` (arrays
//! from and to host data of several types, an array's shape and type);
//! `spec` (speculative rounds); `prefill` (padded prefills and prefill maintenance); `rows`
//! (merge, extract, filter); `prefix` (shared prefixes: store, attach, fork); `query` (read-only queries, composed storage's boundaries
//! included); `set` (the model-level set: every set-wide export); `presets` (GLM-5.2's layer
//! configs and selection schedule); `persist`, `segment` and `mlxbun` (saving
//! and loading); `store` (the prefix store); `distributed` (several processes: a group, rows handed over,
//! pipeline stages); `donor` (the read path); `last_error`; `eval_lock`; `device` (the device
//! the library runs on); `memory` (MLX's memory limit and buffer cache); `version`.
//!
//! A new export goes into the file of its concept, its body one `ffi_boundary!` (see `panic`).
#![allow(non_camel_case_types)]
#![allow(clippy::missing_safety_doc)] // the safety contract of every export is in its C docs

pub mod status;
pub mod status_name;
pub mod family;
pub mod storage;
pub mod layout;
pub mod role;
pub mod handle;
pub mod config;
pub mod cache;
pub mod arrays;
pub mod host_arrays;
pub mod spec;
pub mod prefill;
pub mod rows;
pub mod prefix;
pub mod query;
pub mod set;
pub mod presets;
pub mod persist;
pub mod segment;
pub mod store;
pub mod distributed;
pub mod mlxbun;
pub mod donor;
pub mod last_error;
pub mod eval_lock;
pub mod device;
pub mod memory;
pub mod version;

mod args;
mod mlx_array;
mod registry;
pub mod error;
#[doc(hidden)] // exposed so tests can drive the boundary itself
pub mod panic;

pub use config::latent_cache_config;
pub use handle::latent_cache;
pub use status::latent_cache_status;
