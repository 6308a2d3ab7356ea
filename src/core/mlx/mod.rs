//! The one door to MLX: array operations that return `Result` and check MLX's memory limit
//! before they allocate (`ops`, `math`), the library's stream and its device (`device`), host data of several element types (`host`),
//! evaluation on a thread of our own (`eval`), writes that wait for the work in flight to let go of a buffer (`readers`), MLX's memory: the allocation check, its limit and
//! its buffer cache (`memory`), the running MLX's version, checked at first use (`runtime`), and
//! MLX's distributed layer: a group and point-to-point transfers (`distributed`). Nothing else in the core calls mlx-sys directly.
//!
//! May import: `error`.
pub mod device;
pub mod distributed;
pub mod eval;
pub mod host;
pub mod math;
pub mod memory;
pub mod ops;
pub mod readers;
pub mod runtime;
