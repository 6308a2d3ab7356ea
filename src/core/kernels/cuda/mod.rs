//! The library's own kernels on MLX's CUDA backend: `launch` makes and applies them and says
//! what the GPU offers; the kernels are the absorbed-MLA split-K decode (`mla_decode`, its
//! Hopper partial pass in `mla_decode_wgmma`, what both passes share in `mla_decode_common`),
//! DSA index scores (`dsa_scores`), DSA's top-k selection (`dsa_topk`) and the FP8 encoder (`fp8_encode`). Their sources are the
//! `.cu` and `.cuh` files under `src/`. `clusters` says whether kernels in thread block
//! clusters may run (only where MLX runs without its CUDA graphs).
//!
//! May import: `error`, `mlx`, `model`, and the kernels' shared `launch`, `decode` and `dsa`.
mod clusters;
pub mod dsa_scores;
pub mod dsa_topk;
pub mod fp8_encode;
pub mod launch;
pub mod mla_decode;
mod mla_decode_common;
pub mod mla_decode_wgmma;
