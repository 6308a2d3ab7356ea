//! Donor rows and the attention over them. A `Donor` is an immutable snapshot of a cache's
//! stored parts and row layout (MLX arrays are immutable, so taking it copies nothing), usable
//! after the cache moves on or is freed; GLM-5's absorbed MLA attention is computed from it
//! lazily: `softmax(scale * (q_latent . latent^T + q_rope . rope^T) + mask) . latent`, every
//! row's padding and positions past its end masked out. On layers with index keys, DSA's
//! selection: index scores, the top-k positions per query, and attention over those alone.
//!
//! Files: this one holds `Donor`, `MaskMode`, capturing a donor from a cache and the snapshot's
//! accessors; `values` reads the stored families (decoded, quantized matmul, hot overlay);
//! `masks` which positions a query sees; `dense` attention through MLX's operations; `sparse`
//! DSA's index scores, selection and selected attention; `on_kernels` choosing and feeding our
//! CUDA and Metal kernels; `shared` all of these over rows that read a shared prefix below their
//! own positions (each part attended where it is, joined by their log-sum-exp); `runs` all of
//! them over rows that lie in several runs of slots (each run attended where it is).
//!
//! May import: `error`, `layout`, `mlx`, `model`, `kernels`, `storage`, `cache`.
mod dense;
mod dsa_kernels;
mod masks;
mod on_kernels;
mod runs;
mod selected_chunk;
mod shared;
mod shared_dsa;
mod sparse;
mod values;

use mlx_rs::{Array, Dtype};

use crate::core::cache::LatentCache;
use crate::core::error::{fail, Result};
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::storage::hot::HotCapture;

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

/// One cache's rows as captured for attention (see the module doc): it outlives the cache and
/// never changes.
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
    /// The shared prefix every row reads below its own positions (`offset`, `left_pad`,
    /// `row_ends` and `parts` above are then the rows' own window), as one single-row donor per
    /// piece (see `shared`).
    shared: Option<Vec<Donor>>,
    /// Where the rows lie in several runs of slots: one donor per run and its first row, each
    /// attended on its own (`runs`); the fields above then describe every row (`parts` the
    /// runs joined, never read by attention).
    runs: Vec<(usize, Donor)>,
}

impl LatentCache {
    /// A snapshot of every family's stored parts and of the row layout. Holding it keeps the
    /// current buffers referenced: the cache's next append then copies them instead of writing
    /// in place, so release donors before it when you can.
    /// With composed storage the snapshot holds the compact parts of every position and the hot
    /// values over them: attention reads the compact positions from their parts (quantized
    /// matmul for the affine modes) and the hot ones from the hot values.
    /// Over a shared prefix, the snapshot holds the prefix's pieces and the rows' own parts; its
    /// window is the rows' as a cache holding copies would lay them out (`shared`).
    pub fn capture_donor_rows(&self) -> Result<Donor> {
        let offset = self.layout.offset();
        let families = Families::for_geometry(&self.geometry, |family, _| family);
        let parts = families.clone().try_map(|_, family| self.storage.stored_parts(family, offset))?;
        let (left_pad, row_ends) = (self.layout.left_pad().to_vec(), self.layout.row_ends().to_vec());
        let hot = self.capture_hot()?;
        let shared = self.shared_prefix().map(|prefix| prefix.pieces().iter().map(|p| Donor::piece(self.geometry, p)).collect());
        let alignment = Default::default();
        let mut donor =
            Donor { geometry: self.geometry, offset, left_pad, row_ends, parts, hot, alignment, shared, runs: Vec::new() };
        donor.runs = donor.run_donors(self, families.try_map(|_, family| self.storage.stored_runs(family, offset))?)?;
        Ok(donor)
    }
}

impl Donor {
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn batch_size(&self) -> usize {
        self.left_pad.len()
    }

    /// The window's width (a shared prefix's positions included).
    pub fn offset(&self) -> usize {
        self.offset + self.shared_positions()
    }

    pub fn left_pad(&self) -> &[usize] {
        &self.left_pad
    }

    /// Where each row's positions end in the window (a shared prefix's counted).
    pub fn row_ends(&self) -> Vec<usize> {
        self.row_ends.iter().map(|&e| e + self.shared_positions()).collect()
    }

    fn parts(&self, family: Family) -> &[Array] {
        self.parts.get(family).expect("attention reads latent and rope, which every layer has")
    }

    /// A composed family's hot rows `[B, capacity, width]`, each row's base and first hot
    /// position; `None` when the family has no hot values.
    fn hot_values(&self, family: Family) -> Option<(&Array, &[usize], &[usize])> {
        let hot = self.hot.as_ref()?;
        let (_, values) = hot.values.iter().find(|(f, _)| *f == family)?;
        Some((values, hot.bases.as_slice(), hot.starts.as_slice()))
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
