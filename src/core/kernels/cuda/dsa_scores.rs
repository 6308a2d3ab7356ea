//! DSA index scores in one operation on MLX's CUDA backend: for each query and stored position,
//! the sum over index heads of weight x ReLU(query . key), read straight from the stored index
//! keys (bfloat16 or float16) with the positions a query does not see at -inf. Written with
//! MLX's operations the same scores take eight graph operations and a float32 copy of every
//! stored key (`Donor::index_scores`, the fallback elsewhere and the reference the kernel is
//! tested against in `tests/kernels/dsa.rs`).
//!
//! The products run on tensor cores (`mma.sync` m16n8k16, float32 accumulators): each warp
//! scores 16 positions for 8 heads a product, its keys read once straight into the products'
//! registers; the queries (as the keys' 16-bit type; queries of another dtype as two 16-bit
//! parts, multiplied exactly) and the weights sit in shared memory. A step's scores are then
//! bound by reading the keys: the earlier kernel, one position a thread for every head in
//! float32 arithmetic, was bound by its arithmetic (H200, GLM-5.2's 32 heads of 128 over 128K
//! positions: 0.128 ms, for 32 MB of keys that the GPU reads in about 0.01 ms).
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::cuda::launch;
use crate::core::kernels::cuda::launch::{apply, apply_zeroed, kernel};
use crate::core::kernels::dsa::scores_fit;
use crate::core::kernels::launch::{Launch, Source, Switch};

/// This kernel's switch and launch count (see `kernels::launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Threads a block (eight warps) and the positions it scores (two products of 16 a warp).
const THREADS: usize = 256;
const POSITIONS_PER_BLOCK: usize = 256;

/// The widest keys the kernel takes: a warp holds its 16 positions' keys in registers, four
/// for each 16 channels.
const MAX_WIDTH: usize = 256;

/// Static shared memory a block has (CUDA's limit without opting in).
const STATIC_SHARED: usize = 48 * 1024;

/// Shared memory for `heads` heads of width `width`, queries of another dtype than the keys
/// (two parts) taken as the larger case: the rows as the kernel pads them, and the weights.
fn shared_bytes(heads: usize, width: usize) -> usize {
    let (hp, wp) = (heads.div_ceil(8) * 8, width.div_ceil(16) * 16);
    2 * hp * (wp / 2 + 4) * 4 + hp * 4
}

/// Whether the kernel scores `queries` queries of `heads` heads and width `width` over
/// `positions` keys stored in `storage`, for `batch` rows: on CUDA, 16-bit float storage (queries
/// of `q_dtype`: any over bfloat16 keys, float16 over float16 keys), the queries fitting shared
/// memory and a width of at most `MAX_WIDTH`, sizes within a launch.
/// Float32 keys stay with MLX's ops: they need no converted copy there, and MLX's matmul (TF32
/// on its CUDA backend) was faster than the earlier float32-arithmetic kernel over them.
/// With `counted`, the kernel that also counts the scores' top-k histogram (in shared memory too).
pub fn applies(
    (storage, q_dtype): (Dtype, Dtype),
    batch: usize,
    heads: usize,
    queries: usize,
    width: usize,
    positions: usize,
    counted: bool,
) -> bool {
    // Over float16 keys the queries are multiplied as float16, whose range (65504) other
    // dtypes' values exceed: those stay with MLX's ops.
    let in_range = storage != Dtype::Float16 || q_dtype == Dtype::Float16;
    in_range
        && KERNEL.enabled()
        && launch::on_cuda()
        && scores_fit(storage, batch, heads, queries, width, positions)
        && width <= MAX_WIDTH
        && shared_bytes(heads, width) + if counted { COUNTS_BYTES } else { 0 } <= STATIC_SHARED
        && positions.div_ceil(POSITIONS_PER_BLOCK) * THREADS <= i32::MAX as usize
}

/// Template `HI` heads, `W` width, `LQ` queries; `BF16`: the keys are bfloat16 (else float16);
/// `RANGES`: `ranges` holds each row's visible
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
    header: concat!(include_str!("src/mma.cuh"), include_str!("src/dsa_scores.cuh")),
    body: SCORES,
    contiguous: false,
};

/// The kernel that also counts its scores' top-k histogram (`dsa_topk`'s first kernel's output,
/// `hist [B, Lq, 2048]` uint32, as a second output, zeroed by MLX first): DSA's selection is
/// then the scores and the top-k's second kernel, two operations where it was three.
static COUNTED_KERNEL: Source = Source {
    name: "latent_cache_dsa_index_scores_counted",
    inputs: &["q_index", "weights", "keys", "ranges"],
    outputs: &["scores", "hist"],
    header: concat!(
        include_str!("src/mma.cuh"),
        include_str!("src/dsa_scores.cuh"),
        include_str!("src/dsa_topk.cuh"),
        include_str!("src/dsa_scores_counted.cuh")
    ),
    body: SCORES,
    contiguous: false,
};

/// Bytes of the histogram the counting kernel keeps in shared memory.
const COUNTS_BYTES: usize = 2048 * 4;

/// The index scores `[B, Lq, T]` float32, lazily: `q_index [B, Hi, Lq, W]`, `weights [B, Lq,
/// Hi]`, `keys [B, T, W]` (the stored part), `ranges` each row's visible window positions,
/// `causal` the bottom-right aligned causal band; with `counted`, also their top-k histogram
/// (for `dsa_topk::top_k`). Callers check `applies` first.
pub(crate) fn index_scores(
    q_index: &Array,
    weights: &Array,
    keys: &Array,
    ranges: &[(usize, usize)],
    causal: bool,
    counted: bool,
) -> Result<(Array, Option<Array>)> {
    let qs = q_index.shape();
    let (batch, heads, queries, width) = (qs[0], qs[1], qs[2], qs[3]);
    let positions = keys.shape()[1];
    // Without a ranges array (rows spanning the window) the weights stand in for the unread input.
    let bounds = launch::ranges_array(ranges, positions as usize);
    let whole = bounds.is_none();
    let bounds = bounds.unwrap_or_else(|| weights.clone());
    let tag = |d: Dtype| d as i32;
    let scores = (&[batch, queries, positions][..], Dtype::Float32);
    let counts = (&[batch, queries, 2048][..], Dtype::Uint32);
    let (launch, outputs): (fn(_, _, _) -> _, &[_]) = match counted {
        true => (apply_zeroed, &[scores, counts]),
        false => (apply, &[scores]),
    };
    let k = kernel(if counted { &COUNTED_KERNEL } else { &SCORES_KERNEL }, 0)?;
    let out = launch(
        k,
        &[q_index, weights, keys, &bounds],
        Launch {
            outputs,
            grid: [((positions as usize).div_ceil(POSITIONS_PER_BLOCK) * THREADS) as i32, queries, batch],
            block: [THREADS as i32, 1, 1],
            ints: &[
                ("HI", heads),
                ("W", width),
                ("LQ", queries),
                ("KT", tag(keys.dtype())),
                ("QT", tag(q_index.dtype())),
                ("WT", tag(weights.dtype())),
            ],
            bools: &[("BF16", keys.dtype() == Dtype::Bfloat16), ("RANGES", !whole), ("CAUSAL", causal && queries > 1)],
        },
    )?;
    KERNEL.launched();
    let mut out = out.into_iter();
    Ok((out.next().expect("the scores"), out.next()))
}
