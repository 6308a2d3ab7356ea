//! Our GPU kernels, one folder per backend (`cuda`, `metal`), their sources real `.cu` and
//! `.metal` files under each folder's `src/`. `launch` is what every backend shares: a kernel's
//! source and launch description, made once per process. Every kernel is optional: each
//! caller asks `applies` first and falls back to MLX's operations, which stay the reference.
//!
//! A kernel for a new GPU goes into a new folder here, chosen in `attention::on_kernels`.
//!
//! May import: `error`, `mlx`, `model`.
pub mod cuda;
pub mod launch;
pub mod metal;
