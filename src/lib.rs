//! latent-cache: the per-layer attention cache of GLM-5.2's multi-head latent attention (MLA, with
//! DeepSeek sparse-attention index keys), owned as MLX arrays and driven through a C ABI.
//!
//! - [`core`]: the cache in plain Rust over mlx-rs ([`LatentCache`]).
//! - `ffi`: the C ABI (`include/latent_cache.h`), a thin layer over the core.
pub mod core;
pub mod ffi;

pub use crate::core::{CacheError, ErrorKind, Family, Geometry, LatentCache, LatentState, LayoutKind, Role, StorageMode};
