//! The stored state: one capacity buffer `[rows, capacity, width]` per family, written by
//! in-place slice updates and read through views `[:, :offset]`. Rows and capacity are shared by
//! every family and live here once. Growth is geometric (or to a reservation), so an append
//! costs O(new positions) amortized, never O(history).
//!
//! Every mutation is split in two: `prepare_*` builds the new state and may fail; `commit`
//! swaps it in and cannot fail. Whatever allocates (growth, reserve, row rebuilds) is checked
//! against MLX's memory limit first and allocated during the call, so a failed allocation is
//! reported by the call that asked for it, with nothing changed. Only the append's own write is
//! left lazy, for the engine's once-per-step evaluation.
use mlx_rs::Array;

use super::error::{CacheError, Result};
use super::eval::{eval, is_evaluated};
use super::families::Families;
use super::geometry::{Family, Geometry};
use super::memory::{check_alloc, f32_bytes};
use super::mlx_ops;

/// Smallest capacity a buffer grows to: small appends should not reallocate every few tokens.
pub(crate) const MIN_CAPACITY: usize = 256;

/// Most writes left unevaluated in a row on one buffer before an append evaluates it itself.
/// Writes are lazy; an engine that never evaluates a family (say, a DSA layer whose index keys
/// it never reads) would otherwise grow an unbounded graph. Counted across every operation.
const MAX_LAZY_WRITES: usize = 64;

/// One family's buffer.
#[derive(Debug)]
struct Buffer {
    width: usize,
    /// `None` until the first write.
    data: Option<Array>,
    /// Writes chained on `data` since it was last seen evaluated.
    lazy_writes: usize,
}

/// The first `offset` positions of `rows` rows of a `width`-wide buffer: a view, no copy.
fn window(data: &Array, rows: usize, offset: usize, width: usize) -> Result<Array> {
    mlx_ops::slice(data, &[0, 0, 0], &[rows, offset, width])
}

impl Buffer {
    /// `fresh` with this buffer's first `offset` positions of `rows` rows copied in (lazily).
    fn copy_live(&self, fresh: Array, rows: usize, offset: usize) -> Result<Array> {
        match &self.data {
            Some(data) if offset > 0 => {
                let live = window(data, rows, offset, self.width)?;
                mlx_ops::slice_update(&fresh, &live, &[0, 0, 0], &[rows, offset, self.width])
            }
            _ => Ok(fresh),
        }
    }

    /// The writes chained on this buffer now (0 once MLX has evaluated it).
    fn chained_writes(&self) -> usize {
        match &self.data {
            Some(data) if !is_evaluated(data) => self.lazy_writes,
            _ => 0,
        }
    }
}

#[derive(Debug)]
pub struct Storage {
    rows: usize,
    capacity: usize,
    buffers: Families<Buffer>,
}

/// A prepared new state of every family: `(data, lazy writes)` each.
pub struct Pending {
    rows: usize,
    capacity: usize,
    data: Families<(Array, usize)>,
}

impl Pending {
    /// Evaluates the prepared state (the caller then commits it, or drops it on failure).
    pub fn eval(&mut self) -> Result<()> {
        eval(self.data.iter().map(|(data, _)| data))?;
        self.data.as_mut().map(|_, (_, lazy)| *lazy = 0);
        Ok(())
    }
}

/// One row's valid range copied from some storage into a new one: `source[row, lo..hi]` lands
/// at `[dest_row, dest_lo..dest_lo + (hi - lo)]`, in every family.
pub struct RowPiece<'a> {
    pub source: &'a Storage,
    pub row: usize,
    pub lo: usize,
    pub hi: usize,
    pub dest_row: usize,
    pub dest_lo: usize,
}

impl Storage {
    pub fn new(geometry: &Geometry) -> Self {
        let buffers = Families::for_geometry(geometry, |_, width| Buffer { width, data: None, lazy_writes: 0 });
        Storage { rows: 0, capacity: 0, buffers }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Checks that `rows x capacity` positions of every family fit in MLX's memory now.
    fn check_alloc(&self, rows: usize, capacity: usize, what: &str) -> Result<()> {
        let floats: usize = self.buffers.iter().map(|b| b.width).sum();
        check_alloc(f32_bytes(rows, capacity, floats), what)
    }

    /// Checks that one row of `capacity` positions would fit now (a reservation before the
    /// batch size is known).
    pub fn check_row(&self, capacity: usize) -> Result<()> {
        self.check_alloc(1, capacity, &format!("reserving {capacity} positions"))
    }

    /// The capacity to grow to when `needed` positions must fit: at least double the current
    /// capacity and at least the engine's reservation, never beyond `max_tokens` (0 = unbounded).
    fn grown_capacity(&self, needed: usize, max_tokens: usize, reserved: usize) -> usize {
        let mut capacity = needed.max(self.capacity.saturating_mul(2)).max(MIN_CAPACITY).max(reserved);
        if max_tokens != 0 {
            capacity = capacity.min(max_tokens).max(needed);
        }
        capacity.min(i32::MAX as usize).max(needed)
    }

    /// Fresh zeroed buffers of `rows x capacity` for every family, allocated now (evaluated).
    fn allocate(&self, rows: usize, capacity: usize, what: &str) -> Result<Families<Array>> {
        self.check_alloc(rows, capacity, what)?;
        let fresh = self.buffers.as_ref().try_map(|_, b| mlx_ops::zeros(&[rows, capacity, b.width]))?;
        eval(fresh.iter())?;
        Ok(fresh)
    }

    /// Writes `updates` (`[rows, tokens, width]` each) at positions `[offset, offset + tokens)`,
    /// growing first when the buffers are too small (the new buffers are allocated during the
    /// call; the copy of the `offset` live positions and the write stay lazy).
    pub fn prepare_append(
        &self,
        updates: Families<&Array>,
        rows: usize,
        offset: usize,
        tokens: usize,
        max_tokens: usize,
        reserved: usize,
    ) -> Result<Pending> {
        let end = offset + tokens;
        let window = |width: usize| ([0, offset, 0], [rows, end, width]);
        if self.capacity >= end && self.buffers.latent.data.is_some() {
            let data = self.buffers.as_ref().zip(updates).try_map(|_, (buffer, update)| {
                let data = buffer.data.as_ref().expect("written buffers have data");
                let mut lazy = buffer.chained_writes();
                if lazy >= MAX_LAZY_WRITES {
                    eval([data])?;
                    lazy = 0;
                }
                let (start, stop) = window(buffer.width);
                Ok::<_, CacheError>((mlx_ops::slice_update(data, update, &start, &stop)?, lazy + 1))
            })?;
            return Ok(Pending { rows, capacity: self.capacity, data });
        }
        let capacity = self.grown_capacity(end, max_tokens, reserved);
        let fresh = self.allocate(rows, capacity, &format!("growing to {capacity} positions x {rows} rows"))?;
        let data = self.buffers.as_ref().zip(fresh).zip(updates).try_map(|_, ((buffer, fresh), update)| {
            let base = buffer.copy_live(fresh, rows, offset)?;
            let (start, stop) = window(buffer.width);
            Ok::<_, CacheError>((mlx_ops::slice_update(&base, update, &start, &stop)?, buffer.chained_writes() + 1))
        })?;
        Ok(Pending { rows, capacity, data })
    }

    /// Makes room for `capacity` positions per row, keeping the first `offset`: allocated and
    /// copied during the call. `None` when the buffers are already large enough or hold no rows.
    pub fn prepare_reserve(&self, capacity: usize, offset: usize) -> Result<Option<Pending>> {
        if capacity <= self.capacity || self.rows == 0 {
            return Ok(None);
        }
        let rows = self.rows;
        let fresh = self.allocate(rows, capacity, &format!("reserving {capacity} positions x {rows} rows"))?;
        let data = self
            .buffers
            .as_ref()
            .zip(fresh)
            .try_map(|_, (buffer, fresh)| Ok::<_, CacheError>((buffer.copy_live(fresh, rows, offset)?, 0)))?;
        let mut pending = Pending { rows, capacity, data };
        pending.eval()?;
        Ok(Some(pending))
    }

    /// New storage of `rows` rows and `capacity` positions assembled from row pieces (batch row
    /// operations and uneven rollbacks), evaluated during the call.
    pub fn prepare_assemble(&self, rows: usize, capacity: usize, pieces: &[RowPiece<'_>]) -> Result<Pending> {
        let capacity = capacity.max(1);
        let fresh = self.allocate(rows, capacity, &format!("rebuilding {rows} rows of {capacity} positions"))?;
        let data = self.buffers.as_ref().zip(fresh).try_map(|family, (buffer, mut data)| {
            let width = buffer.width;
            for piece in pieces.iter().filter(|p| p.hi > p.lo) {
                let source = piece.source.buffer(family).data.as_ref().expect("a piece with positions has data");
                let part = mlx_ops::slice(source, &[piece.row, piece.lo, 0], &[piece.row + 1, piece.hi, width])?;
                let dest_hi = piece.dest_lo + (piece.hi - piece.lo);
                data = mlx_ops::slice_update(
                    &data,
                    &part,
                    &[piece.dest_row, piece.dest_lo, 0],
                    &[piece.dest_row + 1, dest_hi, width],
                )?;
            }
            Ok::<_, CacheError>((data, 0))
        })?;
        let mut pending = Pending { rows, capacity, data };
        pending.eval()?;
        Ok(pending)
    }

    /// Views `[rows, offset, width]` of a prepared state, before it is committed.
    pub fn pending_views(&self, pending: &Pending, offset: usize) -> Result<Families<Array>> {
        self.buffers
            .as_ref()
            .zip(pending.data.as_ref())
            .try_map(|_, (buffer, (data, _))| window(data, pending.rows, offset, buffer.width))
    }

    pub fn commit(&mut self, pending: Pending) {
        self.rows = pending.rows;
        self.capacity = pending.capacity;
        self.buffers.as_mut().zip(pending.data).map(|_, (buffer, (data, lazy))| {
            buffer.data = Some(data);
            buffer.lazy_writes = lazy;
        });
    }

    fn buffer(&self, family: Family) -> &Buffer {
        self.buffers.get(family).expect("callers check the family exists on this layer")
    }

    /// A view of one family's stored window `[rows, offset, width]`; an empty `[0, 0, width]`
    /// array before the first write.
    pub fn view(&self, family: Family, offset: usize) -> Result<Array> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) => window(data, self.rows, offset, buffer.width),
            None => mlx_ops::zeros(&[0, 0, buffer.width]),
        }
    }

    /// Views of every family's stored window.
    pub fn views(&self, offset: usize) -> Result<Families<Array>> {
        self.buffers.as_ref().try_map(|family, _| self.view(family, offset))
    }

    /// Row `row`'s positions `[lo, hi)` of one family, copied to the host.
    pub fn read_row(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) if hi > lo => mlx_ops::to_host(&mlx_ops::slice(data, &[row, lo, 0], &[row + 1, hi, buffer.width])?),
            _ => Ok(Vec::new()),
        }
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        eval(self.buffers.iter().filter_map(|b| b.data.as_ref()))
    }

    /// Releases every buffer.
    pub fn clear(&mut self) {
        self.rows = 0;
        self.capacity = 0;
        self.buffers.as_mut().map(|_, buffer| {
            buffer.data = None;
            buffer.lazy_writes = 0;
        });
    }
}
