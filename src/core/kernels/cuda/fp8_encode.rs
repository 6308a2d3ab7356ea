//! FP8 encoding in one operation on MLX's CUDA backend: each block of 128 values gets its
//! float32 scale (largest magnitude / 448, at least 1e-10 / 448) and its E4M3 codes (value /
//! scale, rounded to nearest even and saturated, as MLX's `to_fp8`), one warp per block.
//! Written with MLX's operations the same encoding costs twelve graph operations per family
//! and append (reshapes, broadcasts, two divides, a reduction, the conversion:
//! `bench/results/cpu.md`, "MLX operations per step"); here it is one. The MLX-ops encoding in `codec` is the
//! fallback elsewhere and computes the same bits.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, kernel};
use crate::core::kernels::launch::{Launch, Source, Switch};

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Whether the kernel encodes `blocks` blocks of 128: on CUDA, when there is at least one and
/// one thread per value fits a launch.
pub fn applies(blocks: usize) -> bool {
    // MLX counts the launch's threads, and rounds them up to whole blocks of 256, in `int`.
    KERNEL.enabled() && launch::on_cuda() && blocks > 0 && blocks <= (i32::MAX as usize - 255) / 32
}

const HEADER: &str = include_str!("src/fp8_encode.cuh");

/// Input `x [rows, tokens, width]` (row-contiguous, any float dtype); outputs `codes` (uint8, as
/// `x`) and `scale` (float32, `[rows, tokens, width / 128]`).
const ENCODE: &str = include_str!("src/fp8_encode.cu");

static ENCODE_KERNEL: Source = Source {
    name: "latent_cache_fp8_encode",
    inputs: &["x"],
    outputs: &["codes", "scale"],
    header: HEADER,
    body: ENCODE,
    contiguous: true,
};

/// The FP8 parts `[codes, scale]` of `x` (`[rows, tokens, width]`, width a multiple of 128),
/// lazily. Callers check `applies` first.
pub(crate) fn encode(x: &Array, rows: usize, tokens: usize, width: usize) -> Result<Vec<Array>> {
    let blocks = rows * tokens * (width / 128);
    let k = kernel(&ENCODE_KERNEL, 0)?;
    let (r, t, w) = (rows as i32, tokens as i32, width as i32);
    let parts = apply(
        k,
        &[x],
        Launch {
            outputs: &[(&[r, t, w], Dtype::Uint8), (&[r, t, w / 128], Dtype::Float32)],
            grid: [(blocks * 32) as i32, 1, 1],
            block: [256, 1, 1],
            ints: &[],
            bools: &[],
        },
    )?;
    KERNEL.launched();
    Ok(parts)
}
