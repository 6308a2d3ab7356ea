//! Donor rows and the attention over them: an immutable snapshot of a cache's stored parts and
//! row layout (MLX arrays are immutable, so taking it copies nothing), usable after the cache
//! moves on or is freed, and GLM-5's absorbed MLA attention computed from it lazily:
//! `softmax(scale * (q_latent . latent^T + q_rope . rope^T) + mask) . latent`, every row's
//! padding and positions past its end masked out. Affine-quantized families are read by MLX's
//! quantized matmul from their packed codes, never expanded.
use mlx_rs::{Array, Dtype};

use super::cache::LatentCache;
use super::codec::{StorageMode, AFFINE_GROUP};
use super::error::{fail, Result};
use super::families::Families;
use super::geometry::{Family, Geometry};
use super::mlx_math;
use super::mlx_ops;

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
}

impl LatentCache {
    /// A snapshot of every family's stored parts and of the row layout. Holding it keeps the
    /// current buffers referenced: the cache's next append then copies them instead of writing
    /// in place, so release donors before it when you can.
    pub fn capture_donor_rows(&self) -> Result<Donor> {
        let offset = self.offset();
        let families = Families::for_geometry(&self.geometry, |family, _| family);
        let parts = families.try_map(|_, family| self.storage.packed(family, offset))?;
        Ok(Donor {
            geometry: self.geometry,
            offset,
            left_pad: self.left_pad().to_vec(),
            row_ends: self.row_ends().to_vec(),
            parts,
        })
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
        mlx_math::expand_dims(part, 1)
    }

    /// `q . family^T`, `[B, H, Lq, T]`.
    fn scores(&self, family: Family, q: &Array) -> Result<Array> {
        let (mode, parts) = (self.geometry.storage(family), self.parts(family));
        match mode {
            StorageMode::Q8 | StorageMode::Q4 => {
                let [codes, scales, biases] = [&parts[0], &parts[1], &parts[2]].map(Self::per_head);
                mlx_math::quantized_matmul(q, &codes?, &scales?, &biases?, true, AFFINE_GROUP as i32, mode.bits() as i32)
            }
            _ => {
                let values = Self::per_head(&mode.decode(parts, self.geometry.width(family).expect("present"))?)?;
                mlx_math::matmul(q, &mlx_math::swapaxes(&values, -1, -2)?)
            }
        }
    }

    /// `probs . latent`, `[B, H, Lq, kv_lora_rank]`.
    fn weighted_latent(&self, probs: &Array) -> Result<Array> {
        let (mode, parts) = (self.geometry.latent_storage, self.parts(Family::Latent));
        match mode {
            StorageMode::Q8 | StorageMode::Q4 => {
                let [codes, scales, biases] = [&parts[0], &parts[1], &parts[2]].map(Self::per_head);
                let out = mlx_math::quantized_matmul(
                    probs,
                    &codes?,
                    &scales?,
                    &biases?,
                    false,
                    AFFINE_GROUP as i32,
                    mode.bits() as i32,
                )?;
                mlx_ops::astype(&out, Dtype::Float32)
            }
            _ => mlx_math::matmul(probs, &Self::per_head(&mode.decode(parts, self.geometry.kv_lora_rank)?)?),
        }
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

    /// Additive mask `[B, 1, 1 or Lq, T]`: 0 where a query sees the position, -inf elsewhere.
    fn row_mask(&self, mode: MaskMode, queries: usize) -> Result<Array> {
        let batch = self.batch_size();
        let positions = mlx_ops::reshape(&mlx_math::arange(self.offset)?, &[1, 1, 1, self.offset])?;
        let lo: Vec<i32> = self.left_pad.iter().map(|&p| p as i32).collect();
        let lo = mlx_ops::indices(&lo, &[batch, 1, 1, 1]);
        let hi = match mode {
            MaskMode::Causal => {
                let hi: Vec<i32> =
                    self.row_ends.iter().flat_map(|&end| (0..queries).map(move |i| (end - queries + i + 1) as i32)).collect();
                mlx_ops::indices(&hi, &[batch, 1, queries, 1])
            }
            _ => mlx_ops::indices(&self.row_ends.iter().map(|&e| e as i32).collect::<Vec<_>>(), &[batch, 1, 1, 1]),
        };
        let visible = mlx_math::logical_and(&mlx_math::greater_equal(&positions, &lo)?, &mlx_math::less(&positions, &hi)?)?;
        mlx_math::select(&visible, &mlx_ops::scalar(0.0), &mlx_ops::scalar(f32::NEG_INFINITY))
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
        let shortest = self.left_pad.iter().zip(&self.row_ends).map(|(p, e)| e - p).min().unwrap_or(0);
        if self.batch_size() == 0 || shortest == 0 || (mode == MaskMode::Causal && shortest < queries) {
            return fail!(
                State,
                "every row must hold a position each query sees (rows: {:?}, {queries} queries, {mode:?})",
                self.left_pad.iter().zip(&self.row_ends).map(|(p, e)| e - p).collect::<Vec<_>>()
            );
        }
        let extra = match (mode, mask) {
            (MaskMode::Array, Some(mask)) => Some(mask),
            (MaskMode::Array, None) => return fail!(InvalidArgument, "the ARRAY mask mode needs a mask"),
            (_, Some(_)) => return fail!(InvalidArgument, "a mask array is taken only with the ARRAY mask mode"),
            (_, None) => None,
        };
        let scores = mlx_math::add(&self.scores(Family::Latent, q_latent)?, &self.scores(Family::Rope, q_rope)?)?;
        let scores = mlx_ops::multiply(&mlx_ops::astype(&scores, Dtype::Float32)?, &mlx_ops::scalar(scale))?;
        let mut scores = mlx_math::add(&scores, &self.row_mask(mode, queries)?)?;
        if let Some(extra) = extra {
            scores = mlx_math::add(&scores, extra)?;
        }
        self.weighted_latent(&mlx_math::softmax(&scores, -1)?)
    }
}
