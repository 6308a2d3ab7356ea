//! The one door to MLX: array operations that return `Result` and check MLX's memory limit
//! before they allocate (`ops`, `math`), evaluation on a thread of our own (`eval`), and the
//! allocation check itself (`memory`). Nothing else in the core calls mlx-sys directly.
//!
//! May import: `error`.
pub mod eval;
pub mod math;
pub mod memory;
pub mod ops;
