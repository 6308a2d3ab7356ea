//! The stored state: per family, one capacity buffer `[slots, capacity, part_width]` per part of
//! its storage mode (one for the float modes; codes and scales, with biases for the affine
//! ones, for the packed modes, see `codec`), written by in-place slice updates and read through
//! views `[slot:slot + rows, start:start + offset]`, one per run of rows. The frame (where the
//! rows lie, slots, capacity, start) is shared by every family and lives here once. Growth is
//! geometric (or to a reservation), so an append costs O(new positions) amortized, never
//! O(history); only the new positions are encoded.
//!
//! Slots no row holds are rows a batch had or reserved: a row leaving the batch keeps its slot
//! for the next row to join, so neither copies the rows that stay. Where the rows lie is a few
//! runs of consecutive slots (`layout::slots`: rows leaving from anywhere split or shorten a run,
//! a row joining takes a free slot), `start` where position 0 lies in every slot (dropping the
//! padding every row has moves it): both copy nothing.
//!
//! Every mutation is split in two: `prepare_*` builds the new state and may fail; `commit`
//! swaps it in and cannot fail. Whatever allocates (growth, reserve, row rebuilds) is checked
//! against MLX's memory limit first and allocated during the call, so a failed allocation is
//! reported by the call that asked for it, with nothing changed. Only the append's own write is
//! left lazy, for the engine's once-per-step evaluation.
//!
//! This file holds the types, their construction and allocation; `write` the prepared writes
//! and `commit`; `read` the views, decodes and host reads.
mod read;
mod write;

use std::cell::Cell;

use mlx_rs::Array;

use crate::core::error::{fail, Result};
use crate::core::layout::slots::Placement;
use crate::core::mlx::eval::{eval, eval_async, is_evaluated};
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::readers::{wait_for_readers, Holders, SKIP_AFTER_VIEWS};
use crate::core::mlx::{math, ops};
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
    /// Appends left that skip waiting for readers in flight, after views were found holding
    /// the buffer (`mlx::readers`); a hint only, so it changes behind a shared reference.
    skip_waits: Cell<u32>,
}

/// The shape of the buffers and what of them holds rows: the rows lie in `placement`'s runs of
/// slots, of `slots`, each `capacity` positions of which the first `start` precede position 0.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Frame {
    pub placement: Placement,
    pub slots: usize,
    pub capacity: usize,
    pub start: usize,
}

/// One run of rows read as one view: rows `[row, row + rows)`, their parts.
pub(crate) struct RunParts {
    pub row: usize,
    pub rows: usize,
    pub parts: Parts,
}

impl Frame {
    /// A frame of `rows` rows filling fresh buffers of `slots` slots, from slot 0 and position 0.
    fn fresh(rows: usize, slots: usize, capacity: usize) -> Frame {
        Frame { placement: Placement::contiguous(0, rows), slots: slots.max(rows), capacity, start: 0 }
    }

    pub fn rows(&self) -> usize {
        self.placement.rows()
    }

    /// Positions each row may hold from position 0.
    pub fn room(&self) -> usize {
        self.capacity - self.start
    }

    /// Positions `[lo, hi)` (from position 0) of rows `[row_lo, row_hi)` of every part: views
    /// where the rows lie in one run, else the runs' views joined (a copy when evaluated).
    fn window(&self, data: &[Array], parts: &[Part], rows: (usize, usize), lo: usize, hi: usize) -> Result<Parts> {
        if let Some(slot) = self.placement.run_of(rows).or((rows.0 == rows.1).then_some(0)) {
            return self.slots_window(data, parts, (slot, slot + rows.1 - rows.0), lo, hi);
        }
        let runs = self.run_windows(data, parts, lo, hi)?;
        let within: Vec<Parts> = runs
            .iter()
            .filter(|r| r.row < rows.1 && r.row + r.rows > rows.0)
            .map(|r| {
                let (a, b) = (rows.0.max(r.row) - r.row, rows.1.min(r.row + r.rows) - r.row);
                r.parts.iter().zip(parts).map(|(d, p)| ops::slice(d, &[a, 0, 0], &[b, hi - lo, p.width])).collect()
            })
            .collect::<Result<_>>()?;
        (0..parts.len()).map(|k| math::concatenate(&within.iter().map(|w| &w[k]).collect::<Vec<_>>(), 0)).collect()
    }

    /// Positions `[lo, hi)` of every run of rows, one view each.
    fn run_windows(&self, data: &[Array], parts: &[Part], lo: usize, hi: usize) -> Result<Vec<RunParts>> {
        let runs = self.placement.runs().iter();
        runs.map(|r| {
            Ok(RunParts { row: r.row, rows: r.rows, parts: self.slots_window(data, parts, (r.slot, r.slot + r.rows), lo, hi)? })
        })
        .collect()
    }

    /// Positions `[lo, hi)` of slots `[slots.0, slots.1)`: views.
    fn slots_window(&self, data: &[Array], parts: &[Part], slots: (usize, usize), lo: usize, hi: usize) -> Result<Parts> {
        let start = self.start;
        let slice = |d: &Array, p: &Part| ops::slice(d, &[slots.0, start + lo, 0], &[slots.1, start + hi, p.width]);
        data.iter().zip(parts).map(|(d, p)| slice(d, p)).collect()
    }
}

impl Buffer {
    /// The writes chained on this buffer now (0 once MLX has evaluated it).
    fn chained_writes(&self) -> usize {
        match &self.data {
            Some(data) if !data.iter().all(is_evaluated) => self.lazy_writes,
            _ => 0,
        }
    }

    /// Waits until MLX's work in flight has let go of `data` (this buffer's parts), so that a
    /// write into it is done in place (`mlx::readers`); views someone keeps are remembered for
    /// a while, so the next appends do not wait for them again.
    fn wait_for_readers(&self, data: &[Array]) -> Result<()> {
        let skip = self.skip_waits.get();
        match wait_for_readers(data, skip > 0)? {
            Holders::Alone => self.skip_waits.set(0),
            Holders::Views => self.skip_waits.set(if skip > 0 { skip - 1 } else { SKIP_AFTER_VIEWS }),
        }
        Ok(())
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
    frame: Frame,
    buffers: Families<Buffer>,
}

/// A prepared new state of every family: `(parts, lazy writes)` each.
pub struct Pending {
    frame: Frame,
    data: Families<(Parts, usize)>,
}

impl Pending {
    /// Positions per row of the prepared buffers (from position 0).
    pub fn capacity(&self) -> usize {
        self.frame.room()
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
#[derive(Clone, Copy)]
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
            Buffer { mode, width, parts, data: None, lazy_writes: 0, skip_waits: Cell::new(0) }
        });
        Storage { frame: Frame::default(), buffers }
    }

    /// Positions each row may hold before the buffers grow.
    pub fn capacity(&self) -> usize {
        self.frame.room()
    }

    /// Rows the buffers have room for before a joining row makes them grow.
    pub fn slots(&self) -> usize {
        self.frame.slots
    }

    /// The frame: rows, slots, capacity and where position 0 lies.
    pub(crate) fn frame(&self) -> Frame {
        self.frame
    }

    /// Storage holding `parts` (`[rows, positions, part_width]` per family, as `codec` lays
    /// them out) as its buffers: what a load adopts. The caller checked every shape and dtype.
    pub fn from_parts(geometry: &Geometry, rows: usize, positions: usize, parts: Families<Vec<Array>>) -> Self {
        Storage::new(geometry).adopt(rows, positions, parts)
    }

    /// This (empty) storage holding `parts` as its buffers (none for a family it leaves out).
    pub fn adopt(mut self, rows: usize, positions: usize, parts: Families<Vec<Array>>) -> Self {
        self.frame = Frame::fresh(rows, rows, positions);
        self.buffers.as_mut().zip(parts).map(|_, (buffer, parts)| buffer.data = Some(parts));
        self
    }

    /// The parts one family is stored as (widths and dtypes).
    pub fn part_specs(geometry: &Geometry, family: Family) -> Vec<Part> {
        geometry.storage(family).parts(geometry.width(family).expect("callers ask for present families"))
    }

    /// Bytes the buffers hold (slots x capacity x bytes per position), 0 before the first write.
    pub fn held_bytes(&self) -> usize {
        let Frame { slots, capacity, .. } = self.frame;
        match self.buffers.latent.data {
            Some(_) => slots * capacity * self.buffers.iter().map(Buffer::bytes_per_position).sum::<usize>(),
            None => 0,
        }
    }

    /// Checks that `rows x capacity` positions of every family fit in MLX's memory now.
    fn check_alloc(&self, rows: usize, capacity: usize, what: &str) -> Result<()> {
        let per_position: usize = self.buffers.iter().map(Buffer::bytes_per_position).sum();
        check_alloc(rows.checked_mul(capacity).and_then(|n| n.checked_mul(per_position)), what)
    }

    /// Checks that `rows` rows of `capacity` positions would fit now (a reservation of rows).
    pub fn check_rows(&self, rows: usize, capacity: usize) -> Result<()> {
        self.check_alloc(rows, capacity, &format!("reserving {rows} rows of {capacity} positions"))
    }

    /// Before the first write: the slots the first allocation takes (at least its rows). Written
    /// buffers keep their slots (a prepared change sizes them).
    pub fn set_slots(&mut self, slots: usize) {
        if self.buffers.latent.data.is_none() {
            self.frame.slots = slots;
        }
    }

    /// Checks that one row of `capacity` positions would fit now (a reservation before the
    /// batch size is known).
    pub fn check_row(&self, capacity: usize) -> Result<()> {
        self.check_alloc(1, capacity, &format!("reserving {capacity} positions"))
    }

    /// The capacity to grow to when `needed` positions must fit: at least double the current
    /// capacity and at least the engine's reservation, never beyond `max_tokens` (0 = unbounded).
    fn grown_capacity(&self, needed: usize, max_tokens: usize, reserved: usize) -> usize {
        let mut capacity = needed.max(self.frame.room().saturating_mul(2)).max(MIN_CAPACITY).max(reserved);
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

    fn buffer(&self, family: Family) -> &Buffer {
        self.buffers.get(family).expect("callers check the family exists on this layer")
    }

    /// Whether nothing has been written since the last clear.
    pub fn is_empty(&self) -> bool {
        self.buffers.latent.data.is_none()
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        eval(self.buffers.iter().filter_map(|b| b.data.as_ref()).flatten())
    }

    /// Hands every buffer's pending writes to MLX and returns (`eval_async`).
    pub fn eval_async(&self) -> Result<()> {
        eval_async(self.buffers.iter().filter_map(|b| b.data.as_ref()).flatten())
    }

    /// Releases every buffer.
    pub fn clear(&mut self) {
        self.frame = Frame::default();
        self.buffers.as_mut().map(|_, buffer| {
            buffer.data = None;
            buffer.lazy_writes = 0;
        });
    }
}
