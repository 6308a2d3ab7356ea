//! The core: plain Rust over mlx-rs, returning `Result`; it knows nothing of C.
//!
//! Rooms, bottom-up (each imports only rooms listed before it):
//!
//! | room | what it is for |
//! |---|---|
//! | [`error`] | `CacheError`, `ErrorKind`, `Result` |
//! | [`layout`] | rows as integers: row layout, composed boundaries, padded-prefill records |
//! | [`mlx`] | the one door to MLX: checked operations, evaluation, the memory limit |
//! | [`model`] | a layer's geometry, families, storage modes as facts, model presets |
//! | [`kernels`] | our CUDA and Metal kernels (sources in real files), each optional |
//! | [`storage`] | positions as MLX arrays: buffers written in place, codecs, the hot side |
//! | [`cache`] | `LatentCache`: one layer's API, rounds, rows, prefills, composed storage, sets |
//! | [`attention`] | donor rows and attention over them: dense, DSA, through the kernels |
//! | [`persist`] | files: mlx-lm's safetensors format and the seed's `.mlxbun` |
//! | [`store`] | the prefix store: stored prefixes by their tokens, in RAM and on SSD |
//! | [`transfer`] | a set's row handed to another process over MLX's distributed layer |
pub mod attention;
pub mod cache;
pub mod error;
pub mod kernels;
pub mod layout;
pub mod mlx;
pub mod model;
pub mod persist;
pub mod storage;
pub mod store;
pub mod transfer;

pub use cache::{Change, LatentCache, LatentState};
pub use error::{CacheError, ErrorKind, Result};
pub use layout::row_layout::{LayoutKind, RowLayout};
pub use model::families::Families;
pub use model::geometry::{Family, Geometry, Role};
pub use model::storage_mode::StorageMode;
