//! The core: plain Rust over mlx-rs, returning `Result`; it knows nothing of C.
pub mod cache;
pub mod checksum;
pub mod codec;
pub mod donor;
pub mod error;
pub mod eval;
pub mod families;
pub mod geometry;
pub mod layout;
pub mod memory;
pub mod mlx_math;
pub mod mlx_ops;
pub mod mlxbun;
pub mod persist;
pub mod prefill;
pub mod rows;
pub mod safetensors;
pub mod set;
pub mod storage;
pub mod tensor_bytes;
pub mod wyhash;

pub use cache::{LatentCache, LatentState};
pub use codec::StorageMode;
pub use error::{CacheError, ErrorKind, Result};
pub use families::Families;
pub use geometry::{Family, Geometry, Role};
pub use layout::{LayoutKind, RowLayout};
