//! The decode kernel's partial pass for Hopper GPUs (compute capability 9.0), and its one-pass
//! form (below): the same split-K flash decoding as `mla_decode`'s `partial`, with the products
//! in warpgroup `wgmma` instructions that read their operands straight from shared memory, and
//! the tiles streamed in by warps of their own. The `mma.sync` kernel reads every query and key
//! fragment into registers, four warps to each stored value, and its threads both copy and
//! compute, so the copies wait on the products and the products on the copies.
//!
//! A block is three warpgroups over 64 (head, query) rows. The producer warpgroup copies tiles of
//! 32 positions (16-byte `cp.async`) into four key buffers, each buffer's `full` barrier
//! completing when its copies land, and waits on its `empty` barrier before reusing it. Each of
//! the two computing warpgroups takes every tile in turn: all 64 x 32 scores (`wgmma` over the
//! `R + P` channels), the online softmax in registers, and the probabilities (bfloat16 or
//! float16, from registers) times its half of the latent channels into float32 accumulators in
//! registers; then it releases the buffer. Operands sit in shared memory as 8 x 8 core matrices
//! of 128 contiguous bytes (wgmma's layout without swizzling). The outputs are the `partial`
//! kernel's, for the same `combine`.
//!
//! The one-pass decode (`one_pass_applies`: up to 2048 positions, as a DSA step's 2048 selected
//! ones) is this pass in eight splits that form a thread block cluster: after the last tile each
//! block puts its unnormalized output and running max and sum in the key buffers, and each block
//! then combines its eighth of the channels of every row from the eight blocks' shared memory
//! (`combine`'s arithmetic) and writes the attention's output. One operation where the two
//! passes are two: a whole model's sparse step is bound by the host's cost per operation. Its
//! cluster is fixed at compile time, which MLX's cached CUDA graphs cannot tell from another
//! kernel's launch: it runs only where MLX runs without them (`clusters`).
use mlx_rs::{Array, Dtype};
use once_cell::sync::Lazy;

use crate::core::error::Result;
use crate::core::kernels::cuda::launch::{apply, kernel};
use crate::core::kernels::cuda::mla_decode_common::{partial_prologue, PARTIAL_INPUTS, PARTIAL_OUTPUTS};
use crate::core::kernels::cuda::{clusters, launch};
use crate::core::kernels::launch::{Launch, Source, Switch};

/// Rows per block and positions per tile, as in `mla_decode`; threads per block (three
/// warpgroups).
const ROWS: usize = 64;
const THREADS: i32 = 384;
const POSITIONS_PER_TILE: usize = 32;
/// The fewest tiles a split of this pass walks where there are few positions: its blocks cost
/// more to start than the `mma.sync` pass's (three warpgroups, barriers, the register handover),
/// so at batch 1 it takes fewer, longer splits (H200, 16K positions, the partial pass alone: 36
/// us at 64 splits of 8 tiles, 47 at 128 of 4; the mma.sync pass 47 at 128 splits).
pub(crate) const MIN_TILES_PER_SPLIT: usize = 8;
/// Key buffers in shared memory: up to three tiles stream in while one is computed on (on an
/// H200, three buffers and four measured alike).
const STAGES: usize = 4;

/// Shared memory for widths `d = r + p`: the queries, the key buffers and their two barriers.
pub(crate) fn shared_bytes(d: usize) -> usize {
    ROWS * d * 2 + STAGES * POSITIONS_PER_TILE * d * 2 + 2 * STAGES * 8
}

/// Whether this kernel takes widths `rank` and `rope`: each warpgroup's half of the latent
/// channels tiles by 64, and the copies take 32 channels of 8 positions at a time.
pub(crate) fn fits(rank: usize, rope: usize) -> bool {
    rank % 128 == 0 && rope % 32 == 0
}

const HEADER: &str = include_str!("src/mla_decode_wgmma.cuh");

/// The partial pass (template arguments and inputs as `mla_decode`'s `PARTIAL`, and `CLUSTER`
/// 0).
const PARTIAL: &str = concat!(
    include_str!("src/mla_decode_wgmma_layout.cu"),
    partial_prologue!(),
    include_str!("src/mla_decode_wgmma_partial.cu"),
    include_str!("src/mla_decode_wgmma_store.cu"),
);

static PARTIAL_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_partial_wgmma",
    inputs: PARTIAL_INPUTS,
    outputs: PARTIAL_OUTPUTS,
    header: HEADER,
    body: PARTIAL,
    contiguous: false,
};

/// The one-pass decode: the partial pass over `CLUSTER_SIZE` splits that form a thread block
/// cluster and combine their outputs in it (template `CLUSTER` = `CLUSTER_SIZE`). Output `out
/// [B, H, R]` float32, as `combine`'s.
const ONE_PASS_BODY: &str = concat!(
    include_str!("src/mla_decode_wgmma_layout.cu"),
    partial_prologue!(),
    include_str!("src/mla_decode_wgmma_partial.cu"),
    include_str!("src/mla_decode_wgmma_cluster.cu"),
);

static ONE_PASS_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_wgmma_one_pass",
    inputs: PARTIAL_INPUTS,
    outputs: &["out"],
    header: concat!(include_str!("src/mla_decode_wgmma.cuh"), include_str!("src/mla_decode_wgmma_cluster.cuh")),
    body: ONE_PASS_BODY,
    contiguous: false,
};

/// The partial pass in clusters (`Form::Clustered`): the one-pass decode's body over several
/// clusters of `CLUSTER_SIZE` splits, each cluster combining its splits in its shared memory and
/// writing one split's outputs for `combine` (template `CLUSTER` = `CLUSTER_SIZE`, and
/// `LC_CLUSTER_PARTIALS`). Outputs as the partial pass's, a split per cluster.
static CLUSTERED_KERNEL: Source = Source {
    name: "latent_cache_mla_decode_wgmma_clustered",
    inputs: PARTIAL_INPUTS,
    outputs: PARTIAL_OUTPUTS,
    header: concat!(
        include_str!("src/mla_decode_wgmma.cuh"),
        include_str!("src/mla_decode_wgmma_cluster.cuh"),
        "#define LC_CLUSTER_PARTIALS 1\n"
    ),
    body: ONE_PASS_BODY,
    contiguous: false,
};

/// The splits of the one-pass decode, one thread block cluster (as `LC_CLUSTER_SIZE` in its
/// header; eight blocks is the cluster size every Hopper GPU runs).
pub(crate) const CLUSTER_SIZE: usize = 8;

/// The most positions the one-pass decode reads: eight tiles a split (`MIN_TILES_PER_SPLIT`), a
/// DSA decode step's 2048 selected positions. Up to there the two passes would split the
/// positions into eight splits or fewer, so one cluster has as many blocks as they would; past it
/// the two passes spread more blocks over the GPU than a cluster holds.
const ONE_PASS_MAX_POSITIONS: usize = CLUSTER_SIZE * MIN_TILES_PER_SPLIT * POSITIONS_PER_TILE;

/// The one-pass decode's switch and launch count (on where it applies and the environment allows
/// kernels in clusters, `clusters::allowed`; tests turn it off to run the two passes on the same
/// GPU). Its launches count as `KERNEL`'s too.
pub static ONE_PASS: Switch = Switch::new();

/// Whether one pass computes a decode of `positions` positions at widths `rank` and `rope`
/// (where `applies`): few enough positions for a cluster's blocks, and the splits' outputs
/// fitting the key buffers they take over after the last tile (rows of `rank + 8` floats, and
/// eleven floats a row: the running max and sum, the eight splits' weights, the inverse sum).
/// Only where the environment allows kernels in clusters (`clusters::allowed`: MLX without its
/// CUDA graphs). (A GPU partitioned so that eight multiprocessors of one cluster cannot run
/// together would refuse the launch: MLX's evaluation reports it; `LATENT_CACHE_ONE_PASS=0` in
/// the environment turns this form off for the process, as `ONE_PASS` does.)
#[doc(hidden)]
pub fn one_pass_applies(rank: usize, rope: usize, positions: usize) -> bool {
    ONE_PASS.enabled()
        && clusters::allowed()
        && applies(rank, rope)
        && positions <= ONE_PASS_MAX_POSITIONS
        && combines(rank, rope)
}

/// Whether a cluster's splits can combine their outputs in the key buffers they take over after
/// the last tile, at widths `rank` and `rope` (see `one_pass_applies`).
fn combines(rank: usize, rope: usize) -> bool {
    let outputs = ROWS * (rank + 8) * 4 + ROWS * (3 + CLUSTER_SIZE) * 4;
    outputs <= STAGES * POSITIONS_PER_TILE * (rank + rope) * 2
}

/// This kernel's switch and launch count (on by default where it applies; tests and benchmarks
/// turn it off to run the `mma.sync` kernel on the same GPU).
pub static KERNEL: Switch = Switch::new();

/// Whether the partial pass runs here for widths `rank` and `rope`: a compute capability 9.0
/// GPU (the `wgmma` instructions are particular to it), widths that tile, and shared memory.
#[doc(hidden)]
pub fn applies(rank: usize, rope: usize) -> bool {
    KERNEL.enabled()
        && launch::compute_capability() == Some((9, 0))
        && fits(rank, rope)
        && shared_bytes(rank + rope) <= launch::shared_memory_limit()
}

/// The partial pass's forms: its kernels `PARTIAL_KERNEL`, `ONE_PASS_KERNEL` and `CLUSTERED_KERNEL`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Form {
    /// A split's outputs per block, for `combine`.
    Split,
    /// One cluster of `CLUSTER_SIZE` splits; the output `combine`'s.
    OnePass,
    /// Clusters of `CLUSTER_SIZE` splits, a split's outputs per cluster, for `combine`.
    Clustered,
}

impl Form {
    /// The splits whose outputs a pass of `splits` blocks writes: one per block, one per cluster.
    pub(crate) fn outputs(self, splits: i32) -> i32 {
        if self == Form::Clustered {
            splits / CLUSTER_SIZE as i32
        } else {
            splits
        }
    }
}

/// The partial pass's form and splits for about `splits` splits at widths `rank` and `rope`
/// (`wgmma`: where the wgmma pass runs; the `mma.sync` pass is split by split): in
/// clusters (`Form::Clustered`, the splits rounded down to whole clusters) where there are two
/// clusters at least (one is the one-pass decode's) and `CLUSTERED` is on. Each cluster writes
/// one split's outputs where its blocks would write eight: at GLM-5.2's 64 heads, 2 MB of
/// float32 partial outputs for a row's 128 splits rather than 17 MB, which MLX's CUDA backend
/// holds until the GPU has run the whole evaluation's batch (78 layers' worth in a model step).
/// Off unless `CLUSTERED` is turned on or the environment has `LATENT_CACHE_CLUSTERED=1`, and
/// only where kernels in clusters are allowed (`clusters::allowed`: MLX without its CUDA graphs):
/// its results are tested on an H100, its speed is not measured yet (its 16 clusters of eight
/// may not all fit the GPU at once). (`LATENT_CACHE_ONE_PASS=0` turns it off: a GPU that cannot
/// run a cluster of eight refuses both.)
pub(crate) fn form(wgmma: bool, splits: usize, rank: usize, rope: usize) -> (usize, Form) {
    let asked = CLUSTERED.enabled() || *CLUSTERED_ASKED;
    let takes = wgmma && asked && clusters::allowed() && applies(rank, rope) && combines(rank, rope);
    match takes && splits >= 2 * CLUSTER_SIZE {
        true => (splits / CLUSTER_SIZE * CLUSTER_SIZE, Form::Clustered),
        false => (splits, Form::Split),
    }
}

/// Whether the one-pass and clustered forms may run in this process (`clusters::allowed`), for
/// tests.
#[doc(hidden)]
pub fn clusters_allowed() -> bool {
    clusters::allowed()
}

/// The clustered form's switch and launch count (off by default: see `form`; tests turn it on
/// where clusters are allowed).
/// Its launches count as `KERNEL`'s too.
pub static CLUSTERED: Switch = Switch::off();

/// Whether the environment asks for the clustered form (read once): `LATENT_CACHE_CLUSTERED=1`
/// (and MLX without its CUDA graphs: see `clusters`).
static CLUSTERED_ASKED: Lazy<bool> = Lazy::new(|| std::env::var("LATENT_CACHE_CLUSTERED").is_ok_and(|v| v.trim() == "1"));

/// Applies the partial pass over `splits` x `batch` x `groups` blocks, with `mla_decode`'s
/// inputs, outputs and template arguments, in the given form (`OnePass`: `splits` is
/// `CLUSTER_SIZE`, the output `combine`'s; `Clustered`: `splits` a multiple of it, the outputs a
/// split per cluster).
pub(crate) fn partial(
    inputs: &[&Array],
    outputs: &[(&[i32], Dtype)],
    blocks: [i32; 3],
    ints: &[(&str, i32)],
    bools: &[(&str, bool)],
    width: usize,
    form: Form,
) -> Result<Vec<Array>> {
    let source = match form {
        Form::Split => &PARTIAL_KERNEL,
        Form::OnePass => &ONE_PASS_KERNEL,
        Form::Clustered => &CLUSTERED_KERNEL,
    };
    let k = kernel(source, shared_bytes(width))?;
    let cluster = if form == Form::Split { 0 } else { CLUSTER_SIZE as i32 };
    let ints: Vec<(&str, i32)> = ints.iter().copied().chain([("STAGES", STAGES as i32), ("CLUSTER", cluster)]).collect();
    let [splits, batch, groups] = blocks;
    let launch = Launch { outputs, grid: [splits * THREADS, batch, groups], block: [THREADS, 1, 1], ints: &ints, bools };
    let out = apply(k, inputs, launch)?;
    KERNEL.launched();
    match form {
        Form::OnePass => ONE_PASS.launched(),
        Form::Clustered => CLUSTERED.launched(),
        Form::Split => {}
    }
    Ok(out)
}
