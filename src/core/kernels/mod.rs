//! Our GPU kernels, one folder per backend (`cuda`, `metal`), their sources real `.cu` and
//! `.metal` files under each folder's `src/`. `launch` is what every backend shares (a kernel's
//! source and launch description, made once per process, its on/off switch and launch count);
//! `decode` the split-K decode's sizes, which both backends judge, and `dsa` the DSA kernels'. Every kernel is optional:
//! each caller asks `applies` first and falls back to MLX's operations, which stay the reference.
//!
//! The sources are handed to MLX as they are, so what a file's first `//!` line says (which
//! kernel, which part) reaches the compiler as a comment, and no comment there may name an
//! input's `_shape` or `_strides`, which MLX looks for. A kernel for a new GPU goes into a new
//! folder here; `attention` chooses among them.
//!
//! May import: `error`, `mlx`, `model`.
pub mod cuda;
pub mod decode;
pub mod dsa;
pub mod launch;
pub mod metal;
