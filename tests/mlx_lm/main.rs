//! Against mlx-lm itself (`#[ignore]`d: they need Python with mlx and mlx-lm, run by `make
//! test-interop` with `--ignored` and `LATENT_CACHE_MLX_LM_PYTHONPATH`): files exchanged with
//! mlx-lm (`mlx_lm_interop`) and the read path against its GLM-5 attention (`mlx_lm_attention`).
//! Grouped in one binary: neither sets process-wide state; each writes in a scratch folder of
//! its own name. (The Python sides are in tests/interop/.)
#[path = "../common/mod.rs"]
mod common;

mod mlx_lm_attention;
mod mlx_lm_interop;
