//! The core: plain Rust over mlx-rs, returning `Result`; it knows nothing of C.
pub mod cache;
pub mod error;
pub mod geometry;
pub mod layout;
pub mod mlx_ops;
pub mod storage;

pub use cache::{LatentCache, LatentState};
pub use error::{CacheError, ErrorKind, Result};
pub use geometry::{Family, Geometry};
pub use layout::RowLayout;
