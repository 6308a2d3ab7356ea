//! The hot side of composed storage, as data and array functions: the float storage of each
//! row's newest positions (`Hot`), a prepared change of it (`HotChange`), a captured copy for
//! attention (`HotCapture`), and the overlay of hot values over compact ones that the cache's
//! state views and the attention's decoded families both use. Nothing here needs `LatentCache`.
use mlx_rs::{Array, Dtype};

use crate::core::error::Result;
use crate::core::mlx::{math, ops};
use crate::core::model::geometry::{Family, Geometry};
use crate::core::storage::buffers::{Pending, Storage};

/// The hot side of a composed cache.
#[derive(Debug)]
pub(crate) struct Hot {
    /// Every family in the hot mode; row `b` holds window positions `[bases[b], bases[b] +
    /// capacity)`.
    pub(crate) storage: Storage,
    /// Per row: the window position of its first hot-storage position, at most its first hot
    /// position (when it has any).
    pub(crate) bases: Vec<usize>,
    /// Per row: how many of its valid positions are read in the compact mode.
    pub(crate) converted: Vec<usize>,
}

/// A prepared change of the hot side (part of a `cache::Change`).
pub(crate) struct HotChange {
    /// A rebuilt hot storage that replaces the current one (then `pending` lands on it).
    pub(crate) replace: Option<Storage>,
    pub(crate) pending: Option<Pending>,
    pub(crate) bases: Vec<usize>,
    pub(crate) converted: Vec<usize>,
}

/// The hot side of a composed cache as captured: each composed family's hot rows `[B,
/// capacity, width]` in the hot mode (row `b` from window position `bases[b]` on), and each
/// row's first hot position.
pub(crate) struct HotCapture {
    pub bases: Vec<usize>,
    pub starts: Vec<usize>,
    pub values: Vec<(Family, Array)>,
}

/// The geometry of the hot storage: every family in the hot mode (it holds the composed ones).
fn hot_geometry(g: &Geometry) -> Geometry {
    let mode = g.hot_storage;
    Geometry { latent_storage: mode, rope_storage: mode, index_storage: mode, max_tokens: 0, hot_window: 0, ..*g }
}

/// An empty hot storage: the composed families only (the others are never read hot, and
/// their values are in the main storage already).
pub(crate) fn hot_storage(g: &Geometry) -> Storage {
    Storage::holding(&hot_geometry(g), |family| g.is_composed(family))
}

impl Hot {
    /// The hot side of a cache of geometry `g`, or `None` when it is not composed.
    pub(crate) fn new(g: &Geometry) -> Option<Hot> {
        g.composed().then(|| Hot { storage: hot_storage(g), bases: Vec::new(), converted: Vec::new() })
    }

    pub(crate) fn apply(&mut self, change: HotChange) {
        if let Some(storage) = change.replace {
            self.storage = storage;
        }
        if let Some(pending) = change.pending {
            self.storage.commit(pending);
        }
        self.bases = change.bases;
        self.converted = change.converted;
    }

    pub(crate) fn clear(&mut self) {
        self.storage.clear();
        self.bases.clear();
        self.converted.clear();
    }

    /// Positions per row the hot storage holds (0 before its first write).
    pub(crate) fn capacity(&self) -> usize {
        if self.storage.is_empty() {
            0
        } else {
            self.storage.capacity()
        }
    }
}

/// The first window position in `[lo, hi)` that some row reads hot (`hi` when none): every
/// row's positions before it are compact, so an overlay need only cover `[hot_from, hi)`, about
/// the hot window for rows of similar lengths rather than the whole history.
pub(crate) fn hot_from(bases: &[usize], starts: &[usize], (lo, hi): (usize, usize)) -> usize {
    bases.iter().zip(starts).map(|(&base, &start)| base.max(start)).min().unwrap_or(hi).clamp(lo, hi)
}

/// `x` with its positions along `axis` from `at` on replaced by `tail` of them (the positions
/// before kept, converted to the tail's dtype): an overlay that gathers and selects over the
/// span it changes only. `x` itself when `at` is past the end.
pub(crate) fn with_tail(x: &Array, axis: usize, at: usize, tail: impl FnOnce(Array) -> Result<Array>) -> Result<Array> {
    let shape: Vec<usize> = x.shape().iter().map(|&d| d as usize).collect();
    if at >= shape[axis] {
        return Ok(x.clone());
    }
    let mut start = vec![0; shape.len()];
    start[axis] = at;
    let tail = tail(ops::slice(x, &start, &shape)?)?;
    if at == 0 {
        return Ok(tail);
    }
    let mut stop = shape;
    stop[axis] = at;
    let head = ops::astype(&ops::slice(x, &vec![0; stop.len()], &stop)?, tail.dtype())?;
    math::concatenate(&[&head, &tail], axis as i32)
}

/// Where each row's hot values sit for window positions `[lo, hi)`: for row `b`, position `p`'s
/// index in its hot row (`p - bases[b]`, clamped into `[0, capacity)`), and whether `p` is read
/// hot (at or after the row's first hot position and inside its hot row). Row-major
/// `[rows, hi - lo]` each.
pub(crate) fn hot_alignment(
    bases: &[usize],
    starts: &[usize],
    capacity: usize,
    (lo, hi): (usize, usize),
) -> (Vec<i32>, Vec<i32>) {
    let mut at = Vec::with_capacity(bases.len() * (hi - lo));
    let mut is_hot = Vec::with_capacity(at.capacity());
    for (&base, &start) in bases.iter().zip(starts) {
        for p in lo..hi {
            let inside = p >= base && p < base + capacity;
            at.push(if inside { (p - base) as i32 } else { 0 });
            is_hot.push((inside && p >= start) as i32);
        }
    }
    (at, is_hot)
}

/// `cold` (`[rows, hi - lo, width]`, window positions `[lo, hi)`) with each row's hot positions
/// read from `values` (`[rows, capacity, width]`, its hot rows), in float32 where the two
/// dtypes differ (see `same_dtype`). Only the span from the first hot position on is aligned
/// and selected (`hot_from`, `with_tail`).
pub(crate) fn overlay_hot(
    cold: &Array,
    values: &Array,
    bases: &[usize],
    starts: &[usize],
    (lo, hi): (usize, usize),
) -> Result<Array> {
    let (rows, capacity) = (bases.len(), values.shape()[1] as usize);
    let from = hot_from(bases, starts, (lo, hi));
    with_tail(cold, 1, from - lo, |tail| {
        let (at, is_hot) = hot_alignment(bases, starts, capacity, (from, hi));
        let shape = [rows, hi - from, 1];
        let aligned = math::take_along_axis(values, &ops::indices(&at, &shape), 1)?;
        let mask = math::greater_equal(&ops::indices(&is_hot, &shape), &ops::indices(&[1], &[1]))?;
        let (tail, aligned) = same_dtype(tail, aligned)?;
        math::select(&mask, &aligned, &tail)
    })
}

/// `a` and `b` in one dtype: float32 where they differ (a hot float32 value over bfloat16
/// storage keeps its precision).
pub(crate) fn same_dtype(a: Array, b: Array) -> Result<(Array, Array)> {
    if a.dtype() == b.dtype() {
        return Ok((a, b));
    }
    Ok((ops::astype(&a, Dtype::Float32)?, ops::astype(&b, Dtype::Float32)?))
}
