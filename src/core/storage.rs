//! One state family's storage: a capacity buffer `[batch, capacity, width]` written by in-place
//! slice updates and read through views `[:, :offset]`. Growth is geometric (or to a
//! reservation), so an append costs O(new positions) amortized, never O(history).
//!
//! Every mutation is split in two: `prepare_*` builds the new lazy MLX graph and may fail;
//! `commit` swaps it in and cannot fail. The cache prepares all families before committing any,
//! so a failed call leaves every family untouched.
use mlx_rs::Array;

use super::error::Result;
use super::mlx_ops;

/// Smallest capacity a buffer grows to: small appends should not reallocate every few tokens.
pub(crate) const MIN_CAPACITY: usize = 256;

/// Most writes left unevaluated in a row before an append evaluates the buffer itself. Writes are
/// lazy; an engine that never evaluates a family (say, a DSA layer whose index keys it never
/// reads) would otherwise grow an unbounded graph.
const MAX_LAZY_WRITES: usize = 64;

#[derive(Debug)]
pub struct FamilyBuffer {
    width: usize,
    rows: usize,
    capacity: usize,
    /// `None` until the first write.
    data: Option<Array>,
    /// Writes since `data` was last seen evaluated.
    lazy_writes: usize,
}

/// A prepared new state of a buffer.
pub struct Pending {
    rows: usize,
    capacity: usize,
    data: Array,
    lazy_writes: usize,
}

/// One row's valid range copied from some buffer into a new one: `source[row, lo..hi]` lands at
/// `[dest_row, dest_lo..dest_lo + (hi - lo)]`.
pub struct Piece<'a> {
    pub source: &'a FamilyBuffer,
    pub row: usize,
    pub lo: usize,
    pub hi: usize,
    pub dest_row: usize,
    pub dest_lo: usize,
}

impl FamilyBuffer {
    pub fn new(width: usize) -> Self {
        FamilyBuffer { width, rows: 0, capacity: 0, data: None, lazy_writes: 0 }
    }

    pub fn width(&self) -> usize {
        self.width
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The capacity to grow to when `needed` positions must fit: at least double the current
    /// capacity and at least the engine's reservation, never beyond `max_tokens` (0 = unbounded).
    fn grown_capacity(&self, needed: usize, max_tokens: usize, reserved: usize) -> usize {
        let mut capacity = needed.max(self.capacity.saturating_mul(2)).max(MIN_CAPACITY).max(reserved);
        if max_tokens != 0 {
            capacity = capacity.min(max_tokens).max(needed);
        }
        capacity
    }

    /// Writes `update` (`[rows, tokens, width]`) at positions `[offset, offset + tokens)`, growing
    /// first when the buffer is too small. `offset` positions are live and survive growth.
    pub fn prepare_write(
        &self,
        update: &Array,
        rows: usize,
        offset: usize,
        tokens: usize,
        max_tokens: usize,
        reserved: usize,
    ) -> Result<Pending> {
        let end = offset + tokens;
        let (start, stop) = ([0, offset, 0], [rows, end, self.width]);
        let lazy_writes = match &self.data {
            Some(data) if !mlx_ops::is_evaluated(data) => {
                if self.lazy_writes >= MAX_LAZY_WRITES {
                    mlx_ops::eval([data])?;
                    0
                } else {
                    self.lazy_writes + 1
                }
            }
            _ => 0,
        };
        let (capacity, data) = match &self.data {
            Some(data) if end <= self.capacity => (self.capacity, mlx_ops::slice_update(data, update, &start, &stop)?),
            _ => {
                let capacity = self.grown_capacity(end, max_tokens, reserved);
                let base = self.regrow(rows, capacity, offset)?;
                (capacity, mlx_ops::slice_update(&base, update, &start, &stop)?)
            }
        };
        Ok(Pending { rows, capacity, data, lazy_writes })
    }

    /// Makes room for `capacity` positions per row, keeping the first `offset` (a no-op when the
    /// buffer is already large enough).
    pub fn prepare_reserve(&self, rows: usize, capacity: usize, offset: usize) -> Result<Option<Pending>> {
        if capacity <= self.capacity || rows == 0 {
            return Ok(None);
        }
        let data = self.regrow(rows, capacity, offset)?;
        Ok(Some(Pending { rows, capacity, data, lazy_writes: 0 }))
    }

    /// A fresh buffer of `capacity` positions holding this buffer's first `offset` positions.
    /// This is the one O(history) copy, paid once per geometric growth step.
    fn regrow(&self, rows: usize, capacity: usize, offset: usize) -> Result<Array> {
        let fresh = mlx_ops::zeros(&[rows, capacity, self.width])?;
        match &self.data {
            Some(data) if offset > 0 => {
                let live = mlx_ops::slice(data, &[0, 0, 0], &[rows, offset, self.width])?;
                mlx_ops::slice_update(&fresh, &live, &[0, 0, 0], &[rows, offset, self.width])
            }
            _ => Ok(fresh),
        }
    }

    /// A new buffer of `rows` rows and `capacity` positions assembled from row pieces of other
    /// buffers (batch row operations and uneven rollbacks).
    pub fn prepare_assemble(width: usize, rows: usize, capacity: usize, pieces: &[Piece<'_>]) -> Result<Pending> {
        let mut data = mlx_ops::zeros(&[rows, capacity.max(1), width])?;
        for piece in pieces.iter().filter(|p| p.hi > p.lo) {
            let source = piece.source.data.as_ref().expect("a piece with positions has data");
            let part = mlx_ops::slice(source, &[piece.row, piece.lo, 0], &[piece.row + 1, piece.hi, width])?;
            let dest_hi = piece.dest_lo + (piece.hi - piece.lo);
            data = mlx_ops::slice_update(&data, &part, &[piece.dest_row, piece.dest_lo, 0], &[piece.dest_row + 1, dest_hi, width])?;
        }
        Ok(Pending { rows, capacity: capacity.max(1), data, lazy_writes: 0 })
    }

    pub fn commit(&mut self, pending: Pending) {
        self.rows = pending.rows;
        self.capacity = pending.capacity;
        self.data = Some(pending.data);
        self.lazy_writes = pending.lazy_writes;
    }

    /// A view of the stored window `[rows, offset, width]`; an empty `[0, 0, width]` array
    /// before the first write.
    pub fn view(&self, offset: usize) -> Result<Array> {
        match &self.data {
            Some(data) => mlx_ops::slice(data, &[0, 0, 0], &[self.rows, offset, self.width]),
            None => mlx_ops::zeros(&[0, 0, self.width]),
        }
    }

    /// Row `row`'s positions `[lo, hi)`, copied to the host.
    pub fn read_row(&self, row: usize, lo: usize, hi: usize) -> Result<Vec<f32>> {
        match &self.data {
            Some(data) if hi > lo => mlx_ops::to_host(&mlx_ops::slice(data, &[row, lo, 0], &[row + 1, hi, self.width])?),
            _ => Ok(Vec::new()),
        }
    }

    /// The buffer itself, for evaluating pending writes.
    pub fn data(&self) -> Option<&Array> {
        self.data.as_ref()
    }

    pub fn clear(&mut self) {
        *self = FamilyBuffer::new(self.width);
    }
}
