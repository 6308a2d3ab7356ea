//! The library's own kernels on MLX's Metal backend (Apple GPUs): `launch` makes and applies
//! them, `mla_decode` is the split-K decode (its check at first use in `mla_decode_probe`),
//! `dsa_topk` DSA's top-k selection and `dsa_scores` its index scores (each with its own
//! check; `probe_values` the checks' one stream of values); their sources are the `.metal` files
//! under `src/`, which `tests/attention/metal_emulation.rs` runs in C++.
//!
//! May import: `error`, `mlx`, `model`, and the kernels' shared `launch`, `decode` and `dsa`.
pub mod dsa_scores;
pub mod dsa_topk;
pub mod launch;
pub mod mla_decode;
mod mla_decode_probe;
mod probe_values;

pub use launch::on_metal;
