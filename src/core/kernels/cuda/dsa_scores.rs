//! DSA index scores in one operation on MLX's CUDA backend: for each query and stored position,
//! the sum over index heads of weight x ReLU(query . key), read straight from the stored index
//! keys (bfloat16 or float16) with the positions a query does not see at -inf. Written with
//! MLX's operations the same scores take eight graph operations and a float32 copy of every
//! stored key (`Donor::index_scores`, the fallback elsewhere and the reference the kernel is
//! tested against in `tests/kernels/dsa.rs`); here each thread scores one position for every head in
//! float32, the block's queries, weights and keys (staged in chunks, read along the channels) in
//! shared memory.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, kernel};
use crate::core::kernels::dsa::{scores_fit, SCORE_THREADS};
use crate::core::kernels::launch::{Launch, Source, Switch};

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Whether the kernel scores `queries` queries of `heads` heads and width `width` over
/// `positions` keys stored in `storage`, for `batch` rows: on CUDA, 16-bit float storage, the
/// queries fitting shared memory, sizes within a launch. Float32 keys stay with MLX's ops: they
/// need no converted copy there, and MLX's matmul (TF32 on its CUDA backend) was faster than this
/// kernel over them (H200, 128K positions: 0.38 against 0.42 ms a sparse step at batch 1, 1.30
/// against 1.47 at batch 8; over bfloat16 keys the kernel's steps were 0.44 against 0.53 and
/// 1.47 against 1.72 ms).
pub fn applies(storage: Dtype, batch: usize, heads: usize, queries: usize, width: usize, positions: usize) -> bool {
    KERNEL.enabled() && launch::on_cuda() && scores_fit(storage, batch, heads, queries, width, positions)
}

/// Template `HI` heads, `W` width, `LQ` queries; `RANGES`: `ranges` holds each row's visible
/// window `[lo, hi)` (else every row spans the window); `CAUSAL`: query i of LQ sees up to the
/// row's end - LQ + i. `KT`, `QT`, `WT` name the inputs' dtypes (MLX compiles a kernel per
/// template arguments, and the inputs' types are part of its source). Inputs (views, any
/// strides): `q_index [B, HI, LQ, W]`, `weights [B, LQ, HI]`, `keys [B, T, W]`, `ranges` int32.
/// Output `scores [B, LQ, T]` float32.
const SCORES: &str = include_str!("src/dsa_scores.cu");

static SCORES_KERNEL: Source = Source {
    name: "latent_cache_dsa_index_scores",
    inputs: &["q_index", "weights", "keys", "ranges"],
    outputs: &["scores"],
    header: "",
    body: SCORES,
    contiguous: false,
};

/// The index scores `[B, Lq, T]` float32, lazily: `q_index [B, Hi, Lq, W]`, `weights [B, Lq,
/// Hi]`, `keys [B, T, W]` (the stored part), `ranges` each row's visible window positions,
/// `causal` the bottom-right aligned causal band. Callers check `applies` first.
pub(crate) fn index_scores(
    q_index: &Array,
    weights: &Array,
    keys: &Array,
    ranges: &[(usize, usize)],
    causal: bool,
) -> Result<Array> {
    let qs = q_index.shape();
    let (batch, heads, queries, width) = (qs[0], qs[1], qs[2], qs[3]);
    let positions = keys.shape()[1];
    // Without a ranges array (rows spanning the window) the weights stand in for the unread input.
    let bounds = launch::ranges_array(ranges, positions as usize);
    let whole = bounds.is_none();
    let bounds = bounds.unwrap_or_else(|| weights.clone());
    let tag = |d: Dtype| d as i32;
    let k = kernel(&SCORES_KERNEL, 0)?;
    let out = apply(
        k,
        &[q_index, weights, keys, &bounds],
        Launch {
            outputs: &[(&[batch, queries, positions], Dtype::Float32)],
            grid: [(positions as usize).div_ceil(SCORE_THREADS) as i32 * SCORE_THREADS as i32, queries, batch],
            block: [SCORE_THREADS as i32, 1, 1],
            ints: &[
                ("HI", heads),
                ("W", width),
                ("LQ", queries),
                ("KT", tag(keys.dtype())),
                ("QT", tag(q_index.dtype())),
                ("WT", tag(weights.dtype())),
            ],
            bools: &[("RANGES", !whole), ("CAUSAL", causal && queries > 1)],
        },
    )?;
    KERNEL.launched();
    Ok(out.into_iter().next().expect("one output"))
}
