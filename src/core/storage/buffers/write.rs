//! Writing storage, always in two steps: `prepare_*` builds the new buffers and may fail
//! (growing, reserving, assembling rows from pieces, moving rows in place), `commit` swaps them
//! in and cannot fail. Only the new positions are encoded; each row's write is one slice update
//! when rows start together, else one scatter.
use mlx_rs::Array;

use super::{window, Buffer, Parts, Pending, RowPiece, Storage, MAX_LAZY_WRITES};
use crate::core::error::{CacheError, Result};
use crate::core::mlx::eval::eval;
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops;
use crate::core::model::families::Families;

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
}

impl Storage {
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
        let encoded = self.buffers.as_ref().zip(updates).try_map(|_, (buffer, update)| match buffer.parts.is_empty() {
            true => Ok(Vec::new()),
            false => buffer.mode.encode(update, buffer.width),
        })?;
        self.prepare_append_encoded(encoded, rows, offset, starts, tokens, limits)
    }

    /// `prepare_append` of positions already encoded: each family's parts as stored
    /// (`[rows, tokens, part_width]`, the parts' dtypes; a segment's positions), written as
    /// they are.
    pub fn prepare_append_encoded(
        &self,
        encoded: Families<Parts>,
        rows: usize,
        offset: usize,
        starts: &[usize],
        tokens: usize,
        limits: (usize, usize),
    ) -> Result<Pending> {
        let (max_tokens, reserved) = limits;
        let end = offset + tokens;
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

    pub fn commit(&mut self, pending: Pending) {
        self.rows = pending.rows;
        self.capacity = pending.capacity;
        self.buffers.as_mut().zip(pending.data).map(|_, (buffer, (data, lazy))| {
            buffer.data = Some(data);
            buffer.lazy_writes = lazy;
        });
    }
}
