//! The stored state: per family, one capacity buffer `[rows, capacity, part_width]` per part of
//! its storage mode (one for the float modes; codes, scales and biases for the quantized ones,
//! see `codec`), written by in-place slice updates and read through views `[:, :offset]`. Rows
//! and capacity are shared by every family and live here once. Growth is geometric (or to a
//! reservation), so an append costs O(new positions) amortized, never O(history); only the new
//! positions are encoded.
//!
//! Every mutation is split in two: `prepare_*` builds the new state and may fail; `commit`
//! swaps it in and cannot fail. Whatever allocates (growth, reserve, row rebuilds) is checked
//! against MLX's memory limit first and allocated during the call, so a failed allocation is
//! reported by the call that asked for it, with nothing changed. Only the append's own write is
//! left lazy, for the engine's once-per-step evaluation.
use mlx_rs::Array;

use crate::core::error::{fail, CacheError, Result};
use crate::core::mlx::eval::{eval, is_evaluated};
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::model::storage_mode::{Part, StorageMode};

/// Smallest capacity a buffer grows to: small appends should not reallocate every few tokens.
pub(crate) const MIN_CAPACITY: usize = 256;

/// Most writes left unevaluated in a row on one buffer before an append evaluates it itself.
/// Writes are lazy; an engine that never evaluates a family (say, a DSA layer whose index keys
/// it never reads) would otherwise grow an unbounded graph. Counted across every operation.
const MAX_LAZY_WRITES: usize = 64;

/// One family's parts, each `[rows, capacity, part_width]`.
type Parts = Vec<Array>;

/// One family's buffers.
#[derive(Clone, Debug)]
struct Buffer {
    mode: StorageMode,
    width: usize,
    parts: Vec<Part>,
    /// `None` until the first write.
    data: Option<Parts>,
    /// Writes chained on `data` since it was last seen evaluated.
    lazy_writes: usize,
}

/// Positions `[lo, hi)` of rows `[row_lo, row_hi)` of every part: views, no copy.
fn window(data: &[Array], parts: &[Part], rows: (usize, usize), lo: usize, hi: usize) -> Result<Parts> {
    data.iter().zip(parts).map(|(d, p)| ops::slice(d, &[rows.0, lo, 0], &[rows.1, hi, p.width])).collect()
}

/// Where each row's new positions go: `None` when every row starts at the same position (one
/// slice update per part), else the positions `[rows, tokens, 1]` of a scatter (ragged rows),
/// made once per append and shared by every family and part (an array made on the host costs
/// each evaluation that reads it on MLX's CUDA backend).
fn row_positions(starts: &[usize], tokens: usize) -> Option<Array> {
    if starts.iter().all(|&s| s == starts[0]) {
        return None;
    }
    let at: Vec<i32> = starts.iter().flat_map(|&s| (s..s + tokens).map(|p| p as i32)).collect();
    Some(ops::indices(&at, &[starts.len(), tokens, 1]))
}

/// `dest` with `update` (parts of the same family, `[rows, tokens, part_width]`) written so
/// that row `b`'s positions start at `starts[b]`, lazily: one slice update per part when every
/// row starts at the same position, one scatter per part at `positions` otherwise.
fn write_rows(dest: &[Array], update: &[Array], starts: &[usize], positions: Option<&Array>) -> Result<Parts> {
    match positions {
        None => write(dest, update, 0, starts[0]),
        Some(at) => dest.iter().zip(update).map(|(d, u)| ops::put_along_axis(d, at, u, 1)).collect(),
    }
}

/// `dest` with `update` (parts of the same family) written at rows `[row, ..)`, positions
/// `[at, ..)`, lazily.
fn write(dest: &[Array], update: &[Array], row: usize, at: usize) -> Result<Parts> {
    dest.iter()
        .zip(update)
        .map(|(d, u)| {
            let shape = u.shape();
            let (rows, tokens, width) = (shape[0] as usize, shape[1] as usize, shape[2] as usize);
            ops::slice_update(d, u, &[row, at, 0], &[row + rows, at + tokens, width])
        })
        .collect()
}

impl Buffer {
    /// `fresh` with this buffer's first `offset` positions of `rows` rows copied in (lazily).
    fn copy_live(&self, fresh: Parts, rows: usize, offset: usize) -> Result<Parts> {
        match &self.data {
            Some(data) if offset > 0 => write(&fresh, &window(data, &self.parts, (0, rows), 0, offset)?, 0, 0),
            _ => Ok(fresh),
        }
    }

    /// The writes chained on this buffer now (0 once MLX has evaluated it).
    fn chained_writes(&self) -> usize {
        match &self.data {
            Some(data) if !data.iter().all(is_evaluated) => self.lazy_writes,
            _ => 0,
        }
    }

    /// Bytes one position of one row holds (none for a family the storage leaves out).
    fn bytes_per_position(&self) -> usize {
        match self.parts.is_empty() {
            true => 0,
            false => self.mode.bytes_per_position(self.width),
        }
    }

    /// Decoded values of stored parts (`read_dtype()` of the mode).
    fn decode(&self, parts: &[Array]) -> Result<Array> {
        if parts.is_empty() {
            return fail!(Backend, "a family this storage leaves out was read");
        }
        self.mode.decode(parts, self.width)
    }
}

/// Cloning shares the buffers (MLX arrays are reference counted): a clone held while the
/// original is written makes MLX copy instead of writing in place.
#[derive(Clone, Debug)]
pub struct Storage {
    rows: usize,
    capacity: usize,
    buffers: Families<Buffer>,
}

/// A prepared new state of every family: `(parts, lazy writes)` each.
pub struct Pending {
    rows: usize,
    capacity: usize,
    data: Families<(Parts, usize)>,
}

impl Pending {
    /// Positions per row of the prepared buffers.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Evaluates the prepared state (the caller then commits it, or drops it on failure).
    pub fn eval(&mut self) -> Result<()> {
        eval(self.data.iter().flat_map(|(data, _)| data))?;
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
        Self::holding(geometry, |_| true)
    }

    /// Storage of the families `kept` says, of `geometry`'s; the others are held as no parts:
    /// every write and copy of them is empty, and they must not be read (composed storage's
    /// hot side keeps only the composed families).
    pub fn holding(geometry: &Geometry, kept: impl Fn(Family) -> bool) -> Self {
        let buffers = Families::for_geometry(geometry, |family, width| {
            let mode = geometry.storage(family);
            let parts = if kept(family) { mode.parts(width) } else { Vec::new() };
            Buffer { mode, width, parts, data: None, lazy_writes: 0 }
        });
        Storage { rows: 0, capacity: 0, buffers }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Storage holding `parts` (`[rows, positions, part_width]` per family, as `codec` lays
    /// them out) as its buffers: what a load adopts. The caller checked every shape and dtype.
    pub fn from_parts(geometry: &Geometry, rows: usize, positions: usize, parts: Families<Vec<Array>>) -> Self {
        Storage::new(geometry).adopt(rows, positions, parts)
    }

    /// This (empty) storage holding `parts` as its buffers (none for a family it leaves out).
    pub fn adopt(mut self, rows: usize, positions: usize, parts: Families<Vec<Array>>) -> Self {
        self.rows = rows;
        self.capacity = positions;
        self.buffers.as_mut().zip(parts).map(|_, (buffer, parts)| buffer.data = Some(parts));
        self
    }

    /// The parts one family is stored as (widths and dtypes).
    pub fn part_specs(geometry: &Geometry, family: Family) -> Vec<Part> {
        geometry.storage(family).parts(geometry.width(family).expect("callers ask for present families"))
    }

    /// Bytes the buffers hold (rows x capacity x bytes per position), 0 before the first write.
    pub fn held_bytes(&self) -> usize {
        match self.buffers.latent.data {
            Some(_) => self.rows * self.capacity * self.buffers.iter().map(Buffer::bytes_per_position).sum::<usize>(),
            None => 0,
        }
    }

    /// Checks that `rows x capacity` positions of every family fit in MLX's memory now.
    fn check_alloc(&self, rows: usize, capacity: usize, what: &str) -> Result<()> {
        let per_position: usize = self.buffers.iter().map(Buffer::bytes_per_position).sum();
        check_alloc(rows.checked_mul(capacity).and_then(|n| n.checked_mul(per_position)), what)
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
    fn allocate(&self, rows: usize, capacity: usize, what: &str) -> Result<Families<Parts>> {
        self.check_alloc(rows, capacity, what)?;
        let fresh = self
            .buffers
            .as_ref()
            .try_map(|_, b| b.parts.iter().map(|p| ops::zeros(&[rows, capacity, p.width], p.dtype)).collect::<Result<Parts>>())?;
        eval(fresh.iter().flatten())?;
        Ok(fresh)
    }

    /// Writes `updates` (`[rows, tokens, width]` each, any float dtype) at row `b`'s positions
    /// `[starts[b], starts[b] + tokens)`, encoded in each family's mode, growing first when the
    /// buffers are too small (the new buffers are allocated during the call; the copy of the
    /// `offset` live positions, the encoding and the write stay lazy). `offset` is the current
    /// stored width; no row may end past `offset + tokens`.
    pub fn prepare_append(
        &self,
        updates: Families<&Array>,
        rows: usize,
        offset: usize,
        starts: &[usize],
        tokens: usize,
        limits: (usize, usize),
    ) -> Result<Pending> {
        let (max_tokens, reserved) = limits;
        let end = offset + tokens;
        let encoded = self.buffers.as_ref().zip(updates).try_map(|_, (buffer, update)| match buffer.parts.is_empty() {
            true => Ok(Vec::new()),
            false => buffer.mode.encode(update, buffer.width),
        })?;
        let positions = row_positions(starts, tokens);
        if self.capacity >= end && self.buffers.latent.data.is_some() {
            let data = self.buffers.as_ref().zip(encoded).try_map(|_, (buffer, update)| {
                let data = buffer.data.as_ref().expect("written buffers have data");
                let mut lazy = buffer.chained_writes();
                if lazy >= MAX_LAZY_WRITES {
                    eval(data)?;
                    lazy = 0;
                }
                Ok::<_, CacheError>((write_rows(data, &update, starts, positions.as_ref())?, lazy + 1))
            })?;
            return Ok(Pending { rows, capacity: self.capacity, data });
        }
        let capacity = self.grown_capacity(end, max_tokens, reserved);
        let fresh = self.allocate(rows, capacity, &format!("growing to {capacity} positions x {rows} rows"))?;
        let data = self.buffers.as_ref().zip(fresh).zip(encoded).try_map(|_, ((buffer, fresh), update)| {
            let base = buffer.copy_live(fresh, rows, offset)?;
            Ok::<_, CacheError>((write_rows(&base, &update, starts, positions.as_ref())?, buffer.chained_writes() + 1))
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
            for piece in pieces.iter().filter(|p| p.hi > p.lo) {
                let source = piece.source.buffer(family).data.as_ref().expect("a piece with positions has data");
                let part = window(source, &buffer.parts, (piece.row, piece.row + 1), piece.lo, piece.hi)?;
                data = write(&data, &part, piece.dest_row, piece.dest_lo)?;
            }
            Ok::<_, CacheError>((data, 0))
        })?;
        let mut pending = Pending { rows, capacity, data };
        pending.eval()?;
        Ok(pending)
    }

    /// Moves row pieces within this storage, in place: each piece's positions are first copied
    /// out (the copies are allocated and evaluated during the call, so a failure changes
    /// nothing), then written at their new place lazily. Once committed, nothing but the writes
    /// holds the old buffers, so MLX writes in place: the cost is the pieces' positions, not the
    /// buffers'. Every piece's source is this storage.
    pub fn prepare_move(&self, pieces: &[RowPiece<'_>]) -> Result<Pending> {
        let positions: usize = pieces.iter().map(|p| p.hi - p.lo).sum();
        let per_position: usize = self.buffers.iter().map(Buffer::bytes_per_position).sum();
        check_alloc(positions.checked_mul(per_position), &format!("moving {positions} positions"))?;
        let copies = self.buffers.as_ref().try_map(|_, buffer| {
            let data = buffer.data.as_ref().expect("rows with positions have data");
            pieces
                .iter()
                .map(|p| window(data, &buffer.parts, (p.row, p.row + 1), p.lo, p.hi)?.iter().map(ops::copy).collect())
                .collect::<Result<Vec<Parts>>>()
        })?;
        eval(copies.iter().flatten().flatten())?;
        let data = self.buffers.as_ref().zip(copies).try_map(|_, (buffer, copies)| {
            let mut data = buffer.data.clone().expect("rows with positions have data");
            if buffer.chained_writes() + pieces.len() > MAX_LAZY_WRITES {
                eval(&data)?;
            }
            for (piece, copy) in pieces.iter().zip(&copies) {
                data = write(&data, copy, piece.dest_row, piece.dest_lo)?;
            }
            Ok::<_, CacheError>((data, buffer.chained_writes() + pieces.len()))
        })?;
        Ok(Pending { rows: self.rows, capacity: self.capacity, data })
    }

    /// Values `[rows, offset, width]` of a prepared state, before it is committed: views for
    /// the float modes, lazy decodes for the quantized ones.
    pub fn pending_views(&self, pending: &Pending, offset: usize) -> Result<Families<Array>> {
        self.buffers
            .as_ref()
            .zip(pending.data.as_ref())
            .try_map(|_, (buffer, (data, _))| buffer.decode(&window(data, &buffer.parts, (0, pending.rows), 0, offset)?))
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

    /// Views of one family's stored parts `[rows, offset, part_width]` (before the first
    /// write: empty `[0, 0, part_width]` arrays).
    pub fn packed(&self, family: Family, offset: usize) -> Result<Parts> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) => window(data, &buffer.parts, (0, self.rows), 0, offset),
            None => buffer.parts.iter().map(|p| ops::zeros(&[0, 0, p.width], p.dtype)).collect(),
        }
    }

    /// One family's stored values `[rows, offset, width]`: a view for the float modes, a lazy
    /// decode (O(stored) when evaluated) for the quantized ones.
    pub fn view(&self, family: Family, offset: usize) -> Result<Array> {
        self.buffer(family).decode(&self.packed(family, offset)?)
    }

    /// Views of every family's stored window.
    pub fn views(&self, offset: usize) -> Result<Families<Array>> {
        self.buffers.as_ref().try_map(|family, _| self.view(family, offset))
    }

    /// Row `row`'s positions `[lo, hi)` of one family, decoded to float32 on the host.
    pub fn read_row(&self, family: Family, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        let buffer = self.buffer(family);
        match &buffer.data {
            Some(data) if hi > lo => {
                let values = buffer.decode(&window(data, &buffer.parts, (row, row + 1), lo, hi)?)?;
                ops::to_host(&ops::astype(&values, mlx_rs::Dtype::Float32)?)
            }
            _ => Ok(Vec::new()),
        }
    }

    /// Whether nothing has been written since the last clear.
    pub fn is_empty(&self) -> bool {
        self.buffers.latent.data.is_none()
    }

    /// Decoded values of one family at rows `[rows.0, rows.1)`, positions `[lo, hi)`, of a
    /// prepared state (`Some`) or of the committed one: lazy, a view for the float modes.
    pub fn window_in(
        &self,
        pending: Option<&Pending>,
        family: Family,
        rows: (usize, usize),
        lo: usize,
        hi: usize,
    ) -> Result<Array> {
        let buffer = self.buffer(family);
        let data = match pending {
            Some(p) => &p.data.get(family).expect("pending states hold every family").0,
            None => buffer.data.as_ref().expect("callers read written storage"),
        };
        buffer.decode(&window(data, &buffer.parts, rows, lo, hi)?)
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        eval(self.buffers.iter().filter_map(|b| b.data.as_ref()).flatten())
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
