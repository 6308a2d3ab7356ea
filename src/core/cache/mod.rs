//! `LatentCache`: one MLA layer's cache. Ties the geometry, the row layout and the stored
//! families together, and validates every input before changing anything. This file holds the
//! type, its prepared `Change`, and the questions about its size and rows.
//!
//! Files: `append` appends; `read` values, stored parts and host reads; `rows` speculative
//! rounds and batch row operations (rollback, filter, extract, merge); `join` rows joining a
//! batch that holds rows, and room for them; `prefill` padded batched
//! prefills; `maintenance` the seed's prefill maintenance calls; `composed` composed storage's
//! precision boundaries and hot side; `segment` what segment files need (a row's stored
//! positions, appends of stored parts, the chain mark); `shared` shared prefixes (store, attach,
//! fork, and the copy a save makes); `set` a model's caches changed together.
//!
//! May import: `error`, `layout`, `mlx`, `model`, `storage`. Files here import this one
//! (`super::`) and those rooms, never each other.
mod append;
pub mod composed;
mod join;
mod maintenance;
pub mod prefill;
mod read;
pub mod rows;
mod segment;
pub mod set;
pub mod shared;

use mlx_rs::Array;

use crate::core::error::{CacheError, ErrorKind, Result};
use crate::core::layout::prefill::Prefill;
use crate::core::layout::row_layout::RowLayout;
use crate::core::model::families::Families;
use crate::core::model::geometry::{Family, Geometry};
use crate::core::storage::buffers::{Pending, Storage};
use crate::core::storage::hot::{Hot, HotChange};
use crate::core::storage::shared::SharedPrefix;

/// The rejection of any index-key access on a layer without DSA.
fn no_index_keys() -> CacheError {
    CacheError::new(ErrorKind::InvalidArgument, "this layer has no DSA index keys (index_head_dim is 0)")
}

/// A prepared change of one cache: made (and whatever it allocates, allocated) by a `prepare_*`
/// call that changes nothing, applied by `apply`, which cannot fail. A set of caches prepares
/// every layer's change before applying any, so a failure on one layer leaves all as they were.
pub struct Change {
    pub(crate) layout: RowLayout,
    pub(crate) pending: Option<Pending>,
    pub(crate) reserved: usize,
    /// The open prefill after the change (its rows follow filters).
    pub(crate) prefill: Option<Prefill>,
    /// The hot side after the change (composed storage whose rows moved), if it changes.
    pub(crate) hot: Option<HotChange>,
    /// Prefill maintenance open after the change.
    pub(crate) maintaining: bool,
    /// Rows change places (a filter): the chain marks are forgotten whatever the layout says.
    pub(crate) moves_rows: bool,
    /// Each new row's chain mark (a fork or an attach: the parent's, up to the shared point;
    /// `None`: the marks stay as they are, checked by `keep_chain`).
    pub(crate) chains: Option<Vec<Option<ChainMark>>>,
    /// The rows' own buffers are released and the prefix below them becomes this (an attach or
    /// a fork; `None`: leave both as they are).
    pub(crate) rebase: Option<Option<SharedPrefix>>,
    /// Slots to keep for the batch's rows from now on (`reserve_rows`; `None`: as they are).
    pub(crate) slots: Option<usize>,
}

/// One row's valid positions `[lo, hi)` of `source` landing at `[dest_row, dest_lo..)`: what a
/// row rebuild moves, told with the cache it comes from (for its hot side).
pub(crate) struct RowMove<'a> {
    pub source: &'a LatentCache,
    pub row: usize,
    pub lo: usize,
    pub hi: usize,
    pub dest_row: usize,
    pub dest_lo: usize,
}

/// Values of everything stored, as returned by an append and by `state`: latent
/// `[B, T, kv_lora_rank]`, rope `[B, T, rope_head_dim]`, index keys `[B, T, index_head_dim]` on
/// a DSA layer. Views in the stored dtype for the float modes; lazy float32 decodes of the
/// whole window (O(stored) when evaluated) for the packed ones (see `stored_parts`).
pub type LatentState = Families<Array>;

#[derive(Debug)]
pub struct LatentCache {
    pub(crate) geometry: Geometry,
    pub(crate) layout: RowLayout,
    pub(crate) storage: Storage,
    /// Positions per row the engine asked to have room for (see `reserve`).
    pub(crate) reserved: usize,
    /// A padded batched prefill between `prefill_prepare` and `prefill_finalize`.
    pub(crate) prefill: Option<Prefill>,
    /// The hot side of composed storage (`None` when the cache is not composed).
    pub(crate) hot: Option<Hot>,
    /// Between `prefill_begin` and `prefill_end` (see `composed`).
    pub(crate) maintaining: bool,
    /// The segment chain each row is known to hold (see `ChainMark`), one per row or none.
    pub(crate) chains: Vec<Option<ChainMark>>,
    /// The prefix every row reads below its own positions (see `shared`).
    pub(crate) base: Option<SharedPrefix>,
}

/// What a cache knows of the segment chain one of its rows holds (`persist::segment`): row
/// `row`, starting after `left_pad` padding, holds exactly the chain's
/// `positions` positions, whose digest is `digest`. Set by a segment save or a chain restore,
/// handed to every new row by a fork or an attach (a tree of chains: each continuation's is its
/// parent's up to the shared point); kept by every change that leaves those positions where
/// they are (appends, trims and rollbacks that stay above them), forgotten by any other
/// (`keep_chain`). Each row has its own.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChainMark {
    pub digest: u64,
    pub positions: usize,
    pub row: usize,
    pub left_pad: usize,
}

impl LatentCache {
    pub fn new(geometry: Geometry) -> Result<Self> {
        geometry.validate()?;
        let layout = RowLayout::new(geometry.layout);
        Ok(LatentCache::adopt(geometry, layout, Storage::new(&geometry)))
    }

    /// A cache over storage and a layout a load checked (`persist`).
    pub(crate) fn adopt(geometry: Geometry, layout: RowLayout, storage: Storage) -> Self {
        let hot = Hot::new(&geometry);
        LatentCache {
            geometry,
            layout,
            storage,
            reserved: 0,
            prefill: None,
            hot,
            maintaining: false,
            chains: Vec::new(),
            base: None,
        }
    }

    /// The segment chain of the first row whose chain this cache knows, if any.
    pub fn chain(&self) -> Option<ChainMark> {
        self.chains.iter().flatten().next().copied()
    }

    /// The segment chain row `row` is known to hold, if any.
    pub fn row_chain(&self, row: usize) -> Option<ChainMark> {
        self.chains.get(row).copied().flatten()
    }

    /// Forgets each row's chain mark unless its first `positions` positions are still where
    /// they were: the same rows, the row's padding unchanged, the row at least that long.
    /// Called after every change; a change that moves rows around says so with `forget`.
    pub(crate) fn keep_chain(&mut self, forget: bool) {
        if forget || self.chains.len() != self.batch_size() {
            self.chains.clear();
            return;
        }
        let (offsets, pads) = (self.row_offsets(), self.left_pad().to_vec());
        for mark in self.chains.iter_mut() {
            let kept = mark.is_some_and(|m| pads[m.row] == m.left_pad && offsets[m.row] >= m.positions);
            if !kept {
                *mark = None;
            }
        }
        if self.chains.iter().all(Option::is_none) {
            self.chains.clear();
        }
    }

    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    pub fn batch_size(&self) -> usize {
        self.layout.batch_size()
    }

    /// The window's width: the longest row's end, a shared prefix's positions included.
    pub fn offset(&self) -> usize {
        self.layout.offset() + self.shared_positions()
    }

    /// Each row's positions, a shared prefix's included.
    pub fn row_offsets(&self) -> Vec<usize> {
        let shared = self.shared_positions();
        self.layout.row_offsets().into_iter().map(|n| n + shared).collect()
    }

    /// Each row's padding before its first position (before its shared prefix, if any).
    pub fn left_pad(&self) -> &[usize] {
        self.layout.left_pad()
    }

    /// Where each row's valid positions end (`offset` for every row when right-justified), a
    /// shared prefix's positions counted.
    pub fn row_ends(&self) -> Vec<usize> {
        let shared = self.shared_positions();
        self.layout.row_ends().iter().map(|&e| e + shared).collect()
    }

    pub fn bytes_per_token(&self) -> usize {
        self.geometry.bytes_per_token()
    }

    /// Bytes the cache's buffers hold now (every row's capacity, valid or not; with composed
    /// storage, the hot side's too). A shared prefix's bytes are the prefix's, not counted here.
    pub fn bytes_in_use(&self) -> usize {
        self.storage.held_bytes() + self.hot.as_ref().map_or(0, |h| h.storage.held_bytes())
    }

    /// Bytes of valid state: every row's position count times `bytes_per_token` (the seed's
    /// `byteLength`; padding and spare capacity are not counted; a shared prefix's positions are,
    /// once per row, as the rows read them).
    pub fn byte_length(&self) -> usize {
        self.row_offsets().iter().sum::<usize>() * self.bytes_per_token()
    }

    pub fn signature(&self) -> String {
        self.geometry.signature()
    }

    /// Positions the next append may take before `max_tokens`, or, with composed storage
    /// outside a round, before some row's precision boundary moves (whichever comes first). An
    /// append of more still succeeds: a boundary move copies nothing.
    pub fn max_append_tokens(&self) -> usize {
        let limit = self.layout.max_append_tokens(self.own_max_tokens());
        match self.batch_size() {
            0 => limit,
            _ => limit.min(self.appendable_before_conversion()),
        }
    }

    /// Trimming only moves the offset, so the cache is always trimmable.
    pub fn is_trimmable(&self) -> bool {
        true
    }

    pub fn in_spec_round(&self) -> bool {
        self.layout.in_round()
    }

    /// Refuses (`State`) a save of a cache with an operation open: a speculative round (its
    /// rollback needs what the rows held when it began), a padded prefill between
    /// `prefill_prepare` and `prefill_finalize` (its right padding and prompt lengths), or prefill
    /// maintenance. A file holds a cache at rest, so a loaded cache is exactly what was saved
    /// (rows, values, composed boundaries, the limits that follow from them) and its next call
    /// behaves as the saved cache's would.
    pub fn check_saveable(&self) -> Result<()> {
        let open = match (self.in_spec_round(), self.prefill.is_some(), self.maintaining) {
            (true, _, _) => "a speculative round is open (commit or roll it back first)",
            (_, true, _) => "a padded prefill is open (prefill_finalize first)",
            (_, _, true) => "prefill maintenance is open (prefill_end first)",
            _ => return Ok(()),
        };
        Err(CacheError::new(ErrorKind::State, format!("cannot save while {open}")))
    }

    /// The width of a family on this layer, or the index-key rejection.
    fn width(&self, family: Family) -> Result<usize> {
        self.geometry.width(family).ok_or_else(no_index_keys)
    }

    /// Evaluates every buffer (pending writes land in place).
    pub fn eval(&self) -> Result<()> {
        self.storage.eval()?;
        match &self.hot {
            Some(hot) => hot.storage.eval(),
            None => Ok(()),
        }
    }

    /// Hands every buffer's pending writes to MLX and returns; a later `eval` waits for them.
    pub(crate) fn eval_async(&self) -> Result<()> {
        self.storage.eval_async()?;
        match &self.hot {
            Some(hot) => hot.storage.eval_async(),
            None => Ok(()),
        }
    }

    /// Drops the last `n` positions of every row; returns `n`. Moves the offset, copies nothing.
    pub fn trim(&mut self, n: usize, bypass: bool) -> Result<usize> {
        let change = self.prepare_trim(n, bypass)?;
        self.apply(change);
        Ok(n)
    }

    /// Empties the cache (rows, positions, round, prefills, reservation), keeping its geometry.
    pub fn reset(&mut self) {
        self.layout.reset();
        self.reserved = 0;
        self.prefill = None;
        self.maintaining = false;
        self.chains.clear();
        self.base = None;
        self.storage.clear();
        if let Some(hot) = &mut self.hot {
            hot.clear();
        }
    }

    /// Makes room for `tokens` positions per row now, so appends up to that length never
    /// reallocate: allocated during the call on a cache holding rows; on an empty cache (batch
    /// size unknown) checked for one row now and allocated by the first append.
    pub fn reserve(&mut self, tokens: usize) -> Result<()> {
        let change = self.prepare_reserve(tokens)?;
        self.apply(change);
        Ok(())
    }
}
