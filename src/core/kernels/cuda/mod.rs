//! CUDA kernels (MLX's CUDA backend, through `mlx_fast_cuda_kernel`): absorbed-MLA split-K
//! decode (`mla_decode`, with a Hopper variant in `mla_decode_wgmma`), DSA index scores
//! (`dsa_scores`) and the FP8 encoder (`fp8_encode`).
pub mod dsa_scores;
pub mod fp8_encode;
pub mod mla_decode;
pub mod mla_decode_wgmma;
