//! Shared prefixes on `LatentCache` (see `storage::shared`): storing a row's first positions as
//! a prefix, attaching a prefix below a new request's rows, and forking a row into several
//! continuations of it, all without copying what is shared; and the copy (`materialized`) that
//! the calls which need one contiguous row (saves, joined reads) make.
//!
//! A cache over a prefix of `P` positions keeps only each row's own positions in its buffers;
//! every row reads as `[left_pad | prefix | own positions]`, which is exactly what a cache
//! holding copies would hold: `offset`, `row_offsets` and `row_ends` count the prefix, and
//! `left_pad` is each row's padding before it. Nothing ever writes a shared position: a trim or
//! rollback reaches the rows' own positions only, and anything that would go below them is
//! refused.
use std::sync::Arc;

use mlx_rs::Array;

use super::{Change, LatentCache};
use crate::core::error::{fail, Result};
use crate::core::layout::row_layout::RowLayout;
use crate::core::mlx::eval::eval;
use crate::core::mlx::memory::check_alloc;
use crate::core::mlx::{math, ops};
use crate::core::model::families::Families;
use crate::core::model::geometry::Family;
use crate::core::storage::buffers::Storage;
use crate::core::storage::shared::{Piece, SharedPrefix};

/// A piece's buffer may hold at most this fraction more than the piece before `fork_row` copies
/// the row out instead of keeping the buffer (its spare capacity or other rows).
const SPARE_KEPT: usize = 8;

impl LatentCache {
    /// The prefix below every row, if any.
    pub fn shared_prefix(&self) -> Option<&SharedPrefix> {
        self.base.as_ref()
    }

    /// Positions of the prefix below every row (0 without one).
    pub fn shared_positions(&self) -> usize {
        self.base.as_ref().map_or(0, SharedPrefix::positions)
    }

    /// Refuses what a prefix cannot be shared with: composed storage (its hot side follows each
    /// row's newest positions through the whole row) and an open round, prefill or maintenance.
    fn check_shareable(&self, what: &str) -> Result<()> {
        if self.geometry.composed() {
            return fail!(InvalidArgument, "{what}: composed storage cannot share a prefix (its hot side spans each whole row)");
        }
        if self.in_spec_round() || self.prefill.is_some() || self.maintaining {
            return fail!(State, "{what} needs a cache outside a speculative round, a prefill and prefill maintenance");
        }
        Ok(())
    }

    /// Row `row`'s first `positions` positions as a prefix other caches can attach: the pieces
    /// of this cache's own prefix it covers are shared as they are; positions above them are
    /// copied once into a piece of their own (this cache keeps writing its buffers in place,
    /// which MLX does only while nothing else holds them). Evaluated during the call.
    pub fn share_prefix(&self, row: usize, positions: usize) -> Result<SharedPrefix> {
        self.check_shareable("share_prefix")?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        let held = self.row_offsets()[row];
        if positions == 0 || positions > held {
            return fail!(OutOfRange, "a shared prefix takes 1 to {held} positions of row {row}, not {positions}");
        }
        let shared = self.shared_positions();
        let prefix = if positions <= shared {
            Self::cut(self.base.as_ref().expect("positions <= shared implies a prefix"), positions)?
        } else {
            let lo = self.layout.left_pad()[row];
            self.over_base(self.copied_piece(row, lo, lo + positions - shared)?)
        };
        Ok(prefix.with_chain(self.chain_within(row, positions)))
    }

    /// Row `row`'s chain (its digest and positions) where it lies within its first `positions`.
    fn chain_within(&self, row: usize, positions: usize) -> Option<(u64, usize)> {
        self.row_chain(row).filter(|m| m.positions <= positions).map(|m| (m.digest, m.positions))
    }

    /// This cache's prefix (if any) with `piece` on top.
    fn over_base(&self, piece: Arc<Piece>) -> SharedPrefix {
        match &self.base {
            Some(base) => base.with(piece),
            None => SharedPrefix::new(self.geometry, vec![piece]),
        }
    }

    /// `base`'s first `positions` positions: the pieces they cover whole, shared as they are,
    /// and where they end inside a piece a view of its first positions (no copy; the new piece
    /// holds the same arrays).
    fn cut(base: &SharedPrefix, positions: usize) -> Result<SharedPrefix> {
        let mut pieces = Vec::new();
        let mut left = positions;
        for piece in base.pieces() {
            if left == 0 {
                break;
            }
            if left >= piece.len {
                pieces.push(piece.clone());
                left -= piece.len;
                continue;
            }
            let parts = piece.views(0, left)?;
            // A view evaluates to the same buffer; evaluated now, so no reader ever evaluates it.
            eval(parts.iter().flatten())?;
            // The view keeps the piece's whole buffer alive: it holds what the piece holds.
            pieces.push(Arc::new(Piece { len: left, parts, held_bytes: piece.held_bytes }));
            break;
        }
        Ok(SharedPrefix::new(*base.geometry(), pieces))
    }

    /// Row `row`'s own positions `[lo, hi)` copied into a compact piece, evaluated (checked
    /// against MLX's memory limit first, so a copy that cannot be made changes nothing).
    fn copied_piece(&self, row: usize, lo: usize, hi: usize) -> Result<Arc<Piece>> {
        let bytes = (hi - lo).checked_mul(self.geometry.bytes_per_token());
        check_alloc(bytes, &format!("copying {} positions into a shared prefix", hi - lo))?;
        let parts = self.family_list().try_map(|_, family| {
            self.storage.stored_row_parts(family, row, lo, hi)?.iter().map(ops::copy).collect::<Result<Vec<Array>>>()
        })?;
        eval(parts.iter().flatten())?;
        let held_bytes = (hi - lo) * self.bytes_per_token();
        Ok(Arc::new(Piece { len: hi - lo, parts, held_bytes }))
    }

    fn family_list(&self) -> Families<Family> {
        Families::for_geometry(&self.geometry, |family, _| family)
    }

    /// Makes this empty cache `rows` rows over `prefix`, holding no positions of their own yet:
    /// nothing is copied, and appends go to the rows' own buffers.
    pub fn attach_prefix(&mut self, prefix: &SharedPrefix, rows: usize) -> Result<()> {
        let change = self.prepare_attach(prefix, rows)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_attach(&self, prefix: &SharedPrefix, rows: usize) -> Result<Change> {
        self.check_shareable("attach_prefix")?;
        if prefix.geometry() != &self.geometry {
            return fail!(
                InvalidArgument,
                "the prefix is {} but the cache is {}",
                prefix.geometry().describe(),
                self.geometry.describe()
            );
        }
        if self.batch_size() != 0 || self.base.is_some() {
            return fail!(State, "attach_prefix needs an empty cache (reset it first)");
        }
        self.check_rows_over(prefix.positions(), rows)?;
        let layout = RowLayout::rebuilt(self.layout.kind(), &vec![0; rows]);
        let chains = Some(Self::inherited_chains(prefix.chain(), &layout));
        Ok(Change { rebase: Some(Some(prefix.clone())), chains, ..self.relabel(layout) })
    }

    /// Refuses `rows` rows over a prefix of `positions`: no rows, too many, or no room left
    /// under `max_tokens`.
    fn check_rows_over(&self, positions: usize, rows: usize) -> Result<()> {
        if rows == 0 || rows > i32::MAX as usize {
            return fail!(InvalidArgument, "rows over a shared prefix: 1 to INT32_MAX, not {rows}");
        }
        let max = self.geometry.max_tokens;
        if max != 0 && positions >= max {
            return fail!(Capacity, "a shared prefix of {positions} positions leaves no room under max_tokens ({max})");
        }
        // The rows' bookkeeping is O(rows) on the host, and their first append takes a position
        // of every row: rows this process cannot hold are refused before anything is made.
        check_alloc(rows.checked_mul(self.bytes_per_token()), &format!("{rows} rows over a shared prefix (one position each)"))
    }

    /// Row `row` becomes the prefix of `n` new rows, which replace every row of the cache: n
    /// continuations of one prompt, or the branches of a draft tree. The row's positions are
    /// not copied where its buffer holds little else (one row, spare capacity under an eighth):
    /// the buffer becomes the prefix's; otherwise they are copied once. Either way the `n` rows
    /// then hold nothing of their own, and the prefix is never copied again.
    pub fn fork_row(&mut self, row: usize, n: usize) -> Result<()> {
        let change = self.prepare_fork(row, n)?;
        self.apply(change);
        Ok(())
    }

    pub fn prepare_fork(&self, row: usize, n: usize) -> Result<Change> {
        self.check_shareable("fork_row")?;
        if row >= self.batch_size() {
            return fail!(OutOfRange, "row {row} out of range: the cache holds {} rows", self.batch_size());
        }
        let positions = self.row_offsets()[row];
        if positions == 0 {
            return fail!(OutOfRange, "row {row} holds no positions to share");
        }
        self.check_rows_over(positions, n)?;
        let (lo, hi) = (self.layout.left_pad()[row], self.layout.row_ends()[row]);
        let own = hi - lo;
        let prefix = if own == 0 {
            self.base.clone().expect("a row of no own positions holds the prefix's")
        } else {
            // The buffers become the piece only where they hold little else (no spare slot, little room).
            let alone = self.batch_size() == 1 && self.storage.slots() == 1;
            let kept = alone && lo == 0 && self.storage.capacity() - own <= own / SPARE_KEPT;
            self.over_base(match kept {
                true => self.viewed_piece(hi)?,
                false => self.copied_piece(row, lo, hi)?,
            })
        };
        let layout = RowLayout::rebuilt(self.layout.kind(), &vec![0; n]);
        // Every continuation holds the parent row's chain (up to where it is known).
        let chains = Some(Self::inherited_chains(self.chain_within(row, positions), &layout));
        Ok(Change { rebase: Some(Some(prefix)), reserved: 0, chains, ..self.relabel(layout) })
    }

    /// The one row's positions `[0, hi)` as views of the buffers, which the piece then holds
    /// (evaluated, so no pending write is left on them).
    fn viewed_piece(&self, hi: usize) -> Result<Arc<Piece>> {
        let parts = self.family_list().try_map(|_, family| self.storage.stored_row_parts(family, 0, 0, hi))?;
        eval(parts.iter().flatten())?;
        Ok(Arc::new(Piece { len: hi, parts, held_bytes: self.storage.held_bytes() }))
    }

    /// Refuses a trim or rollback that would reach the prefix (`n` positions off each row, rows
    /// holding `own` of their own at the least).
    pub(crate) fn check_above_prefix(&self, n: usize) -> Result<()> {
        let own = self.layout.shortest_row();
        match self.base.is_some() && n > own {
            true => fail!(
                OutOfRange,
                "cannot drop {n} positions: the shortest row holds {own} above its shared prefix of {}, and shared positions are never changed",
                self.shared_positions()
            ),
            false => Ok(()),
        }
    }

    /// `max_tokens` for the rows' own positions (0: unbounded).
    pub(crate) fn own_max_tokens(&self) -> usize {
        match self.geometry.max_tokens {
            0 => 0,
            max => max - self.shared_positions(),
        }
    }

    /// Every row's positions in rows of one contiguous window, as a cache holding copies lays
    /// them out: `[rows, left_pad + P + own, part_width]` per part (O(history): a copy).
    pub(crate) fn joined_parts(&self, family: Family) -> Result<Vec<Array>> {
        let base = self.base.as_ref().expect("callers join over a prefix");
        let own = self.storage.stored_parts(family, self.layout.offset())?;
        let prefix: Vec<Vec<&Array>> =
            base.pieces().iter().map(|p| p.parts.get(family).expect("present").iter().collect()).collect();
        let specs = Storage::part_specs(&self.geometry, family);
        let mut out = Vec::with_capacity(specs.len());
        for (k, spec) in specs.iter().enumerate() {
            let mut rows = Vec::with_capacity(self.batch_size());
            for b in 0..self.batch_size() {
                let pad = self.layout.left_pad()[b];
                let mut pieces: Vec<Array> = Vec::new();
                if pad > 0 {
                    pieces.push(ops::zeros(&[1, pad, spec.width], spec.dtype)?);
                }
                pieces.extend(prefix.iter().map(|p| p[k].clone()));
                if self.layout.offset() > pad {
                    pieces.push(ops::slice(&own[k], &[b, pad, 0], &[b + 1, self.layout.offset(), spec.width])?);
                }
                rows.push(math::concatenate(&pieces.iter().collect::<Vec<_>>(), 1)?);
            }
            out.push(match rows.len() {
                0 => ops::zeros(&[0, 0, spec.width], spec.dtype)?,
                _ => math::concatenate(&rows.iter().collect::<Vec<_>>(), 0)?,
            });
        }
        Ok(out)
    }

    /// This cache as a cache holding copies of its prefix (O(history)): what a save writes.
    /// Without a prefix, `None` (use the cache itself).
    pub fn materialized(&self) -> Result<Option<LatentCache>> {
        if self.base.is_none() {
            return Ok(None);
        }
        let parts = self.family_list().try_map(|_, family| self.joined_parts(family))?;
        eval(parts.iter().flatten())?;
        let positions = self.offset();
        let storage = Storage::from_parts(&self.geometry, self.batch_size(), positions, parts);
        let ends: Vec<usize> = self.row_ends().to_vec();
        let layout = RowLayout::from_rows(self.layout.kind(), self.left_pad(), &ends, positions)?;
        Ok(Some(LatentCache::adopt(self.geometry, layout, storage)))
    }
}

/// Runs `f` over `layers`, each one over a shared prefix replaced by its copy (`materialized`):
/// what a save writes is the rows as they read.
pub fn with_copies<T>(layers: &[&LatentCache], f: impl FnOnce(&[&LatentCache]) -> Result<T>) -> Result<T> {
    if layers.iter().all(|l| l.base.is_none()) {
        return f(layers);
    }
    let copies = layers.iter().map(|l| l.materialized()).collect::<Result<Vec<_>>>()?;
    let refs: Vec<&LatentCache> = layers.iter().zip(&copies).map(|(l, c)| c.as_ref().unwrap_or(l)).collect();
    f(&refs)
}
