//! DSA index scores in one operation on MLX's CUDA backend: for each query and stored position,
//! the sum over index heads of weight x ReLU(query . key), read straight from the stored index
//! keys (bfloat16 or float16) with the positions a query does not see at -inf. Written with
//! MLX's operations the same scores take eight graph operations and a float32 copy of every
//! stored key (`Donor::index_scores`, the fallback elsewhere and the reference the kernel is
//! tested against in `tests/dsa.rs`); here each thread scores one position for every head in
//! float32, the block's queries, weights and keys (staged in chunks, read along the channels) in
//! shared memory.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::kernels::launch;
use crate::core::kernels::launch::{apply, kernel, Launch, Source, Switch};

/// This kernel's switch and launch count (see `launch::Switch`).
pub static KERNEL: Switch = Switch::new();

/// Positions scored per block (one a thread).
const THREADS: usize = 128;

/// The most index heads x width the block's shared queries hold (24 KiB of float32, beside
/// 16.5 KiB of staged keys; GLM-5.2's 32 heads of 128 take 16 KiB).
const MAX_QUERY_VALUES: usize = 6144;

/// Whether the kernel scores `queries` queries of `heads` heads and width `width` over
/// `positions` keys stored in `storage`, for `batch` rows: on CUDA, 16-bit float storage, the
/// queries fitting shared memory, sizes within a launch. Float32 keys stay with MLX's ops: they
/// need no converted copy there, and MLX's matmul (TF32 on its CUDA backend) was faster than this
/// kernel over them (H200, 128K positions: 0.38 against 0.42 ms a sparse step at batch 1, 1.30
/// against 1.47 at batch 8; over bfloat16 keys the kernel's steps were 0.44 against 0.53 and
/// 1.47 against 1.72 ms).
pub fn applies(storage: Dtype, batch: usize, heads: usize, queries: usize, width: usize, positions: usize) -> bool {
    KERNEL.enabled()
        && launch::on_cuda()
        && matches!(storage, Dtype::Bfloat16 | Dtype::Float16)
        && heads >= 1
        && width >= 1
        && heads * width <= MAX_QUERY_VALUES
        && (1..=65535).contains(&batch)
        && (1..=65535).contains(&queries)
        && positions >= 1
        && positions.div_ceil(THREADS) * THREADS <= i32::MAX as usize
}

/// Template `HI` heads, `W` width, `LQ` queries; `RANGES`: `ranges` holds each row's visible
/// window `[lo, hi)` (else every row spans the window); `CAUSAL`: query i of LQ sees up to the
/// row's end - LQ + i. `KT`, `QT`, `WT` name the inputs' dtypes (MLX compiles a kernel per
/// template arguments, and the inputs' types are part of its source). Inputs (views, any
/// strides): `q_index [B, HI, LQ, W]`, `weights [B, LQ, HI]`, `keys [B, T, W]`, `ranges` int32.
/// Output `scores [B, LQ, T]` float32.
const SCORES: &str = r#"
  static_assert(KT >= 0 && QT >= 0 && WT >= 0, "dtype tags");
  constexpr int THREADS = 128, C = 32;  // positions per block; channels per staged chunk
  __shared__ float sq[HI * W];
  __shared__ float sw[HI];
  __shared__ float sk[THREADS * (C + 1)];  // a chunk of the block's keys, rows padded by one
  const int tid = threadIdx.x, qi = blockIdx.y, b = blockIdx.z;
  const int T = keys_shape[1];
  const int t0 = blockIdx.x * THREADS, t = t0 + tid;
  for (int i = tid; i < HI * W; i += THREADS) {
    const int h = i / W, c = i % W;
    sq[i] = static_cast<float>(q_index[b * q_index_strides[0] + h * q_index_strides[1] + qi * q_index_strides[2] +
                                       c * q_index_strides[3]]);
  }
  if (tid < HI) sw[tid] = static_cast<float>(weights[b * weights_strides[0] + qi * weights_strides[1] + tid * weights_strides[2]]);
  const int* rp = reinterpret_cast<const int*>(ranges);
  const int lo = RANGES ? rp[2 * b] : 0;
  const int hi = (RANGES ? rp[2 * b + 1] : T) - (CAUSAL ? LQ - 1 - qi : 0);
  float acc[HI];
  #pragma unroll
  for (int h = 0; h < HI; h++) acc[h] = 0.f;
  const long long base = b * keys_strides[0];
  // 16-byte reads of the keys where rows are contiguous and aligned (the stored buffers are).
  const bool vec = keys_strides[2] == 1 && W % 8 == 0 && keys_strides[0] % 8 == 0 && keys_strides[1] % 8 == 0 &&
                   (reinterpret_cast<unsigned long long>(keys) & 15) == 0;
  for (int c0 = 0; c0 < W; c0 += C) {
    // The block's keys, C channels at a time, read along the channels (neighbouring threads,
    // neighbouring values of one stored row).
    __syncthreads();
    if (vec) {
      // Eight channels a 16-byte read: a thread's reads for the chunk are four, issued together,
      // where one read per value made each thread wait on thirty-two in a row.
      for (int i = tid; i < THREADS * (C / 8); i += THREADS) {
        const int p = i / (C / 8), c = i % (C / 8) * 8, pos = t0 + p;
        uint4 raw = make_uint4(0, 0, 0, 0);
        if (pos < T && c0 + c < W) raw = *reinterpret_cast<const uint4*>(keys + base + pos * keys_strides[1] + c0 + c);
        const auto e = reinterpret_cast<decltype(keys)>(&raw);
        #pragma unroll
        for (int j = 0; j < 8; j++) sk[p * (C + 1) + c + j] = static_cast<float>(e[j]);
      }
    } else {
      for (int i = tid; i < THREADS * C; i += THREADS) {
        const int p = i / C, c = i % C, pos = t0 + p;
        sk[p * (C + 1) + c] = pos < T && c0 + c < W ? static_cast<float>(keys[base + pos * keys_strides[1] + (c0 + c) * keys_strides[2]]) : 0.f;
      }
    }
    __syncthreads();
    #pragma unroll 4
    for (int c = 0; c < C; c++) {
      const float k = sk[tid * (C + 1) + c];
      if (c0 + c < W) {
        #pragma unroll
        for (int h = 0; h < HI; h++) acc[h] += sq[h * W + c0 + c] * k;
      }
    }
  }
  if (t >= T) return;
  float* row = scores + (static_cast<long long>(b) * LQ + qi) * T;
  if (t < lo || t >= hi) {
    row[t] = __int_as_float(0xff800000);
    return;
  }
  float s = 0.f;
  #pragma unroll
  for (int h = 0; h < HI; h++) s += sw[h] * fmaxf(acc[h], 0.f);
  row[t] = s;
"#;

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
            grid: [(positions as usize).div_ceil(THREADS) as i32 * THREADS as i32, queries, batch],
            block: [THREADS as i32, 1, 1],
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
