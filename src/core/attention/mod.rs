//! Donor rows and the attention over them: an immutable snapshot of a cache's stored parts and
//! row layout (MLX arrays are immutable, so taking it copies nothing), usable after the cache
//! moves on or is freed, and GLM-5's absorbed MLA attention computed from it lazily:
//! `softmax(scale * (q_latent . latent^T + q_rope . rope^T) + mask) . latent`, every row's
//! padding and positions past its end masked out. Affine-quantized families are read by MLX's
//! quantized matmul from their packed codes, never expanded. On layers with index keys, DSA's
//! selection: index scores, the top-k positions per query, and attention over those alone.
use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::model::storage_mode::{Packing, StorageMode, AFFINE_GROUP};
use crate::core::storage::hot::{hot_alignment, hot_from, overlay_hot, same_dtype, with_tail, HotCapture};

use crate::core::error::{fail, Result};
use crate::core::kernels::cuda;
use crate::core::kernels::launch;
use crate::core::kernels::metal;
use crate::core::mlx::math;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};

/// Whether MLX's quantized matmul takes the batched shapes attention needs on the default
/// device. MLX 0.32's CUDA backend has no kernel for them (it fails at evaluation, too late to
/// fall back), so there the quantized families are decoded for the call instead.
fn batched_quantized_matmul() -> bool {
    !launch::cuda_device()
}

/// Which positions a query sees besides its row's valid range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MaskMode {
    /// Every valid position of the row.
    None,
    /// Query `i` of `Lq` sees the row's valid positions up to `row_end - Lq + i` (bottom-right
    /// aligned, as MLX's SDPA: the queries are the row's last `Lq` positions).
    Causal,
    /// As `None`, plus an additive mask broadcastable to `[B, H, Lq, T]`.
    Array,
}

pub struct Donor {
    geometry: Geometry,
    offset: usize,
    left_pad: Vec<usize>,
    row_ends: Vec<usize>,
    parts: Families<Vec<Array>>,
    /// Composed storage's hot positions (see `composed`), read over the compact ones.
    hot: Option<HotCapture>,
    /// The window's alignment to the hot rows (`window_alignment`), built on first use: an
    /// attention reads it for the rope scores, the latent scores and the weighted latent, and
    /// every composed family's hot rows share one capacity.
    alignment: std::cell::OnceCell<(usize, usize, Array, Array)>,
}

impl LatentCache {
    /// A snapshot of every family's stored parts and of the row layout. Holding it keeps the
    /// current buffers referenced: the cache's next append then copies them instead of writing
    /// in place, so release donors before it when you can.
    /// With composed storage the snapshot holds the compact parts of every position and the hot
    /// values over them: attention reads the compact positions from their parts (quantized
    /// matmul for the affine modes) and the hot ones from the hot values.
    pub fn capture_donor_rows(&self) -> Result<Donor> {
        let offset = self.offset();
        let families = Families::for_geometry(&self.geometry, |family, _| family);
        let parts = families.try_map(|_, family| self.storage.packed(family, offset))?;
        let (left_pad, row_ends) = (self.left_pad().to_vec(), self.row_ends().to_vec());
        let hot = self.capture_hot()?;
        Ok(Donor { geometry: self.geometry, offset, left_pad, row_ends, parts, hot, alignment: Default::default() })
    }
}

impl Donor {
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn batch_size(&self) -> usize {
        self.left_pad.len()
    }

    pub fn offset(&self) -> usize {
        self.offset
    }

    pub fn left_pad(&self) -> &[usize] {
        &self.left_pad
    }

    pub fn row_ends(&self) -> &[usize] {
        &self.row_ends
    }

    fn parts(&self, family: Family) -> &[Array] {
        self.parts.get(family).expect("attention reads latent and rope, which every layer has")
    }

    /// `[B, 1, T, ...]`: a stored part with the head axis attention broadcasts over.
    fn per_head(part: &Array) -> Result<Array> {
        math::expand_dims(part, 1)
    }

    /// `x` times a quantized family's values (`transpose`: their transpose), read by MLX's
    /// quantized matmul from the packed codes. It runs in float32 (the bfloat16 scales and biases
    /// converted, 1/32 of the codes' size or less): with bfloat16 inputs MLX's CPU kernel sums in
    /// bfloat16, which put a uniform average over 200 positions 9% off. `None` for float
    /// families, and where MLX has no kernel for the shape (its CUDA backend lacks some batched
    /// shapes): the caller then decodes.
    fn quantized_product(&self, family: Family, x: &Array, transpose: bool) -> Result<Option<Array>> {
        let (mode, parts) = (self.geometry.storage(family), self.parts(family));
        if !matches!(mode.packing(), Some(Packing::Affine(_))) || !batched_quantized_matmul() {
            return Ok(None);
        }
        let [codes, scales, biases] = [&parts[0], &parts[1], &parts[2]].map(Self::per_head);
        let f32 = |a: Result<Array>| a.and_then(|a| ops::astype(&a, Dtype::Float32));
        let (scales, biases) = (f32(scales)?, f32(biases)?);
        let x = ops::astype(x, Dtype::Float32)?;
        match math::quantized_matmul(&x, &codes?, &scales, &biases, transpose, AFFINE_GROUP as i32, mode.bits() as i32) {
            Ok(out) => Ok(Some(ops::astype(&out, Dtype::Float32)?)),
            Err(_) => Ok(None),
        }
    }

    /// A family's values `[B, T, width]` (decoded for the quantized modes: O(stored)), with
    /// composed storage's hot positions over the compact ones.
    fn decoded(&self, family: Family) -> Result<Array> {
        let mode = self.geometry.storage(family);
        let cold = mode.decode(self.parts(family), self.geometry.width(family).expect("present"))?;
        match self.hot_values(family) {
            Some((hot, bases, starts)) => overlay_hot(&cold, hot, bases, starts, (0, self.offset)),
            None => Ok(cold),
        }
    }

    /// A family's values `[B, 1, T, width]` (see `decoded`).
    fn values(&self, family: Family) -> Result<Array> {
        Self::per_head(&self.decoded(family)?)
    }

    /// A composed family's hot rows `[B, capacity, width]`, each row's base and first hot
    /// position; `None` when the family has no hot values.
    fn hot_values(&self, family: Family) -> Option<(&Array, &[usize], &[usize])> {
        let hot = self.hot.as_ref()?;
        let (_, values) = hot.values.iter().find(|(f, _)| *f == family)?;
        Some((values, hot.bases.as_slice(), hot.starts.as_slice()))
    }

    /// The first window position some row reads hot (`hot_from`), and where the window positions
    /// `[from, T)` of each row sit in its hot row (`[B, 1, 1, T - from]` indices) and whether each
    /// is read hot (a mask of that shape), for a hot row of `capacity`. Built once per donor and
    /// capacity (the host loop runs over every row's span).
    fn window_alignment(&self, bases: &[usize], starts: &[usize], capacity: usize) -> Result<(usize, Array, Array)> {
        if let Some((built_for, from, at, mask)) = self.alignment.get() {
            if *built_for == capacity {
                return Ok((*from, at.clone(), mask.clone()));
            }
        }
        let from = hot_from(bases, starts, (0, self.offset));
        let (at, is_hot) = hot_alignment(bases, starts, capacity, (from, self.offset));
        let shape = [bases.len(), 1, 1, self.offset - from];
        let mask = math::greater_equal(&ops::indices(&is_hot, &shape), &ops::indices(&[1], &[1]))?;
        let at = ops::indices(&at, &shape);
        let _ = self.alignment.set((capacity, from, at.clone(), mask.clone()));
        Ok((from, at, mask))
    }

    /// `x` (`[B, 1, N, T]`, over the window) with each row's hot positions from `hot_part`
    /// (`[B, 1, N, capacity]`, over its hot row).
    fn overlay_positions(&self, x: &Array, hot_part: &Array, bases: &[usize], starts: &[usize]) -> Result<Array> {
        let (from, at, is_hot) = self.window_alignment(bases, starts, hot_part.shape()[3] as usize)?;
        with_tail(x, 3, from, |tail| {
            let aligned = math::take_along_axis(hot_part, &at, 3)?;
            let (tail, aligned) = same_dtype(tail, aligned)?;
            math::select(&is_hot, &aligned, &tail)
        })
    }

    /// `[B, H, Lq, n]` -> `[B, 1, H * Lq, n]`: every head's queries as rows of one product with a
    /// row's stored values, which are then read once per row rather than broadcast per head (MLX
    /// 0.32's CPU matmul also crashes on the broadcast form at batch 8 and 16K positions).
    fn fold_heads(x: &Array) -> Result<Array> {
        let s = x.shape();
        ops::reshape(x, &[s[0] as usize, 1, (s[1] * s[2]) as usize, s[3] as usize])
    }

    /// The inverse of `fold_heads` for a product `[B, 1, H * Lq, n]`, given `heads`.
    fn unfold_heads(x: &Array, heads: i32) -> Result<Array> {
        let s = x.shape();
        ops::reshape(x, &[s[0] as usize, heads as usize, (s[2] / heads) as usize, s[3] as usize])
    }

    /// `q . family^T`, `[B, H, Lq, T]`.
    fn scores(&self, family: Family, q: &Array) -> Result<Array> {
        let folded = Self::fold_heads(q)?;
        let scores = match (self.quantized_product(family, &folded, true)?, self.hot_values(family)) {
            (Some(cold), Some((hot, bases, starts))) => {
                // Compact positions from their codes, hot ones from their values.
                let hot_scores = math::matmul(&folded, &math::swapaxes(&Self::per_head(hot)?, -1, -2)?)?;
                self.overlay_positions(&cold, &hot_scores, bases, starts)?
            }
            (Some(scores), None) => scores,
            (None, _) => math::matmul(&folded, &math::swapaxes(&self.values(family)?, -1, -2)?)?,
        };
        Self::unfold_heads(&scores, q.shape()[1])
    }

    /// `probs . latent`, `[B, H, Lq, kv_lora_rank]` float32. `compute` is the queries' dtype:
    /// where the latent is stored in it (bfloat16 or float16 queries over that storage) the
    /// product runs in it, reading the stored values as they are; otherwise in float32 (exact,
    /// converting what is stored narrower).
    fn weighted_latent(&self, probs: &Array, compute: Dtype) -> Result<Array> {
        let folded = Self::fold_heads(probs)?;
        let hot = self.hot_values(Family::Latent);
        // With hot positions, the compact parts take the probabilities of the compact ones only.
        let cold_probs = match hot {
            Some((values, bases, starts)) => {
                let (from, _, is_hot) = self.window_alignment(bases, starts, values.shape()[1] as usize)?;
                with_tail(&folded, 3, from, |tail| math::select(&is_hot, &ops::scalar(0.0), &tail))?
            }
            None => folded.clone(),
        };
        let out = match self.quantized_product(Family::Latent, &cold_probs, false)? {
            Some(cold) => match hot {
                Some((values, bases, starts)) => {
                    // The probabilities at each row's hot positions, laid out as its hot row.
                    let capacity = values.shape()[1] as usize;
                    let (mut at, mut is_hot) = (Vec::new(), Vec::new());
                    for (&base, &start) in bases.iter().zip(starts) {
                        for j in 0..capacity {
                            let p = base + j;
                            at.push(p.min(self.offset.saturating_sub(1)) as i32);
                            is_hot.push((p >= start && p < self.offset) as i32);
                        }
                    }
                    let shape = [bases.len(), 1, 1, capacity];
                    let is_hot = math::greater_equal(&ops::indices(&is_hot, &shape), &ops::indices(&[1], &[1]))?;
                    let gathered = math::take_along_axis(&folded, &ops::indices(&at, &shape), 3)?;
                    let hot_probs = math::select(&is_hot, &gathered, &ops::scalar(0.0))?;
                    let values = ops::astype(&Self::per_head(values)?, Dtype::Float32)?;
                    math::add(&cold, &math::matmul(&hot_probs, &values)?)?
                }
                None => cold,
            },
            None => {
                let values = self.values(Family::Latent)?;
                let folded = match values.dtype() == compute && compute != Dtype::Float32 {
                    true => ops::astype(&folded, compute)?,
                    false => folded,
                };
                ops::astype(&math::matmul(&folded, &values)?, Dtype::Float32)?
            }
        };
        Self::unfold_heads(&out, probs.shape()[1])
    }

    /// Checks a query `[B, H, Lq, width]`; returns `(H, Lq)`.
    fn check_query(&self, name: &str, q: &Array, width: usize) -> Result<(i32, i32)> {
        if !matches!(q.dtype(), Dtype::Float32 | Dtype::Bfloat16 | Dtype::Float16) {
            return fail!(Dtype, "{name} must be float32, bfloat16 or float16, got {:?}", q.dtype());
        }
        let shape = q.shape();
        if shape.len() != 4 || shape[0] as usize != self.batch_size() || shape[3] as usize != width {
            return fail!(Shape, "{name} must be [{}, heads, queries, {width}], got {shape:?}", self.batch_size());
        }
        Ok((shape[1], shape[2]))
    }

    /// Whether some query misses a position of the window: a row padded or ending before the
    /// window's end, or causal queries after the first. Otherwise `row_mask` is all zeros and is
    /// left out: besides its operations, its two index arrays are made on the host, which on
    /// MLX's CUDA backend costs an evaluation reading them about 30 us each (measured on an H200).
    fn masks(&self, mode: MaskMode, queries: usize) -> bool {
        !(self.whole_rows() && (mode == MaskMode::None || (mode == MaskMode::Causal && queries == 1)))
    }

    /// Whether every row spans the whole window (no padding, every row at the offset).
    fn whole_rows(&self) -> bool {
        self.left_pad.iter().all(|&p| p == 0) && self.row_ends.iter().all(|&e| e == self.offset)
    }

    /// Each row's window positions `[left_pad, row_end)`.
    fn row_ranges(&self) -> Vec<(usize, usize)> {
        self.left_pad.iter().copied().zip(self.row_ends.iter().copied()).collect()
    }

    /// Additive mask `[B, 1, 1 or Lq, T]`: 0 where a query sees the position, -inf elsewhere.
    fn row_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let batch = self.batch_size();
        let positions = ops::reshape(&math::arange(self.offset)?, &[1, 1, 1, self.offset])?;
        let lo: Vec<i32> = self.left_pad.iter().map(|&p| p as i32).collect();
        let lo = ops::indices(&lo, &[batch, 1, 1, 1]);
        let hi = match mode {
            MaskMode::Causal => {
                let hi: Vec<i32> =
                    self.row_ends.iter().flat_map(|&end| (0..queries).map(move |i| (end - queries + i + 1) as i32)).collect();
                ops::indices(&hi, &[batch, 1, queries, 1])
            }
            _ => ops::indices(&self.row_ends.iter().map(|&e| e as i32).collect::<Vec<_>>(), &[batch, 1, 1, 1]),
        };
        let visible = math::logical_and(&math::greater_equal(&positions, &lo)?, &math::less(&positions, &hi)?)?;
        math::select(&visible, &ops::scalar(0.0), &ops::scalar(f32::NEG_INFINITY))
    }

    /// The values of a family at `indices` (`[B, Lq, k]` window positions), `[B, Lq, k, width]`
    /// float32: the selected positions' parts are gathered, then decoded (k positions, not T).
    fn gather(&self, family: Family, indices: &Array) -> Result<Array> {
        let shape = indices.shape();
        let (batch, queries, k) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let flat = ops::reshape(indices, &[batch, queries * k, 1])?;
        let parts =
            self.parts(family).iter().map(|part| math::take_along_axis(part, &flat, 1)).collect::<Result<Vec<Array>>>()?;
        let width = self.geometry.width(family).expect("present");
        let mut values = ops::astype(&self.geometry.storage(family).decode(&parts, width)?, Dtype::Float32)?;
        if let Some((hot, bases, starts)) = self.hot_values(family) {
            // Selected hot positions are read from each row's hot row (the index is clamped into
            // it where the position is compact: that value is not used).
            let capacity = hot.shape()[1];
            let minus_base: Vec<i32> = bases.iter().map(|&b| -(b as i32)).collect();
            let shifted = math::add(&flat, &ops::indices(&minus_base, &[batch, 1, 1]))?;
            let in_span = math::logical_and(
                &math::greater_equal(&shifted, &ops::indices(&[0], &[1]))?,
                &math::less(&shifted, &ops::indices(&[capacity], &[1]))?,
            )?;
            let at = math::select(&in_span, &shifted, &ops::indices(&[0], &[1]))?;
            let hot = ops::astype(&math::take_along_axis(hot, &at, 1)?, Dtype::Float32)?;
            let row_starts: Vec<i32> = starts.iter().map(|&s| s as i32).collect();
            let is_hot = math::logical_and(&in_span, &math::greater_equal(&flat, &ops::indices(&row_starts, &[batch, 1, 1]))?)?;
            values = math::select(&is_hot, &hot, &values)?;
        }
        ops::reshape(&values, &[batch, queries, k, width])
    }

    /// DSA index scores, `[B, Lq, T]` float32: `sum over index heads h of weights[b, q, h] *
    /// ReLU(q_index[b, h, q] . k[b, t])` against the stored index keys, with positions the query
    /// does not see (padding, past the row's end, and with `Causal` the later positions) at -inf.
    /// `q_index` is `[B, Hi, Lq, index_head_dim]`, `weights` `[B, Lq, Hi]` (scaled as the model
    /// scales them).
    pub fn index_scores(&self, q_index: &Array, weights: &Array, mode: MaskMode) -> Result<Array> {
        let Some(width) = self.geometry.width(Family::IndexKeys) else {
            return fail!(InvalidArgument, "this layer has no DSA index keys");
        };
        let (heads, queries) = self.check_query("q_index", q_index, width)?;
        if weights.shape() != [self.batch_size() as i32, queries, heads] {
            return fail!(Shape, "weights must be [{}, {queries}, {heads}], got {:?}", self.batch_size(), weights.shape());
        }
        if mode == MaskMode::Array {
            return fail!(InvalidArgument, "index scores take the NONE or CAUSAL mask mode");
        }
        self.check_rows(mode, queries as usize)?;
        let (b, h, lq, t) = (self.batch_size(), heads as usize, queries as usize, self.offset);
        if let Some(scores) = self.kernel_index_scores(q_index, weights, mode, (h, lq, width))? {
            return Ok(scores);
        }
        let keys = ops::astype(&self.decoded(Family::IndexKeys)?, Dtype::Float32)?;
        // Every head and query folded into the rows of one product per row, [B, Hi*Lq, 128] x
        // [B, 128, T]: a head axis broadcast against the keys made MLX's CUDA matmul expand the
        // keys per head at batch > 1 (60x slower at batch 8, 128K positions).
        let q = ops::reshape(&ops::astype(q_index, Dtype::Float32)?, &[b, h * lq, width])?;
        let per_head = ops::maximum(&math::matmul(&q, &math::swapaxes(&keys, -1, -2)?)?, &ops::scalar(0.0))?;
        let weights = ops::astype(weights, Dtype::Float32)?;
        let scores = if lq == 1 {
            // One query: the weighted sum over heads is one more product, [B, 1, Hi] x [B, Hi, T].
            math::matmul(&weights, &per_head)?
        } else {
            // [B, Lq, Hi] -> [B, Hi, Lq, 1] against [B, Hi, Lq, T], summed over heads.
            let weights = math::expand_dims(&math::swapaxes(&weights, 1, 2)?, 3)?;
            let per_head = ops::reshape(&per_head, &[b, h, lq, t])?;
            math::sum(&ops::multiply(&per_head, &weights)?, 1)?
        };
        match self.masks(mode, lq) {
            true => math::add(&scores, &self.query_mask(mode, lq)?),
            false => Ok(scores),
        }
    }

    /// `index_scores` by the library's kernel on CUDA (`dsa_kernel`), from the stored keys as
    /// they are: 16-bit float storage without composed hot values. `None` where it does not apply.
    fn kernel_index_scores(
        &self,
        q_index: &Array,
        weights: &Array,
        mode: MaskMode,
        (heads, queries, width): (usize, usize, usize),
    ) -> Result<Option<Array>> {
        let keys = &self.parts(Family::IndexKeys)[0];
        let float = matches!(self.geometry.storage(Family::IndexKeys), StorageMode::Bf16 | StorageMode::F16);
        let (batch, positions) = (self.batch_size(), self.offset);
        if !float
            || self.hot_values(Family::IndexKeys).is_some()
            || !cuda::dsa_scores::applies(keys.dtype(), batch, heads, queries, width, positions)
        {
            return Ok(None);
        }
        Ok(Some(cuda::dsa_scores::index_scores(q_index, weights, keys, &self.row_ranges(), mode == MaskMode::Causal)?))
    }

    /// The `k` positions with the highest scores per query (`scores` `[B, Lq, T]` from
    /// `index_scores`), `[B, Lq, k]` int32 window positions in no particular order; `None` when
    /// the window holds no more than `k` positions (attend densely, as DeepSeek's indexer does).
    pub fn select(&self, scores: &Array, k: usize) -> Result<Option<Array>> {
        if k == 0 {
            return fail!(InvalidArgument, "top-k needs k of at least 1");
        }
        let shape = scores.shape();
        if shape.len() != 3 || shape[0] as usize != self.batch_size() || shape[2] as usize != self.offset {
            return fail!(Shape, "scores must be [{}, queries, {}], got {shape:?}", self.batch_size(), self.offset);
        }
        if self.offset <= k {
            return Ok(None);
        }
        // The last k of a partition at T - k are the k largest (no negated copy of the scores).
        let t = self.offset;
        let order = math::argpartition(scores, (t - k) as i32, -1)?;
        let top = ops::slice(&order, &[0, 0, t - k], &[shape[0] as usize, shape[1] as usize, t])?;
        Ok(Some(ops::astype(&top, Dtype::Int32)?))
    }

    /// Attention over the selected positions alone (`indices` `[B, Lq, k]` from `select`): the
    /// formula of `attend` with `T` replaced by each query's `k` positions; selected positions
    /// the query does not see (a row shorter than `k`) are masked out. `[B, H, Lq,
    /// kv_lora_rank]` float32, lazily; reads `k` positions per query, not the whole window.
    pub fn attend_selected(
        &self,
        q_latent: &Array,
        q_rope: &Array,
        scale: f32,
        mode: MaskMode,
        indices: &Array,
    ) -> Result<Array> {
        let dims = self.check_query("q_latent", q_latent, self.geometry.kv_lora_rank)?;
        if self.check_query("q_rope", q_rope, self.geometry.rope_head_dim)? != dims {
            return fail!(Shape, "q_rope's heads and queries {:?} differ from q_latent's", q_rope.shape());
        }
        let shape = indices.shape();
        if shape.len() != 3 || shape[0] as usize != self.batch_size() || shape[1] != dims.1 || indices.dtype() != Dtype::Int32 {
            return fail!(
                Shape,
                "indices must be int32 [{}, {}, k], got {:?} {:?}",
                self.batch_size(),
                dims.1,
                shape,
                indices.dtype()
            );
        }
        if mode == MaskMode::Array {
            return fail!(InvalidArgument, "selected attention takes the NONE or CAUSAL mask mode");
        }
        self.check_rows(mode, dims.1 as usize)?;
        if let Some(out) = self.kernel_selected(q_latent, q_rope, scale, indices)? {
            return Ok(out);
        }
        // [B, H, Lq, w] -> [B, Lq, H, w], against [B, Lq, k, w]^T: [B, Lq, H, k].
        let per_query = |q: &Array, family: Family| -> Result<Array> {
            let q = math::swapaxes(&ops::astype(q, Dtype::Float32)?, 1, 2)?;
            math::matmul(&q, &math::swapaxes(&self.gather(family, indices)?, -1, -2)?)
        };
        let scores = math::add(&per_query(q_latent, Family::Latent)?, &per_query(q_rope, Family::Rope)?)?;
        let scores = ops::multiply(&scores, &ops::scalar(scale))?;
        // Visibility of the selected positions: the row mask gathered at them, [B, Lq, 1, k].
        let scores = match self.masks(mode, dims.1 as usize) {
            true => {
                let mask = self.query_mask(mode, dims.1 as usize)?;
                let visible = math::expand_dims(&math::take_along_axis(&mask, indices, 2)?, 2)?;
                math::add(&scores, &visible)?
            }
            false => scores,
        };
        let probs = math::softmax(&scores, -1)?;
        let out = math::matmul(&probs, &self.gather(Family::Latent, indices)?)?;
        math::swapaxes(&out, 1, 2)
    }

    /// `attend_selected` for a decode step (one query per row) whose rows each span the whole
    /// window, so that every position the indices can name is visible (no mask is needed):
    /// each stored part's selected positions gathered (`k` a row, as stored), then the split-K
    /// kernel over them as over a window of `k` positions (on CUDA over 16-bit or packed latents,
    /// on Apple GPUs over float storage). That replaces about fifteen MLX operations over float32
    /// copies with four gathers and the kernel's two. `None` where it does not apply (composed
    /// storage, verify queries, padded or shorter rows: MLX's ops, which mask the selected
    /// positions a row lacks).
    fn kernel_selected(&self, q_latent: &Array, q_rope: &Array, scale: f32, indices: &Array) -> Result<Option<Array>> {
        let shape = indices.shape();
        let (batch, queries, k) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
        let query = Query { q_latent, q_rope, scale, mode: MaskMode::None, extra: None, queries };
        if queries != 1
            || self.row_ranges().iter().any(|&range| range != (0, self.offset))
            || self.hot_values(Family::Latent).is_some()
            || !self.kernel_takes(&query)
        {
            return Ok(None);
        }
        let Some((storage, packing)) = self.kernel_storage() else { return Ok(None) };
        let kernel = KernelInputs { storage, packing, q: &query };
        let metal = packing.is_none() && metal::mla_decode::applies(storage, q_latent.dtype(), &kernel.shape(self, k), false);
        if !metal && !kernel.applies(self, k) {
            return Ok(None);
        }
        let flat = ops::reshape(indices, &[batch, k, 1])?;
        let gather = |family: Family| -> Result<Vec<Array>> {
            self.parts(family).iter().map(|part| math::take_along_axis(part, &flat, 1)).collect()
        };
        let (latent, rope) = (gather(Family::Latent)?, gather(Family::Rope)?);
        let whole = vec![(0, k); batch];
        if metal {
            return metal::mla_decode::attend(q_latent, q_rope, &latent[0], &rope[0], &whole, scale, false).map(Some);
        }
        let Some(latent) = kernel.latent(&latent, k, self) else { return Ok(None) };
        cuda::mla_decode::attend(q_latent, q_rope, latent, &rope[0], &whole, scale, false).map(Some)
    }

    /// The latent's stored dtype (or packing) where the split-K kernels may read it: latent and
    /// rope in one 16-bit float or float32 dtype, or a Q8, Q4 or FP8 latent with bfloat16 rope.
    fn kernel_storage(&self) -> Option<(Dtype, Option<Packing>)> {
        StorageMode::kernel_reads(self.geometry.latent_storage, self.geometry.rope_storage)
    }

    /// Whether the split-K kernels take `q` at all: no mask array, queries of one dtype, and a
    /// rope that is not composed (its hot and compact positions would need joining per row).
    fn kernel_takes(&self, q: &Query) -> bool {
        q.extra.is_none()
            && q.mode != MaskMode::Array
            && self.hot_values(Family::Rope).is_none()
            && q.q_rope.dtype() == q.q_latent.dtype()
    }

    /// `row_mask` without the head axis: `[B, 1 or Lq, T]`.
    fn query_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let mask = self.row_mask(mode, queries)?;
        let rows = mask.shape()[2] as usize;
        ops::reshape(&mask, &[self.batch_size(), rows, self.offset])
    }

    /// Refuses rows where a query would see no position.
    fn check_rows(&self, mode: MaskMode, queries: usize) -> Result<()> {
        let lengths: Vec<usize> = self.left_pad.iter().zip(&self.row_ends).map(|(p, e)| e - p).collect();
        let shortest = lengths.iter().copied().min().unwrap_or(0);
        if self.batch_size() == 0 || shortest == 0 || (mode == MaskMode::Causal && shortest < queries) {
            return fail!(
                State,
                "every row must hold a position each query sees (rows: {lengths:?}, {queries} queries, {mode:?})"
            );
        }
        Ok(())
    }

    /// A single row's attention through MLX's fused attention, as mlx-lm's absorbed decode path
    /// runs it: the rope scores (with the row's mask) become the additive mask of one fused
    /// product over the latent as both keys and values. Taken for one row with the latent stored
    /// in the queries' float dtype; `None` elsewhere (MLX's fused kernel is slow for several rows
    /// sharing one key head, where the folded products above are faster).
    fn fused_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, extra, queries } = *q;
        let latent = self.values(Family::Latent)?;
        let float = self.geometry.latent_storage.is_float();
        if self.batch_size() != 1 || !float || latent.dtype() != q_latent.dtype() {
            return Ok(None);
        }
        // As mlx-lm: the rope query is scaled (a [H, Lq, 64] pass) rather than the scores, and
        // the scores are the mask as they come: no pass over [H, T] besides the product, unless
        // the row has padding, the queries a causal band, or the engine a mask of its own.
        let scaled = ops::multiply(q_rope, &ops::astype(&ops::scalar(scale), q_rope.dtype())?)?;
        let mut mask = self.scores(Family::Rope, &scaled)?;
        if self.masks(mode, queries) {
            mask = math::add(&mask, &self.row_mask(mode, queries)?)?;
        }
        if let Some(extra) = extra {
            mask = math::add(&mask, extra)?;
        }
        if mask.dtype() != q_latent.dtype() {
            mask = ops::astype(&mask, q_latent.dtype())?;
        }
        let out = math::sdpa(q_latent, &latent, &latent, scale, &mask)?;
        Ok(Some(ops::astype(&out, Dtype::Float32)?))
    }

    /// Attention on CUDA without a mask array over 16-bit float storage, or a Q8, Q4 or FP8
    /// latent with bfloat16 rope: the split-K kernel of `decode_kernel`, which reads each stored
    /// position once for 64 head-query pairs (packed ones as stored, decoded tile by tile).
    /// Composed storage takes `kernel_composed`. `None` where it does not apply.
    fn kernel_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, .. } = *q;
        // (Float32 storage is the Metal kernel's only: `applies` refuses it on CUDA.)
        let Some((storage, packing)) = self.kernel_storage() else { return Ok(None) };
        if !self.kernel_takes(q) {
            return Ok(None);
        }
        let kernel = KernelInputs { storage, packing, q };
        let (parts, rope) = (self.parts(Family::Latent), &self.parts(Family::Rope)[0]);
        if let Some(hot) = self.hot_values(Family::Latent) {
            return self.kernel_composed(&kernel, hot);
        }
        let Some(latent) = kernel.latent(parts, self.offset, self) else { return Ok(None) };
        cuda::mla_decode::attend(q_latent, q_rope, latent, rope, &self.row_ranges(), scale, mode == MaskMode::Causal).map(Some)
    }

    /// Attention on an Apple GPU without a mask array over float32, bfloat16 or float16 storage
    /// (latent and rope in the queries' dtype, not composed): the split-K kernel of
    /// `decode_metal`. `None` where it does not apply.
    fn metal_decode(&self, q: &Query) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, .. } = *q;
        let Some((storage, None)) = self.kernel_storage() else { return Ok(None) };
        if !self.kernel_takes(q) || self.hot_values(Family::Latent).is_some() {
            return Ok(None);
        }
        let (latent, rope) = (&self.parts(Family::Latent)[0], &self.parts(Family::Rope)[0]);
        let kernel = KernelInputs { storage, packing: None, q };
        let causal = mode == MaskMode::Causal;
        if !metal::mla_decode::applies(storage, q_latent.dtype(), &kernel.shape(self, self.offset), causal) {
            return Ok(None);
        }
        metal::mla_decode::attend(q_latent, q_rope, latent, rope, &self.row_ranges(), scale, causal).map(Some)
    }

    /// `kernel_decode` over composed storage: each row's compact positions (the packed latent,
    /// the stored rope) in one pass, its hot ones (the hot latent, the rope at the same
    /// positions) in another, one combine over both, so the row's softmax spans them. The rope
    /// is read in place where every row's hot row starts at the same window position (one row,
    /// or rows filled together); else each row's is sliced to its hot row (O(hot window) a row,
    /// never the history). `None` where a pass does not apply, where a row holds compact
    /// positions after its hot ones, or where a causal verify's first query would miss some of
    /// a row's compact positions (the compact pass is unmasked).
    fn kernel_composed(&self, k: &KernelInputs, (hot, bases, starts): (&Array, &[usize], &[usize])) -> Result<Option<Array>> {
        let Query { q_latent, q_rope, scale, mode, queries, .. } = *k.q;
        let (batch, capacity) = (self.batch_size(), hot.shape()[1] as usize);
        let verify = mode == MaskMode::Causal && queries > 1;
        let (mut cold, mut warm) = (Vec::with_capacity(batch), Vec::with_capacity(batch));
        for (b, (lo, hi)) in self.row_ranges().into_iter().enumerate() {
            // Positions from `split` on are read hot, those before it compact.
            let split = starts[b].max(bases[b]).clamp(lo, hi);
            if (split < hi && hi > bases[b] + capacity) || (verify && split > lo && split + queries > hi + 1) {
                return Ok(None);
            }
            cold.push(if split > lo { (lo, split) } else { (0, 0) });
            warm.push(if split < hi { (split - bases[b], hi - bases[b]) } else { (0, 0) });
        }
        let (cold_len, hot_len) = (cold.iter().map(|r| r.1).max().unwrap_or(0), warm.iter().map(|r| r.1).max().unwrap_or(0));
        let rope = &self.parts(Family::Rope)[0];
        let rope_width = rope.shape()[2] as usize;
        let prefix = |a: &Array, len: usize| ops::slice(a, &[0, 0, 0], &[batch, len, a.shape()[2] as usize]);
        let cold_parts = self.parts(Family::Latent).iter().map(|p| prefix(p, cold_len)).collect::<Result<Vec<_>>>()?;
        let cold_rope = prefix(rope, cold_len)?;
        let hot_latent = prefix(hot, hot_len)?;
        let hot_rope = match bases.iter().all(|&base| base == bases[0]) {
            true => ops::slice(rope, &[0, bases[0], 0], &[batch, bases[0] + hot_len, rope_width])?,
            false => self.rope_at(rope, bases, hot_len)?,
        };
        let mut passes = Vec::with_capacity(2);
        if cold_len > 0 {
            let Some(latent) = k.latent(&cold_parts, cold_len, self) else { return Ok(None) };
            passes.push(cuda::mla_decode::Pass { latent, rope: &cold_rope, ranges: cold, causal: false });
        }
        if hot_len > 0 {
            let shape = k.shape(self, hot_len);
            if !cuda::mla_decode::applies(hot.dtype(), q_latent.dtype(), &shape) {
                return Ok(None);
            }
            passes.push(cuda::mla_decode::Pass {
                latent: cuda::mla_decode::Latent::Float(&hot_latent),
                rope: &hot_rope,
                ranges: warm,
                causal: mode == MaskMode::Causal,
            });
        }
        cuda::mla_decode::attend_passes(q_latent, q_rope, &passes, scale).map(Some)
    }

    /// Each row's stored rope from its hot row's first window position on, `len` positions
    /// (zeros past the window), `[B, len, P]`.
    fn rope_at(&self, rope: &Array, bases: &[usize], len: usize) -> Result<Array> {
        let width = rope.shape()[2] as usize;
        let mut rows = Vec::with_capacity(bases.len());
        for (b, &base) in bases.iter().enumerate() {
            let take = len.min(self.offset.saturating_sub(base));
            let mut row = ops::slice(rope, &[b, base.min(self.offset), 0], &[b + 1, base.min(self.offset) + take, width])?;
            if take < len {
                row = math::concatenate(&[&row, &ops::zeros(&[1, len - take, width], rope.dtype())?], 1)?;
            }
            rows.push(row);
        }
        math::concatenate(&rows.iter().collect::<Vec<_>>(), 0)
    }

    /// GLM-5's absorbed MLA attention over the donor's rows (see the module doc), `[B, H, Lq,
    /// kv_lora_rank]` float32, lazily. `mask` is required with `MaskMode::Array` and refused
    /// otherwise. Every row must hold a position each query sees (with `Causal`, at least `Lq`).
    pub fn attend(&self, q_latent: &Array, q_rope: &Array, scale: f32, mode: MaskMode, mask: Option<&Array>) -> Result<Array> {
        let dims = self.check_query("q_latent", q_latent, self.geometry.kv_lora_rank)?;
        if self.check_query("q_rope", q_rope, self.geometry.rope_head_dim)? != dims {
            return fail!(Shape, "q_rope's heads and queries {:?} differ from q_latent's", q_rope.shape());
        }
        let queries = dims.1 as usize;
        self.check_rows(mode, queries)?;
        let extra = match (mode, mask) {
            (MaskMode::Array, Some(mask)) => Some(mask),
            (MaskMode::Array, None) => return fail!(InvalidArgument, "the ARRAY mask mode needs a mask"),
            (_, Some(_)) => return fail!(InvalidArgument, "a mask array is taken only with the ARRAY mask mode"),
            (_, None) => None,
        };
        let query = Query { q_latent, q_rope, scale, mode, extra, queries };
        if let Some(out) = self.metal_decode(&query)? {
            return Ok(out);
        }
        if let Some(out) = self.kernel_decode(&query)? {
            return Ok(out);
        }
        if let Some(out) = self.fused_decode(&query)? {
            return Ok(out);
        }
        let scores = math::add(&self.scores(Family::Latent, q_latent)?, &self.scores(Family::Rope, q_rope)?)?;
        let scores = ops::multiply(&ops::astype(&scores, Dtype::Float32)?, &ops::scalar(scale))?;
        let mut scores = match self.masks(mode, queries) {
            true => math::add(&scores, &self.row_mask(mode, queries)?)?,
            false => scores,
        };
        if let Some(extra) = extra {
            scores = math::add(&scores, extra)?;
        }
        self.weighted_latent(&math::softmax(&scores, -1)?, q_latent.dtype())
    }
}

/// One attention's queries and mask, as `attend` checked them.
#[derive(Clone, Copy)]
struct Query<'a> {
    q_latent: &'a Array,
    q_rope: &'a Array,
    scale: f32,
    mode: MaskMode,
    extra: Option<&'a Array>,
    queries: usize,
}

/// What `kernel_decode` found: the latent's storage dtype (or its packing) and the query.
struct KernelInputs<'a> {
    storage: Dtype,
    packing: Option<Packing>,
    q: &'a Query<'a>,
}

impl KernelInputs<'_> {
    /// The kernel's sizes over `positions` positions of `donor`'s rows.
    fn shape(&self, donor: &Donor, positions: usize) -> cuda::mla_decode::Shape {
        cuda::mla_decode::Shape {
            batch: donor.batch_size(),
            heads: self.q.q_latent.shape()[1] as usize,
            queries: self.q.queries,
            positions,
            rank: donor.geometry.kv_lora_rank,
            rope: donor.geometry.rope_head_dim,
            scale: self.q.scale,
        }
    }

    /// Whether the CUDA kernel reads this latent over `positions` positions of `donor`'s rows.
    fn applies(&self, donor: &Donor, positions: usize) -> bool {
        let (shape, dtype) = (self.shape(donor, positions), self.q.q_latent.dtype());
        match self.packing {
            None => cuda::mla_decode::applies(self.storage, dtype, &shape),
            Some(packing) => cuda::mla_decode::applies_packed(packing, dtype, &shape),
        }
    }

    /// The latent's stored `parts` (`positions` of them) as the kernel reads them, where it
    /// applies.
    fn latent<'p>(&self, parts: &'p [Array], positions: usize, donor: &Donor) -> Option<cuda::mla_decode::Latent<'p>> {
        self.applies(donor, positions).then(|| match self.packing {
            None => cuda::mla_decode::Latent::Float(&parts[0]),
            Some(packing) => cuda::mla_decode::Latent::Packed { parts, packing },
        })
    }
}
