//! Writing storage, always in two steps: `prepare_*` builds the new buffers and may fail
//! (growing, reserving, assembling rows from pieces, moving rows in place), `commit` swaps them
//! in and cannot fail. Only the new positions are encoded; each row's write is one slice update
//! when rows start together, else one scatter.
use mlx_rs::Array;

use super::{Buffer, Frame, Parts, Pending, RowPiece, Storage, MAX_LAZY_WRITES};
use crate::core::error::{CacheError, Result};
use crate::core::layout::slots::Placement;
use crate::core::mlx::eval::{eval, eval_settled};
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::ops;
use crate::core::model::families::Families;

/// Where each row's new positions go: `None` when every row starts at the same position (one
/// slice update per part and run of slots), else the physical positions `[slots, tokens, 1]` of
/// a scatter (ragged rows, in their slots; a free slot takes its positions at `[0, tokens)`,
/// unread), made once per append and shared by every family and part (an array made on the host
/// costs each evaluation that reads it on MLX's CUDA backend).
fn row_positions(starts: &[usize], tokens: usize, slots: usize, placement: &Placement) -> Option<Array> {
    if starts.iter().all(|&s| s == starts[0]) {
        return None;
    }
    let mut start_of = vec![0; slots];
    for (b, &s) in starts.iter().enumerate() {
        start_of[placement.slot(b)] = s;
    }
    let at: Vec<i32> = start_of.iter().flat_map(|&s| (s..s + tokens).map(|p| p as i32)).collect();
    Some(ops::indices(&at, &[slots, tokens, 1]))
}

/// `dest` with `update` (parts of the same family, `[rows, tokens, part_width]`) written so
/// that row `b` (slot `placement.slot(b)`) has its positions start at physical position
/// `starts[b]`, lazily: one slice update per part and run when every row starts at the same
/// position, one scatter per part at `positions` otherwise (over every slot: free slots take
/// zeros, so the update is first widened to them).
fn write_rows(
    dest: &[Array],
    update: &[Array],
    starts: &[usize],
    placement: &Placement,
    positions: Option<&Array>,
) -> Result<Parts> {
    let Some(at) = positions else {
        let mut data = dest.to_vec();
        for run in placement.runs() {
            data = write(&data, &rows_of(update, run.row, run.rows)?, run.slot, starts[0])?;
        }
        return Ok(data);
    };
    dest.iter()
        .zip(update)
        .map(|(d, u)| {
            let slots = d.shape()[0] as usize;
            let whole = placement.runs().len() == 1 && placement.rows() == slots;
            let u = match whole {
                true => u.clone(),
                false => {
                    let shape = u.shape();
                    let mut wide = ops::zeros(&[slots, shape[1] as usize, shape[2] as usize], u.dtype())?;
                    for run in placement.runs() {
                        wide = write(&[wide], &rows_of(std::slice::from_ref(u), run.row, run.rows)?, run.slot, 0)?.remove(0);
                    }
                    wide
                }
            };
            ops::put_along_axis(d, at, &u, 1)
        })
        .collect()
}

/// Rows `[row, row + rows)` of `update`'s parts (the parts themselves when that is all of them).
fn rows_of(update: &[Array], row: usize, rows: usize) -> Result<Parts> {
    update
        .iter()
        .map(|u| {
            let shape = u.shape();
            match row == 0 && rows == shape[0] as usize {
                true => Ok(u.clone()),
                false => ops::slice(u, &[row, 0, 0], &[row + rows, shape[1] as usize, shape[2] as usize]),
            }
        })
        .collect()
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
    /// `fresh` with the first `offset` positions of `frame`'s rows copied in at position 0, row
    /// `b` in slot `b` (lazily).
    fn copy_live(&self, mut fresh: Parts, frame: Frame, offset: usize) -> Result<Parts> {
        if let (Some(data), true) = (&self.data, offset > 0) {
            for run in frame.run_windows(data, &self.parts, 0, offset)? {
                fresh = write(&fresh, &run.parts, run.row, 0)?;
            }
        }
        Ok(fresh)
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
        let frame = self.frame;
        if frame.room() >= end && self.buffers.latent.data.is_some() {
            let starts: Vec<usize> = starts.iter().map(|&s| frame.start + s).collect();
            let placement = match rows == frame.rows() {
                true => frame.placement,
                false => Placement::contiguous(frame.placement.runs().first().map_or(0, |r| r.slot), rows),
            };
            let positions = row_positions(&starts, tokens, frame.slots, &placement);
            let data = self.buffers.as_ref().zip(encoded).try_map(|_, (buffer, update)| {
                let data = buffer.data.as_ref().expect("written buffers have data");
                buffer.wait_for_readers(data)?;
                let mut lazy = buffer.chained_writes();
                if lazy >= MAX_LAZY_WRITES {
                    eval(data)?;
                    lazy = 0;
                }
                Ok::<_, CacheError>((write_rows(data, &update, &starts, &placement, positions.as_ref())?, lazy + 1))
            })?;
            return Ok(Pending { frame: Frame { placement, ..frame }, data });
        }
        let capacity = self.grown_capacity(end, max_tokens, reserved);
        let grown = Frame::fresh(rows, frame.slots, capacity);
        let what = format!("growing to {capacity} positions x {} rows", grown.slots);
        let fresh = self.allocate(grown.slots, capacity, &what)?;
        let positions = row_positions(starts, tokens, grown.slots, &grown.placement);
        let data = self.buffers.as_ref().zip(fresh).zip(encoded).try_map(|_, ((buffer, fresh), update)| {
            let base = buffer.copy_live(fresh, frame, offset)?;
            Ok::<_, CacheError>((
                write_rows(&base, &update, starts, &grown.placement, positions.as_ref())?,
                buffer.chained_writes() + 1,
            ))
        })?;
        Ok(Pending { frame: grown, data })
    }

    /// Makes room for `capacity` positions per row and `slots` rows, keeping the first `offset`
    /// positions of every row: allocated and copied during the call. `None` when the buffers are
    /// already large enough or hold no rows.
    pub fn prepare_reserve(&self, capacity: usize, slots: usize, offset: usize) -> Result<Option<Pending>> {
        let frame = self.frame;
        if (capacity <= frame.room() && slots <= frame.slots) || frame.rows() == 0 {
            return Ok(None);
        }
        let grown = Frame::fresh(frame.rows(), slots.max(frame.slots), capacity.max(frame.room()));
        let what = format!("reserving {} positions x {} rows", grown.capacity, grown.slots);
        let fresh = self.allocate(grown.slots, grown.capacity, &what)?;
        let data = self
            .buffers
            .as_ref()
            .zip(fresh)
            .try_map(|_, (buffer, fresh)| Ok::<_, CacheError>((buffer.copy_live(fresh, frame, offset)?, 0)))?;
        let mut pending = Pending { frame: grown, data };
        pending.eval()?;
        Ok(Some(pending))
    }

    /// New storage of `rows` rows (in `slots` slots) and `capacity` positions assembled from row
    /// pieces (batch row operations and uneven rollbacks), evaluated during the call.
    pub fn prepare_assemble(&self, rows: usize, slots: usize, capacity: usize, pieces: &[RowPiece<'_>]) -> Result<Pending> {
        let frame = Frame::fresh(rows, slots, capacity.max(1));
        let what = format!("rebuilding {} rows of {} positions", frame.slots, frame.capacity);
        let fresh = self.allocate(frame.slots, frame.capacity, &what)?;
        let data = self.buffers.as_ref().zip(fresh).try_map(|family, (buffer, mut data)| {
            for piece in pieces.iter().filter(|p| p.hi > p.lo) {
                let source = piece.source.buffer(family).data.as_ref().expect("a piece with positions has data");
                let part = piece.source.frame.window(source, &buffer.parts, (piece.row, piece.row + 1), piece.lo, piece.hi)?;
                data = write(&data, &part, piece.dest_row, piece.dest_lo)?;
            }
            Ok::<_, CacheError>((data, 0))
        })?;
        let mut pending = Pending { frame, data };
        pending.eval()?;
        Ok(pending)
    }

    /// Writes row pieces into this storage's buffers, in place, as the rows of a frame whose rows
    /// lie in `placement` and whose position 0 lies at `start` (pieces' `dest_row` and
    /// `dest_lo` count from them): rows moving within this storage (rollbacks, filters, a batch
    /// gathered into one run) or joining from other caches. Each piece's positions are first
    /// copied out (the copies are allocated and evaluated during the call, so a failure changes
    /// nothing), then written at their new place lazily. Once committed, nothing but the writes
    /// holds the old buffers, so MLX writes in place: the cost is the pieces' positions, not the
    /// buffers'. The caller checks that every piece fits the slots and capacity.
    pub fn prepare_move(&self, pieces: &[RowPiece<'_>], placement: Placement, start: usize) -> Result<Pending> {
        let pieces: Vec<RowPiece<'_>> = pieces.iter().filter(|p| p.hi > p.lo).copied().collect();
        let positions: usize = pieces.iter().map(|p| p.hi - p.lo).sum();
        let per_position: usize = self.buffers.iter().map(Buffer::bytes_per_position).sum();
        check_alloc(positions.checked_mul(per_position), &format!("moving {positions} positions"))?;
        let copies = self.buffers.as_ref().try_map(|family, buffer| {
            pieces
                .iter()
                .map(|p| {
                    let data = p.source.buffer(family).data.as_ref().expect("rows with positions have data");
                    p.source.frame.window(data, &buffer.parts, (p.row, p.row + 1), p.lo, p.hi)?.iter().map(ops::copy).collect()
                })
                .collect::<Result<Vec<Parts>>>()
        })?;
        // Settled: the copy-out's kernels must have let go of the buffers before the writes are
        // evaluated, or MLX copies each buffer whole rather than write into it.
        eval_settled(copies.iter().flatten().flatten())?;
        let data = self.buffers.as_ref().zip(copies).try_map(|_, (buffer, copies)| {
            let mut data = buffer.data.clone().expect("rows with positions have data");
            if buffer.chained_writes() + pieces.len() > MAX_LAZY_WRITES {
                eval(&data)?;
            }
            for (piece, copy) in pieces.iter().zip(&copies) {
                data = write(&data, copy, placement.slot(piece.dest_row), start + piece.dest_lo)?;
            }
            Ok::<_, CacheError>((data, buffer.chained_writes() + pieces.len()))
        })?;
        Ok(Pending { frame: Frame { placement, start, ..self.frame }, data })
    }

    pub fn commit(&mut self, pending: Pending) {
        self.frame = pending.frame;
        self.buffers.as_mut().zip(pending.data).map(|_, (buffer, (data, lazy))| {
            buffer.data = Some(data);
            buffer.lazy_writes = lazy;
        });
    }
}
