//! Where positions live as MLX arrays: growable per-family buffers written in place
//! (`buffers`: the types in `mod.rs`, writes in `write.rs`, reads in `read.rs`), each storage
//! mode's encode and decode (`codec`), and composed storage's hot side (`hot`). Nothing here
//! knows a row layout's rules or a cache's API.
//!
//! May import: `error`, `mlx`, `model`, `kernels` (the FP8 encoder).
pub mod buffers;
pub mod codec;
pub mod hot;
pub mod shared;
